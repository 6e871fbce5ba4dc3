"""``SyncClient``: the producer and inspection calls of ``Client``, synchronous.

The same method names and arguments as :class:`cyclone.Client` (python-api.md, Client),
for code without an event loop: web handlers, scripts, tests. It runs no workers (use
``Client`` or ``cyclone worker``). Wakeups are published right after each commit, in
their own transaction.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Self, TypeVar, Unpack

import psycopg
from psycopg_pool import ConnectionPool

from cyclone.config import KEEP, ClientConfig, WakeupTracker, list_runs_params
from cyclone.connections import (
    DEFAULT_TCP_USER_TIMEOUT,
    ConnectionSettings,
    borrow_sync,
    connect_failure,
)
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import Plan, Stmt, fetch_dicts_sync, fetch_sync, run_plan_sync
from cyclone.errors import (
    NotFoundError,
    ValidationError,
    WaitTimeout,
)
from cyclone.handlers import Handler
from cyclone.migrate import check_schema, migrate
from cyclone.monitor import QueueStats, queue_stats_sync
from cyclone.notify import RUN_DONE, publish_sync, runs_in_payload
from cyclone.options import HOUR, Duration, check_text, seconds
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
from cyclone.records import Enqueued, Run, RunRef, Schedule, Step, Submitted, run_id_of
from cyclone.scanners.purge import purge_sync
from cyclone.schedules import create_plan, set_enabled_plan, update_plan
from cyclone.signals import signal_plan
from cyclone.sql import Q
from cyclone.states import RunState
from cyclone.submit import SubmitOptions, submit_plan
from cyclone.workflow import Workflow

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient:
    """Synchronous producer and inspection client.

    Args:
        conninfo: a libpq connection string or URL, or a ``psycopg_pool.ConnectionPool``.
        handlers: kinds whose default options (queue, priority, ...) ``enqueue`` applies
            when given their name.
        workflows: workflows whose nodes' kinds are registered the same way.
        poll_interval: seconds between polls of :meth:`wait` (default 1).
        notify: LISTEN in :meth:`wait` (default True); wakeups are published either way.
        schema: the Postgres schema Cyclone lives in (default ``public``).
        tcp_user_timeout: seconds after which a connection whose network is gone is
            dropped (default 10; ``None``: the libpq and system defaults). Sets libpq's
            ``tcp_user_timeout`` and keepalives on the client's own connections; values
            in ``conninfo`` win. See docs/operations.md, Network faults.
        retention: default time a finished run is kept (default 7 days).
        max_connections: size of the client's own pool (default 4).
        pooler: ``"transaction"`` behind a transaction-mode pooler, ``"session"``
            otherwise (default ``$CYCLONE_POOLER``, else ``"session"``); see
            ``Client``.
        connect_timeout: seconds a call waits for a connection before it raises
            :class:`cyclone.DatabaseUnavailable` (default 5).

    Raises:
        ValidationError: a bad option.
    """

    __module__ = "cyclone"

    def __init__(
        self,
        conninfo: str | ConnectionPool[Any],
        *,
        handlers: Iterable[Handler] = (),
        workflows: Iterable[Workflow] = (),
        poll_interval: Duration = 1.0,
        notify: bool = True,
        schema: str = "public",
        tcp_user_timeout: Duration | None = DEFAULT_TCP_USER_TIMEOUT,
        retention: Duration | None = timedelta(days=7),
        max_connections: int = 4,
        pooler: str | None = None,
        connect_timeout: Duration = 5.0,
    ) -> None:
        self.config = ClientConfig(
            handlers=handlers,
            workflows=workflows,
            schema=schema,
            retention=retention,
            notify=notify,
        )
        self.poll_interval = seconds(poll_interval, "poll_interval", maximum=HOUR) or 1.0
        if isinstance(conninfo, ConnectionPool):
            base = conninfo.conninfo
            if not isinstance(base, str):
                raise ValidationError("a pool passed to SyncClient needs a conninfo string")
            self._pool = conninfo
            self._own_pool = False
        elif isinstance(conninfo, str):
            base = conninfo
        else:
            raise ValidationError(
                f"conninfo must be a string or a ConnectionPool, got {conninfo!r}"
            )
        self.settings = ConnectionSettings.from_options(
            base,
            schema=schema,
            pooler=pooler,
            connect_timeout=connect_timeout,
            tcp_user_timeout=tcp_user_timeout,
        )
        """Conninfo, schema, pooler mode and timeouts of every connection it opens."""
        self.connect_timeout: float = self.settings.connect_timeout or 5.0
        self.tcp_user_timeout = self.settings.tcp_user_timeout
        if isinstance(conninfo, str):
            self._pool = ConnectionPool(
                self.settings.conninfo_for("cyclone-sync"),
                min_size=1,
                max_size=max_connections,
                kwargs=self.settings.kwargs(autocommit=True),
                open=False,
                name="cyclone-sync",
                configure=self.settings.configure_sync(),
            )
            self._own_pool = True
        self._conninfo = base
        self._listen_conninfo = self.settings.conninfo_for("cyclone-wait")
        self._opened = False

    # -- lifecycle -----------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply missing migrations (see :func:`cyclone.migrate`)."""
        return migrate(
            self._conninfo,
            schema=self.config.schema,
            pooler=self.settings.pooler,
            connect_timeout=self.connect_timeout,
        )

    def open(self) -> None:
        """Check the schema and open the pool (done on first use).

        Raises:
            ConfigurationError: the schema is not installed or not current.
            DatabaseUnavailable: the first connection failed (down, unreachable within
                ``connect_timeout``, or refused: the message gives the server's reason).
        """
        if not self._opened:
            try:
                check_schema(self._conninfo, settings=self.settings)
            except psycopg.OperationalError as exc:
                raise connect_failure(exc) from exc
            if self._own_pool:
                self._pool.open()
            self._opened = True

    def close(self) -> None:
        """Close the client's own pool."""
        if self._opened and self._own_pool:
            self._pool.close()
        self._opened = False

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool within ``connect_timeout``.

        Raises:
            DatabaseUnavailable: none came in time (the server is down or unreachable).
        """
        self.open()
        with borrow_sync(self._pool, self.settings) as conn:
            yield conn

    def _publish(
        self, conn: psycopg.Connection[Any], queues: Iterable[str], runs: Iterable[int]
    ) -> None:
        """Send wakeups after the commit of what they announce, in a round trip and a
        transaction of their own; a failure is logged, never raised."""
        if not conn.autocommit:  # a user's pool in transaction mode: finish its transaction
            conn.commit()
        publish_sync(conn, queues, runs)

    # -- producers -----------------------------------------------------------------

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

    # -- inspection and control ----------------------------------------------------

    def get_run(self, run: RunRef) -> Run:
        """The run with its result and error (see ``Client.get_run``).

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.runs_get, {"run_id": run_id}))
        if not rows:
            raise NotFoundError(f"run {run_id} does not exist")
        return Run.from_row(rows[0])

    def list_runs(
        self,
        state: RunState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[Run]:
        """Runs, newest first; ``before`` pages below a run id.

        Raises:
            ValidationError: an unknown state, a bad limit, ``before`` or workflow.
        """
        params = list_runs_params(state, workflow, limit, before)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.runs_list, params))
        return [Run.from_row(row) for row in rows]

    def list_steps(self, run: RunRef) -> list[Step]:
        """Every step of a run, in insertion order (empty for an unknown run).

        Raises:
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.steps_list, {"run_id": run_id}))
        return [Step.from_row(row) for row in rows]

    def cancel(self, run: RunRef) -> None:
        """Cancel a running or paused run and its active steps (see ``Client.cancel``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is already completed, failed or cancelled.
        """
        self._operate(cancel_plan(run_id_of(run)))

    def pause(self, run: RunRef) -> None:
        """Pause a running run (see ``Client.pause``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not running.
        """
        self._operate(pause_plan(run_id_of(run)))

    def resume(self, run: RunRef) -> None:
        """Resume a paused run (see ``Client.resume``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not paused.
        """
        self._operate(resume_plan(run_id_of(run)))

    def retry(
        self, run: RunRef, node: str | None = None, *, deadline: Duration | None = None
    ) -> int:
        """Operator retry of discarded and cancelled steps (see ``Client.retry``).

        Raises:
            NotFoundError: no run has that id.
            StateError: nothing to retry.
            ValidationError: a bad node or deadline.
        """
        if node is not None:
            check_text(node, "node")
        limit = seconds(deadline, "deadline")
        return self._operate(retry_plan(run_id_of(run), node, limit))

    def _operate(self, plan: Plan[Outcome[T]]) -> T:
        """Run an operator plan in one transaction; after the commit, publish its
        wakeups and finished runs on the same connection; its value. A sync client runs
        no scanner: the scanner passes an outcome asks for come from the engines'
        polling."""
        with self._connection() as conn:
            if not conn.autocommit:
                conn.commit()
            with conn.transaction():
                outcome = run_plan_sync(conn, plan)
            if outcome.wakeups.queues or outcome.finished:
                self._publish(conn, outcome.wakeups.queues, outcome.finished)
        return outcome.value

    # -- schedules, retention ----------------------------------------------------

    def create_schedule(
        self,
        id: str,
        target: KindTarget | Workflow,
        input: Any,
        cron: str,
        location: str = "Local",
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule (see ``Client.create_schedule``).

        Raises:
            ValidationError: a bad id, cron expression, zone, input or option, or the
                id is taken; nothing is written.
            WorkflowError: an invalid workflow.
        """
        spec = self.config.schedule_spec(
            id, target, input, cron=cron, location=location, options=options
        )
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, create_plan(spec))
        return self.get_schedule(spec.id)

    def update_schedule(
        self,
        id: str,
        *,
        target: KindTarget | Workflow | None = None,
        input: Any = KEEP,
        cron: str | None = None,
        location: str | None = None,
        **options: Any,
    ) -> Schedule:
        """Change a schedule; what is not given stays (see ``Client.update_schedule``).

        Raises:
            NotFoundError: no schedule has that id.
            ValidationError, WorkflowError: a bad value; nothing is written.
        """
        rebuild = self.config.schedule_rebuild(
            target=target, input=input, cron=cron, location=location, options=options
        )
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, update_plan(check_text(id, "schedule id"), rebuild))
        return self.get_schedule(id)

    def enable_schedule(self, id: str) -> Schedule:
        """Fire the schedule again, from its next slot after now.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return self._set_enabled(id, True)

    def disable_schedule(self, id: str) -> Schedule:
        """Stop firing the schedule.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return self._set_enabled(id, False)

    def _set_enabled(self, id: str, enabled: bool) -> Schedule:
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, set_enabled_plan(check_text(id, "schedule id"), enabled))
        return self.get_schedule(id)

    def delete_schedule(self, id: str) -> None:
        """Delete the schedule and its fire records (the fired runs stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        with self._connection() as conn, conn.transaction():
            stmt = Stmt(Q.schedules_delete, {"id": check_text(id, "schedule id")})
            if not fetch_sync(conn, stmt):
                raise NotFoundError(f"schedule {id!r} does not exist")

    def get_schedule(self, id: str) -> Schedule:
        """The schedule with that id.

        Raises:
            NotFoundError: no schedule has that id.
        """
        with self._connection() as conn:
            rows = fetch_dicts_sync(
                conn, Stmt(Q.schedules_list, {"id": check_text(id, "schedule id")})
            )
        if not rows:
            raise NotFoundError(f"schedule {id!r} does not exist")
        return Schedule.from_row(rows[0])

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by id."""
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.schedules_list, {"id": None}))
        return [Schedule.from_row(row) for row in rows]

    def purge(self, older_than: Duration | None = None) -> int:
        """Delete terminal runs past their retention now (see ``Client.purge``).

        Raises:
            ValidationError: a negative ``older_than``.
        """
        limit = seconds(older_than, "older_than", allow_zero=True)
        with self._connection() as conn:
            return purge_sync(conn, limit)

    def stats(self) -> dict[str, QueueStats]:
        """Depth and age of every queue with unfinished work (see ``Client.stats``)."""
        with self._connection() as conn:
            return {q.queue: q for q in queue_stats_sync(conn)}

    def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:
        """Block until the run is terminal (see ``Client.wait``).

        Listens on ``cyclone_run_done`` on a connection of its own while it waits (unless
        ``notify=False``), and polls every ``poll_interval`` in any case.
        """
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        deadline = None if limit is None else time.monotonic() + limit
        listen: psycopg.Connection[Any] | None = None
        try:
            if self.config.notify and self.settings.can_listen:
                try:
                    listen = psycopg.connect(self._listen_conninfo, autocommit=True)
                    listen.execute(Q.notify_listen_done)
                except psycopg.Error:
                    listen = None  # poll only
            while True:
                try:
                    current: Run | None = self.get_run(run_id)
                except psycopg.OperationalError:  # a restart: keep waiting
                    current = None
                if current is not None and current.terminal:
                    return current
                pause = self.poll_interval
                if deadline is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        state = current.state.value if current else "unknown"
                        raise WaitTimeout(f"run {run_id} is still {state} after {limit} s")
                    pause = min(pause, remaining)
                if listen is None:
                    time.sleep(pause)
                    continue
                try:
                    for note in listen.notifies(timeout=pause):
                        if note.channel == RUN_DONE and run_id in runs_in_payload(note.payload):
                            break
                except psycopg.Error:
                    listen.close()
                    listen = None
        finally:
            if listen is not None:
                listen.close()


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
