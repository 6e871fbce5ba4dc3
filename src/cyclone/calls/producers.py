"""Producer calls of ``Client``: enqueue, submit, signal, and their transactional forms."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar, Unpack

import psycopg

from cyclone.calls.base import AsyncCalls
from cyclone.config import WakeupTracker
from cyclone.dbio import (
    Plan,
    Stmt,
    fetch_async,
    run_plan_async,
)
from cyclone.options import check_text
from cyclone.payloads import PLAIN, encode_json
from cyclone.producer import (
    EnqueueOptions,
    EnqueueRequest,
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
from cyclone.sql import Q
from cyclone.submit import SubmitOptions, submit_plan
from cyclone.wakeups import Wakeups
from cyclone.workflow import Workflow

__all__ = ["ProducerCalls"]

T = TypeVar("T")

log = logging.getLogger("cyclone.client")


class ProducerCalls(AsyncCalls):
    """Producer calls of ``Client``: enqueue, submit, signal, and their transactional forms."""

    def track_wakeups(self, conn: psycopg.AsyncConnection[Any]) -> WakeupTracker:
        """Record the queues of work written by ``*_tx`` calls on ``conn``.

        After the caller commits, pass the tracker to :meth:`publish_wakeups` so that
        idle workers wake at once instead of at their next poll.
        """
        return self.config.tracker_for(conn)

    async def publish_wakeups(self, tracker: WakeupTracker) -> None:
        """Send the wakeups a tracker recorded (call after the caller's commit)."""
        await self._open()
        assert self._publisher is not None
        queues, tracker.queues = set(tracker.queues), set()
        self._publisher.available(queues)
        await self._publisher.flush()

    async def enqueue(
        self, kind: KindTarget, input: Any = None, **options: Unpack[EnqueueOptions]
    ) -> Enqueued:
        """Enqueue a standalone run of one step, in its own transaction.

        Args:
            kind: the handler or the kind's name (a producer need not import handlers).
            input: the step's input, a JSON value (or a dataclass / pydantic model).
            **options: ``queue``, ``priority``, ``scheduled_at`` (aware datetime, or a
                ``timedelta`` or seconds from the database's now()), ``max_attempts``,
                ``timeout``, ``unique_key``, ``submit_key``, ``sequence_key``,
                ``retention`` (:class:`cyclone.producer.EnqueueOptions`).

        Returns:
            An :class:`Enqueued`; ``duplicate=True`` when a live step of the kind
            already holds ``unique_key``, or a run of the kind (in any state, until it
            is purged) holds ``submit_key``: that run is returned, nothing is written
            and no wakeup is sent.

        Raises:
            ValidationError: a bad kind, input or option, or ``unique_key`` together
                with ``submit_key``; nothing is written.
            StateError: the key kept changing hands, or a workflow run of the kind's
                name holds the submit key.
            ConfigurationError: the schema is not installed.
        """
        request = self.config.request(kind, input, **options)
        async with self._connection() as conn:
            if request.unique_key is None and request.submit_keys is None:
                # One statement, one round trip: the wakeup rides in it at the leading
                # edge of the queue's window (the commit delivers it), else the
                # publisher sends the trailing one after the commit.
                return await self._enqueue_one(conn, request)
            result = await _own_transaction(
                conn, enqueue_plan(request), keyed=request.submit_keys is not None
            )
        if not result.duplicate:
            self._announce(Wakeups.of_queues((request.queue,)))
        return result

    async def _enqueue_one(
        self, conn: psycopg.AsyncConnection[Any], request: EnqueueRequest
    ) -> Enqueued:
        """Insert one run without keys in its own transaction: one statement.

        At the leading edge of the queue's wakeup window the statement carries the
        NOTIFY too (``steps_enqueue_woken``): the commit delivers it, and nothing is
        sent after the commit. Inside the window the publisher sends the trailing
        wakeup. A role that may not NOTIFY gets that statement refused before it writes
        anything: the enqueue is sent again without the wakeup, and this client leaves
        every wakeup to the publisher from then on, which logs that it fails.
        """
        assert self._publisher is not None
        wake = self._publisher.lead(request.queue) if self._inline_wakeups else None
        stmt = enqueue_stmt(request)
        if wake is not None:
            stmt = Stmt(Q.steps_enqueue_woken, {**request.params, "wake": wake})
        try:
            rows = await fetch_async(conn, stmt)
        except psycopg.errors.InsufficientPrivilege:
            if wake is None:
                raise
            if not conn.autocommit:
                await conn.rollback()
            # alone: raises the refusal again when it was not about the NOTIFY
            rows = await fetch_async(conn, enqueue_stmt(request))
            self._inline_wakeups = False
            log.warning("this role may not NOTIFY: enqueues no longer carry their wakeup")
            wake = None
        if not conn.autocommit:
            await conn.commit()
        if wake is None:  # inside the window, or no inline wakeups: after the commit
            self._announce(Wakeups.of_queues((request.queue,)))
        return enqueued_from_rows(rows)[0]

    async def _insert(
        self, conn: psycopg.AsyncConnection[Any], stmt: Stmt, queue: str
    ) -> list[tuple[Any, ...]]:
        """Run one insert in its own transaction, then announce its queue.

        The wakeup goes through the publisher after the commit (at once when the queue's
        window is over, its leading edge), so a failing NOTIFY is logged by the
        publisher and never raised here.
        """
        rows = await fetch_async(conn, stmt)
        if not conn.autocommit:
            await conn.commit()
        self._announce(Wakeups.of_queues((queue,)))
        return rows

    async def enqueue_tx(
        self,
        conn: psycopg.AsyncConnection[Any],
        kind: KindTarget,
        input: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """:meth:`enqueue` inside the caller's transaction on ``conn``.

        The run exists once the caller commits and is gone if it rolls back. No wakeup
        is sent (a poll finds the work) unless ``conn`` is tracked (:meth:`track_wakeups`)
        and the run is new. With ``submit_key``, a run that holds the key and committed
        (or was written earlier in this transaction) is returned with ``duplicate=True``.

        Raises:
            ValidationError: a bad value, or ``conn`` is not an ``AsyncConnection`` in a
                transaction (autocommit, closed or failed).
            StateError: as :meth:`enqueue`.
        """
        request = self.config.request(kind, input, **options)
        self.config.check_tx_conn(conn, psycopg.AsyncConnection)
        result = await run_plan_async(conn, enqueue_plan(request))
        if not result.duplicate:
            self.config.track(conn, (request.queue,))
        return result

    async def enqueue_many(
        self, kind: KindTarget, inputs: Sequence[Any], **options: Unpack[ManyOptions]
    ) -> list[Enqueued]:
        """Enqueue one standalone run per input, with shared options, in one transaction.

        Takes the options of :meth:`enqueue` except ``unique_key`` and ``submit_key``;
        ``submit_keys`` gives one submit key per input instead (``None`` for an input
        without one; no two alike).

        Returns:
            The handles in input order; ``duplicate=True`` (and the existing run's ids)
            for each input whose submit key a run of the kind already holds. Only new
            runs are written; a call that writes none sends no wakeup.

        Raises:
            ValidationError: a bad kind, input or option, or bad ``submit_keys`` (not
                one per input, a bad key, a key given twice); nothing is written.
            StateError: as :meth:`enqueue`.
        """
        request = self.config.request(kind, inputs, many=True, **options)
        if not inputs:
            return []
        async with self._connection() as conn:
            if request.submit_keys is None:
                rows = await self._insert(conn, enqueue_many_stmt(request), request.queue)
                return enqueued_from_rows(rows)
            handles = await _own_transaction(conn, enqueue_many_plan(request), keyed=True)
        if not all(handle.duplicate for handle in handles):
            self._announce(Wakeups.of_queues((request.queue,)))
        return handles

    async def enqueue_many_tx(
        self,
        conn: psycopg.AsyncConnection[Any],
        kind: KindTarget,
        inputs: Sequence[Any],
        **options: Unpack[ManyOptions],
    ) -> list[Enqueued]:
        """:meth:`enqueue_many` inside the caller's transaction on ``conn`` (see
        :meth:`enqueue_tx`).

        Raises:
            ValidationError: as :meth:`enqueue_many` and :meth:`enqueue_tx`.
            StateError: as :meth:`enqueue`.
        """
        request = self.config.request(kind, inputs, many=True, **options)
        self.config.check_tx_conn(conn, psycopg.AsyncConnection)
        if not inputs:
            return []
        handles = await run_plan_async(conn, enqueue_many_plan(request))
        if not all(handle.duplicate for handle in handles):
            self.config.track(conn, (request.queue,))
        return handles

    async def submit(
        self, workflow: Workflow, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> Submitted:
        """Submit a workflow run: the run and its whole graph in one transaction.

        Args:
            workflow: the :class:`cyclone.Workflow`.
            input: the run input, a JSON value (or a dataclass / pydantic model).
            **options: ``submit_key`` (submit-once) and ``deadline`` (``timedelta`` or
                seconds).

        Returns:
            A :class:`Submitted`; ``duplicate=True`` when a run of the workflow already
            holds ``submit_key`` (that run is returned, nothing is written).

        Raises:
            WorkflowError: an invalid workflow (named problem); nothing is written.
            ValidationError: a bad input or option; nothing is written.
        """
        request = self.config.submit_request(workflow, input, **options)
        async with self._connection() as conn:
            result = await run_plan_async(conn, submit_plan(request))
            if not conn.autocommit:
                await conn.commit()
        if not result.duplicate:
            self._announce(Wakeups.of_queues(request.workflow.queues))
        return result

    async def submit_tx(
        self,
        conn: psycopg.AsyncConnection[Any],
        workflow: Workflow,
        input: Any = None,
        **options: Unpack[SubmitOptions],
    ) -> Submitted:
        """:meth:`submit` inside the caller's transaction on ``conn``.

        The run exists once the caller commits and is gone if it rolls back. No wakeup
        is sent (a poll finds the work) unless ``conn`` is tracked (:meth:`track_wakeups`).

        Raises:
            WorkflowError: an invalid workflow.
            ValidationError: a bad value, or ``conn`` is not an ``AsyncConnection`` in a
                transaction.
        """
        request = self.config.submit_request(workflow, input, **options)
        self.config.check_tx_conn(conn, psycopg.AsyncConnection)
        result = await run_plan_async(conn, submit_plan(request))
        self.config.track(conn, request.workflow.queues)
        return result

    async def signal(self, run: RunRef, name: str, payload: Any = None) -> bool:
        """Deliver signal ``name`` with ``payload`` (a JSON value) to a run's mailbox.

        The wait node of the run that declares ``name`` takes it: at once if it is
        waiting, else when it is reached. The mailbox keeps at most the wait's useful
        capacity (1, or N for ``wait_n``).

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
        async with self._engine_connection() as conn, conn.transaction():
            stored, settled = await run_plan_async(conn, signal_plan(run_id, name, encoded))
        self._announce(settled.wakeups, settled.finished)
        return stored


async def _own_transaction(conn: psycopg.AsyncConnection[Any], plan: Plan[T], *, keyed: bool) -> T:
    """Run a producer's plan in a transaction of its own on ``conn``, committed here.

    A keyed plan (submit keys) may take more than one statement (the insert, then the
    lookup of keys taken meanwhile, perhaps an insert again): on an autocommit
    connection it runs inside one transaction. A ``unique_key`` plan runs statement by
    statement: each of its inserts is complete alone, and its lookups only read.
    """
    if conn.autocommit:
        if not keyed:
            return await run_plan_async(conn, plan)
        async with conn.transaction():
            return await run_plan_async(conn, plan)
    result = await run_plan_async(conn, plan)
    await conn.commit()
    return result
