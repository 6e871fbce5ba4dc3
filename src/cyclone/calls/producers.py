"""Producer calls of both clients: enqueue, submit, signal, and their transactional
forms (scripts: see :mod:`cyclone.calls.effects`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from cyclone.calls.effects import (
    Announce,
    CallsCore,
    Conn,
    EnqueueOne,
    Joined,
    Own,
    Script,
    Track,
    fetch,
    twin,
)
from cyclone.config import WakeupTracker
from cyclone.dbio import Plan
from cyclone.observability.tracing import enqueue_attributes, producer_span, submit_attributes
from cyclone.options import check_text
from cyclone.payloads import PLAIN, encode_json
from cyclone.producer import (
    EnqueueOptions,
    KindTarget,
    ManyOptions,
    enqueue_many_plan,
    enqueue_many_stmt,
    enqueue_plan,
    enqueued_from_rows,
)
from cyclone.records import Enqueued, RunRef, Submitted, run_id_of
from cyclone.signals import signal_plan
from cyclone.submit import SubmitOptions, submit_plan
from cyclone.wakeups import Wakeups
from cyclone.workflow import Workflow

__all__ = ["ProducerCalls"]


def _nothing(value: Any) -> Plan[Any]:
    """A plan with no statement that returns ``value``."""
    return value
    yield  # pragma: no cover - makes this a generator


class ProducerCalls(CallsCore):
    """Producer calls: enqueue, submit, signal, and their transactional forms."""

    @twin
    def enqueue(
        self, kind: KindTarget, input: Any = None, **options: Unpack[EnqueueOptions]
    ) -> Script[Enqueued]:
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
        with producer_span(f"cyclone.enqueue {request.kind}", enqueue_attributes(request)) as span:
            request = request.traced(span.traceparent)
            if request.unique_key is None and request.submit_keys is None:
                enqueued: Enqueued = yield EnqueueOne(request)
                span.set("cyclone.run_id", enqueued.run_id)
                return enqueued
            # A unique_key plan runs statement by statement (each insert is complete
            # alone, its lookups only read); a submit_key plan may take an insert, a
            # lookup of the keys taken meanwhile and an insert again: one transaction.
            atomic = request.submit_keys is not None
            result: Enqueued = yield Own(enqueue_plan(request), atomic=atomic)
            span.set("cyclone.run_id", result.run_id)
        if not result.duplicate:
            yield Announce(Wakeups.of_queues((request.queue,)))
        return result

    @twin
    def enqueue_many(
        self, kind: KindTarget, inputs: Sequence[Any], **options: Unpack[ManyOptions]
    ) -> Script[list[Enqueued]]:
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
        handles: list[Enqueued]
        attributes = enqueue_attributes(request, count=len(inputs))
        with producer_span(f"cyclone.enqueue {request.kind}", attributes) as span:
            request = request.traced(span.traceparent)
            if request.submit_keys is None:
                rows = yield Own(fetch(enqueue_many_stmt(request)))
                handles = enqueued_from_rows(rows)
            else:
                handles = yield Own(enqueue_many_plan(request), atomic=True)
        if not all(handle.duplicate for handle in handles):
            yield Announce(Wakeups.of_queues((request.queue,)))
        return handles

    @twin
    def submit(
        self, workflow: Workflow, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> Script[Submitted]:
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
        with producer_span(f"cyclone.submit {workflow.name}", submit_attributes(request)) as span:
            request = request.traced(span.traceparent)
            result: Submitted = yield Own(submit_plan(request))
            span.set("cyclone.run_id", result.run_id)
        if not result.duplicate:
            yield Announce(Wakeups.of_queues(request.workflow.queues))
        return result

    @twin
    def signal(self, run: RunRef, name: str, payload: Any = None) -> Script[bool]:
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
        plan = signal_plan(run_id, name, encoded)
        attributes = {"cyclone.run_id": run_id, "cyclone.signal": name}
        with producer_span(f"cyclone.signal {name}", attributes) as span:
            stored, settled = yield Own(plan, atomic=True, engine=True)
            span.set("cyclone.stored", bool(stored))
        yield Announce.of(settled.wakeups, settled.finished)
        return bool(stored)

    @twin
    def enqueue_tx(
        self, conn: Conn, kind: KindTarget, input: Any = None, **options: Unpack[EnqueueOptions]
    ) -> Script[Enqueued]:
        """:meth:`enqueue` inside the caller's transaction on ``conn`` (a
        ``psycopg.AsyncConnection`` for ``Client``, a ``psycopg.Connection`` for
        ``SyncClient``).

        The run exists once the caller commits and is gone if it rolls back. No wakeup
        is sent (a poll finds the work) unless ``conn`` is tracked (:meth:`track_wakeups`)
        and the run is new. With ``submit_key``, a run that holds the key and committed
        (or was written earlier in this transaction) is returned with ``duplicate=True``.

        Raises:
            ValidationError: a bad value, or ``conn`` is not a connection of the
                client's kind that can join a transaction (closed, failed, or autocommit
                outside one).
            StateError: as :meth:`enqueue`.
        """
        request = self.config.request(kind, input, **options)
        with producer_span(f"cyclone.enqueue {request.kind}", enqueue_attributes(request)) as span:
            request = request.traced(span.traceparent)
            result: Enqueued = yield Joined(conn, enqueue_plan(request))
            span.set("cyclone.run_id", result.run_id)
        if not result.duplicate:
            yield Track(conn, (request.queue,))
        return result

    @twin
    def enqueue_many_tx(
        self, conn: Conn, kind: KindTarget, inputs: Sequence[Any], **options: Unpack[ManyOptions]
    ) -> Script[list[Enqueued]]:
        """:meth:`enqueue_many` inside the caller's transaction on ``conn`` (see
        :meth:`enqueue_tx`).

        Raises:
            ValidationError: as :meth:`enqueue_many` and :meth:`enqueue_tx`.
            StateError: as :meth:`enqueue`.
        """
        request = self.config.request(kind, inputs, many=True, **options)
        attributes = enqueue_attributes(request, count=len(inputs))
        with producer_span(f"cyclone.enqueue {request.kind}", attributes) as span:
            request = request.traced(span.traceparent)
            plan = enqueue_many_plan(request) if inputs else _nothing([])
            handles: list[Enqueued] = yield Joined(conn, plan)
        if not all(handle.duplicate for handle in handles):
            yield Track(conn, (request.queue,))
        return handles

    @twin
    def submit_tx(
        self, conn: Conn, workflow: Workflow, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> Script[Submitted]:
        """:meth:`submit` inside the caller's transaction on ``conn`` (see
        :meth:`enqueue_tx`).

        The run exists once the caller commits and is gone if it rolls back. No wakeup
        is sent (a poll finds the work) unless ``conn`` is tracked (:meth:`track_wakeups`).

        Raises:
            WorkflowError: an invalid workflow.
            ValidationError: a bad value, or ``conn`` cannot join a transaction (see
                :meth:`enqueue_tx`).
        """
        request = self.config.submit_request(workflow, input, **options)
        with producer_span(f"cyclone.submit {workflow.name}", submit_attributes(request)) as span:
            request = request.traced(span.traceparent)
            result: Submitted = yield Joined(conn, submit_plan(request))
            span.set("cyclone.run_id", result.run_id)
        yield Track(conn, tuple(request.workflow.queues))
        return result

    def track_wakeups(self, conn: Conn) -> WakeupTracker:
        """Record the queues of work written by ``*_tx`` calls on ``conn``.

        After the caller commits, pass the tracker to :meth:`publish_wakeups` so that
        idle workers wake at once instead of at their next poll.
        """
        return self.config.tracker_for(conn)

    @twin
    def publish_wakeups(self, tracker: WakeupTracker) -> Script[None]:
        """Send the wakeups a tracker recorded (call after the caller's commit); they
        are sent when this returns."""
        queues, tracker.queues = set(tracker.queues), set()
        if queues:
            yield Announce(Wakeups.of_queues(queues), flush=True)
