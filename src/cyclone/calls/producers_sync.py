"""Producer calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.producers`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, Unpack

import psycopg

from cyclone.calls.base import SyncCalls
from cyclone.config import WakeupTracker
from cyclone.dbio import Plan, Stmt, fetch_sync, run_plan_sync
from cyclone.options import check_text
from cyclone.payloads import PLAIN, encode_json
from cyclone.producer import (
    EnqueueOptions,
    KindTarget,
    ManyOptions,
    enqueue_many_plan,
    enqueue_many_stmt,
    enqueue_plan,
    enqueue_stmt,
    enqueued_from_rows,
)
from cyclone.records import Enqueued, RunRef, Submitted, run_id_of
from cyclone.signals import signal_plan
from cyclone.submit import SubmitOptions, submit_plan
from cyclone.workflow import Workflow

__all__ = ["SyncProducerCalls"]

T = TypeVar("T")


class SyncProducerCalls(SyncCalls):
    """Producer calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.producers`."""

    def enqueue(
        self, kind: KindTarget, input: Any = None, **options: Unpack[EnqueueOptions]
    ) -> Enqueued:
        """Enqueue a standalone run of one step, in its own transaction.

        Takes the arguments of ``Client.enqueue`` (options: :class:`EnqueueOptions`).

        Returns:
            An :class:`Enqueued`; ``duplicate=True`` for a live ``unique_key`` holder
            or a run that holds ``submit_key`` (nothing is written, no wakeup sent).

        Raises:
            ValidationError: a bad kind, input or option; nothing is written.
            StateError: the key kept changing hands.
            ConfigurationError: the schema is not installed.
        """
        request = self.config.request(kind, input, **options)
        with self._connection() as conn:
            if request.unique_key is None and request.submit_keys is None:
                return enqueued_from_rows(self._insert(conn, enqueue_stmt(request), request.queue))[
                    0
                ]
            result = _own_transaction(
                conn, enqueue_plan(request), keyed=request.submit_keys is not None
            )
            if not result.duplicate:
                self._publish(conn, (request.queue,), ())
        return result

    def _insert(
        self, conn: psycopg.Connection[Any], stmt: Stmt, queue: str
    ) -> list[tuple[Any, ...]]:
        """Run one insert in its own transaction; its wakeup follows the commit."""
        rows = fetch_sync(conn, stmt)
        self._publish(conn, (queue,), ())  # commits first on a pool in transaction mode
        return rows

    def enqueue_tx(
        self,
        conn: psycopg.Connection[Any],
        kind: KindTarget,
        input: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """Enqueue inside the caller's transaction on ``conn`` (see ``Client.enqueue_tx``).

        Raises:
            ValidationError: a bad value, or ``conn`` is not a ``psycopg.Connection`` that
                can join a transaction (closed, failed, or autocommit outside one).
            StateError: the key kept changing hands.
        """
        request = self.config.request(kind, input, **options)
        self.config.check_tx_conn(conn, psycopg.Connection)
        result = run_plan_sync(conn, enqueue_plan(request))
        if not result.duplicate:
            self.config.track(conn, (request.queue,))
        return result

    def enqueue_many(
        self, kind: KindTarget, inputs: Sequence[Any], **options: Unpack[ManyOptions]
    ) -> list[Enqueued]:
        """Enqueue one run per input in one transaction (see ``Client.enqueue_many``).

        Returns:
            The handles in input order; ``duplicate=True`` for a taken submit key.

        Raises:
            ValidationError: a bad kind, input or option (``unique_key`` included), or
                bad ``submit_keys``; nothing is written.
            StateError: a key kept changing hands.
        """
        request = self.config.request(kind, inputs, many=True, **options)
        if not inputs:
            return []
        with self._connection() as conn:
            if request.submit_keys is None:
                return enqueued_from_rows(
                    self._insert(conn, enqueue_many_stmt(request), request.queue)
                )
            handles = _own_transaction(conn, enqueue_many_plan(request), keyed=True)
            if not all(handle.duplicate for handle in handles):
                self._publish(conn, (request.queue,), ())
        return handles

    def enqueue_many_tx(
        self,
        conn: psycopg.Connection[Any],
        kind: KindTarget,
        inputs: Sequence[Any],
        **options: Unpack[ManyOptions],
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` inside the caller's transaction on ``conn``.

        Raises:
            ValidationError: as :meth:`enqueue_many` and :meth:`enqueue_tx`.
            StateError: a key kept changing hands.
        """
        request = self.config.request(kind, inputs, many=True, **options)
        self.config.check_tx_conn(conn, psycopg.Connection)
        if not inputs:
            return []
        handles = run_plan_sync(conn, enqueue_many_plan(request))
        if not all(handle.duplicate for handle in handles):
            self.config.track(conn, (request.queue,))
        return handles

    def submit(
        self, workflow: Workflow, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> Submitted:
        """Submit a workflow run in its own transaction (see ``Client.submit``).

        Raises:
            WorkflowError: an invalid workflow; nothing is written.
            ValidationError: a bad input or option; nothing is written.
        """
        request = self.config.submit_request(workflow, input, **options)
        with self._connection() as conn:
            result = run_plan_sync(conn, submit_plan(request))
            if not conn.autocommit:
                conn.commit()
            if not result.duplicate:
                self._publish(conn, request.workflow.queues, ())
        return result

    def submit_tx(
        self,
        conn: psycopg.Connection[Any],
        workflow: Workflow,
        input: Any = None,
        **options: Unpack[SubmitOptions],
    ) -> Submitted:
        """Submit inside the caller's transaction on ``conn`` (see ``Client.submit_tx``).

        Raises:
            WorkflowError: an invalid workflow.
            ValidationError: a bad value, or ``conn`` cannot join a transaction.
        """
        request = self.config.submit_request(workflow, input, **options)
        self.config.check_tx_conn(conn, psycopg.Connection)
        result = run_plan_sync(conn, submit_plan(request))
        self.config.track(conn, request.workflow.queues)
        return result

    def signal(self, run: RunRef, name: str, payload: Any = None) -> bool:
        """Deliver a signal to a run's mailbox (see ``Client.signal``).

        Returns:
            True if stored; False beyond the wait's capacity, after the wait completed,
            or when the run is finished.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: no wait node of the run declares ``name``, or a bad payload.
        """
        run_id = run_id_of(run)
        check_text(name, "signal name")
        encoded = encode_json(PLAIN.encode(payload), f"payload of signal {name!r}")
        with self._connection() as conn:
            if not conn.autocommit:
                conn.commit()
            with conn.transaction():
                stored, settled = run_plan_sync(conn, signal_plan(run_id, name, encoded))
            if settled.wakeups.queues or settled.finished:
                self._publish(conn, settled.wakeups.queues, settled.finished)
        return stored

    def track_wakeups(self, conn: psycopg.Connection[Any]) -> WakeupTracker:
        """Record the queues of ``*_tx`` work on ``conn`` (see ``Client.track_wakeups``)."""
        return self.config.tracker_for(conn)

    def publish_wakeups(self, tracker: WakeupTracker) -> None:
        """Send the wakeups a tracker recorded (call after the caller's commit)."""
        queues, tracker.queues = set(tracker.queues), set()
        if queues:
            with self._connection() as conn:
                self._publish(conn, queues, ())


def _own_transaction(conn: psycopg.Connection[Any], plan: Plan[T], *, keyed: bool) -> T:
    """Run a producer's plan in a transaction of its own (see ``Client``'s twin)."""
    if conn.autocommit:
        if not keyed:
            return run_plan_sync(conn, plan)
        with conn.transaction():
            return run_plan_sync(conn, plan)
    result = run_plan_sync(conn, plan)
    conn.commit()
    return result
