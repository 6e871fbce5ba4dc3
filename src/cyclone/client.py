"""``Client`` (asyncio): producer and inspection calls, and the engine when started.

A client built with handlers runs an engine when started
(``async with client:``, :class:`cyclone.engine.Engine`): one claim loop per queue, the
recovery sweep and the other background passes; the client itself keeps the producer
and inspection calls, the publisher and the LISTEN connection. A client with no
handlers never claims or scans; it only enqueues and inspects. Connections
(docs/decisions.md, Connections and pools):

* the lease pool, 2 autocommit connections for claims and heartbeats only, so that they
  never wait behind completions, the sweep or producer calls;
* the engine pool, 3 autocommit connections (5 without handlers) for completions
  without a completion transaction, failures, the sweep, wakeups, and the producer and
  inspection calls when no pool is passed in;
* one LISTEN connection;
* the handler pools for completion transactions, ``max_connections - 6`` in all, of which
  ``tx_slots`` may be in a transaction at once. The engine's six are never lent to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Self, TypeVar, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.config import KEEP, ClientConfig, WakeupTracker, list_runs_params
from cyclone.connections import (
    DEFAULT_TCP_USER_TIMEOUT,
    ConnectionSettings,
    borrow_async,
    connect_failure,
)
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import (
    Plan,
    Stmt,
    fetch_async,
    fetch_dicts_async,
    run_plan_async,
)
from cyclone.engine import LEASE_CONNECTIONS, Engine, EngineSettings
from cyclone.errors import (
    NotFoundError,
    PoolTooSmallError,
    StateError,
    ValidationError,
    WaitTimeout,
)
from cyclone.handlers import Handler
from cyclone.migrate import check_schema_async, migrate_async
from cyclone.monitor import QueueStats, queue_stats_async
from cyclone.notify import Listener, Publisher
from cyclone.options import DAY, HOUR, Duration, check_int, check_queue, check_text, seconds
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
from cyclone.records import Enqueued, Run, RunRef, Schedule, Step, Submitted, run_id_of
from cyclone.scanners.purge import Purger, purge_async
from cyclone.scanners.schedules import ScheduleScanner
from cyclone.scanners.sweep import Sweeper
from cyclone.scanners.waits import WaitScanner
from cyclone.schedules import CatchUp, create_plan, set_enabled_plan, update_plan
from cyclone.signals import signal_plan
from cyclone.sql import Q
from cyclone.states import RunState
from cyclone.submit import SubmitOptions, submit_plan
from cyclone.wakeups import Announcer, Wakeups
from cyclone.worker import MAX_CLAIM_BATCH, Worker, WorkerSettings
from cyclone.workflow import Workflow

__all__ = ["ENGINE_RESERVE", "LEASE_CONNECTIONS", "MAX_SLOTS", "Client"]

log = logging.getLogger("cyclone.client")
T = TypeVar("T")

ENGINE_RESERVE = 6
"""Connections kept for the engine: the lease pool, the engine pool and LISTEN."""
DEFAULT_SLOTS = 100
"""Worker slots of each queue of the registered kinds when ``queues`` is not given."""
DEFAULT_TX_SLOTS = 20
"""Most completion transactions a client opens at once when ``tx_slots`` is not given."""
MAX_SLOTS = 10_000
"""Most worker slots one queue of one client may have."""


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Client:
    """The asyncio client: producer and inspection calls; workers when started.

    Args:
        conninfo: a libpq connection string or URL, or a ``psycopg_pool.AsyncConnectionPool``
            (which then serves producer and inspection calls only; the engine always
            opens its own connections from the pool's conninfo).
        handlers: the kinds this client registers; a worker claims only these kinds.
        workflows: the workflows this client runs (their nodes' kinds are registered
            too). A worker runs a workflow step only if it registers the run's workflow
            with the run's ``def_version``; see docs/workflows.md.
        queues: queue name -> worker slots (1 to 10,000). Default: each queue of the
            registered kinds and of the registered workflows' nodes, with 100 slots.
            :meth:`set_queues` changes them before a start.
        lease_ttl: lease length (``timedelta`` or seconds, default 30): the time to detect a
            crashed worker. Heartbeats renew it every ``lease_ttl / 3``.
        poll_interval: seconds between polls when no wakeup comes (default 1).
        notify: LISTEN for wakeups (default True). False: poll only; still publishes.
        notify_coalesce: the wakeup window per queue (default 0.001 s): a queue not
            announced within the window is announced at once, later requests in the
            window fold into one NOTIFY at its end. 0: no window (requests made while a
            NOTIFY is in flight still fold into the next one). Every NOTIFY is sent after
            the commit of what it announces, by a background task; one that fails is
            logged, never raised to the caller.
        max_reclaims: reclaims a step may take before it is discarded with
            ``reclaim_limit`` (default 5).
        tx_slots: completion transactions open at once (default: the total of slots, at
            most 20: a handler past them waits for one at ``ctx.completion_tx()``).
        max_connections: connections this client may open (default ``tx_slots + 6``).
        schema: the Postgres schema Cyclone lives in (default ``public``).
        tcp_user_timeout: seconds after which a connection whose network is gone is
            dropped (default 10; ``None``: the libpq and system defaults, which can hang
            for many minutes). Sets libpq's ``tcp_user_timeout`` and keepalives on every
            connection the client opens; values in ``conninfo`` win. Keep it below
            ``lease_ttl``; see docs/operations.md, Network faults.
        retention: default time a finished run is kept (default 7 days; ``None``: forever).
        shutdown_grace: seconds running handlers get to finish at stop (default 30).
        sweep_interval: seconds between recovery sweeps (default ``lease_ttl / 3``,
            at most 10).
        claim_batch: most steps one claim statement takes, 1 to 1000 (default
            ``None``: as many as the queue has free slots, at most 1000 per claim; a
            queue with more free slots claims again at once).
        schedule_catch_up: what the schedule scanner fires for slots missed while no
            client ran: ``"latest"`` (default) fires the most recent one once,
            ``"all"`` fires each, oldest first. See docs/operations.md.
        purge_interval: seconds between purges of expired runs (default 300; ``None``:
            this client never purges on its own). A pass reads every terminal run still
            kept; see docs/schedules.md.
        pooler: ``"transaction"`` when ``conninfo`` goes through a transaction-mode
            pooler (PgBouncer ``pool_mode = transaction``, a managed service's pooler):
            no server-side prepared statements, no session settings (the schema is set
            in each transaction), no LISTEN (``wait`` and the workers poll; wakeups are
            still published). ``"session"``: a direct connection or a session pooler.
            Default: ``$CYCLONE_POOLER``, else ``"session"``. See docs/operations.md.
        connect_timeout: seconds a producer or inspection call waits for a connection
            before it raises :class:`cyclone.DatabaseUnavailable` (default 5); also
            libpq's ``connect_timeout`` of every connection unless ``conninfo`` sets it.

    Raises:
        ValidationError: a bad option.
        PoolTooSmallError: ``max_connections < tx_slots + 6``.
    """

    __module__ = "cyclone"

    def __init__(
        self,
        conninfo: str | AsyncConnectionPool[Any],
        *,
        handlers: Iterable[Handler] = (),
        workflows: Iterable[Workflow] = (),
        queues: Mapping[str, int] | None = None,
        lease_ttl: Duration = 30.0,
        poll_interval: Duration = 1.0,
        notify: bool = True,
        notify_coalesce: Duration = 0.001,
        max_reclaims: int = 5,
        tx_slots: int | None = None,
        max_connections: int | None = None,
        schema: str = "public",
        tcp_user_timeout: Duration | None = DEFAULT_TCP_USER_TIMEOUT,
        retention: Duration | None = timedelta(days=7),
        shutdown_grace: Duration = 30.0,
        sweep_interval: Duration | None = None,
        claim_batch: int | None = None,
        schedule_catch_up: CatchUp = "latest",
        purge_interval: Duration | None = 300.0,
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
        if isinstance(conninfo, AsyncConnectionPool):
            self._user_pool: AsyncConnectionPool[Any] | None = conninfo
            base = conninfo.conninfo
            if not isinstance(base, str):
                raise ValidationError("a pool passed to Client needs a conninfo string")
        elif isinstance(conninfo, str):
            self._user_pool = None
            base = conninfo
        else:
            raise ValidationError(
                f"conninfo must be a string or an AsyncConnectionPool, got {conninfo!r}"
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
        self._conninfo = base
        self._engine_conninfo = self.settings.conninfo_for("cyclone")
        self.lease_ttl = seconds(lease_ttl, "lease_ttl", minimum=0.01, maximum=DAY) or 30.0
        self.poll_interval = seconds(poll_interval, "poll_interval", maximum=HOUR) or 1.0
        self.notify_coalesce = (
            seconds(notify_coalesce, "notify_coalesce", allow_zero=True, maximum=60) or 0.0
        )
        self.max_reclaims = check_int(max_reclaims, "max_reclaims", 0)
        self.shutdown_grace = (
            seconds(shutdown_grace, "shutdown_grace", allow_zero=True, maximum=DAY) or 0.0
        )
        self.claim_batch = (
            None
            if claim_batch is None
            else check_int(claim_batch, "claim_batch", 1, MAX_CLAIM_BATCH)
        )
        default_sweep = min(self.lease_ttl / 3, 10.0)
        self.sweep_interval = (
            seconds(sweep_interval, "sweep_interval", maximum=HOUR) or default_sweep
        )
        if schedule_catch_up not in ("latest", "all"):
            raise ValidationError(
                f"schedule_catch_up must be 'latest' or 'all', got {schedule_catch_up!r}"
            )
        self.schedule_catch_up: CatchUp = schedule_catch_up
        self.purge_interval = seconds(purge_interval, "purge_interval", maximum=DAY)
        self.owner = _owner_id()

        if queues is None:
            served = {h.options.queue for h in self.config.handlers.values()}
            queues = dict.fromkeys(sorted(served | self.config.workflow_queues), DEFAULT_SLOTS)
        self._given_sizes = (
            None if tx_slots is None else check_int(tx_slots, "tx_slots", 1),
            None if max_connections is None else check_int(max_connections, "max_connections", 1),
        )
        self.queues: dict[str, int] = {}
        """Queue name -> worker slots of the queues this client serves."""
        self.tx_slots = 0
        """Completion transactions open at once."""
        self.max_connections = 0
        """Connections this client may open."""
        self._pool_sizes = (0, 0)
        self._size(queues)

        self._engine_pool = self._new_pool()
        self._publisher: Publisher | None = None
        self._announcer: Announcer | None = None
        self._inline_wakeups = True  # enqueue carries its NOTIFY (False: the role may not)
        self._listener: Listener | None = None
        self._engine: Engine | None = None
        self._stopped: Engine | None = None  # the last engine stopped (its threads)
        self._waiters: dict[int, set[asyncio.Event]] = {}
        self._opened = False
        self._started = False
        self._open_lock: asyncio.Lock | None = None
        self._stop_lock: asyncio.Lock | None = None

    def _size(self, queues: Mapping[str, int]) -> None:
        """Set the queues, and ``tx_slots`` and ``max_connections`` where not given."""
        if not isinstance(queues, Mapping):
            raise ValidationError(f"queues must map queue names to slots, got {queues!r}")
        checked = {
            check_queue(q): check_int(n, f"slots of queue {q!r}", 1, MAX_SLOTS)
            for q, n in queues.items()
        }
        handler_list = list(self.config.handlers.values())
        tx_slots, max_connections = self._given_sizes
        if tx_slots is None:
            tx_slots = max(1, min(DEFAULT_TX_SLOTS, sum(checked.values())) if handler_list else 0)
        budget = tx_slots + ENGINE_RESERVE
        if max_connections is None:
            max_connections = budget
        if max_connections < budget:
            raise PoolTooSmallError(
                f"max_connections={max_connections} is below tx_slots + {ENGINE_RESERVE} = {budget}"
            )
        pool_sizes = _split_handler_pools(
            max_connections - ENGINE_RESERVE, handler_list, max_connections
        )
        self.queues, self.tx_slots, self.max_connections = checked, tx_slots, max_connections
        self._pool_sizes = pool_sizes

    def set_queues(self, queues: Mapping[str, int]) -> None:
        """Serve exactly ``queues`` (queue name -> worker slots, 1 to 10,000) from the
        next start on, as if given to the constructor (``cyclone worker --slots`` and
        ``--queue`` call it).

        ``tx_slots`` and ``max_connections`` follow the new total of slots unless they
        were given to the constructor. On an error nothing changes.

        Raises:
            ValidationError: a bad queue name or number of slots.
            PoolTooSmallError: a ``max_connections`` given to the constructor is below
                the new ``tx_slots + 6``.
            StateError: the client is started (stop it first).
        """
        if self._started:
            raise StateError("the queues of a started client cannot change; stop it first")
        self._size(queues)

    # -- lifecycle -----------------------------------------------------------------

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """The registered kinds by name."""
        return self.config.handlers

    async def migrate(self) -> list[int]:
        """Apply missing migrations to this client's database and schema.

        See :func:`cyclone.migrate`; returns the versions applied.
        """
        return await migrate_async(
            self._conninfo,
            schema=self.config.schema,
            pooler=self.settings.pooler,
            connect_timeout=self.connect_timeout,
        )

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        """A fresh (unopened) engine pool: a stopped client can start again. With
        handlers, the engine's lease pool takes LEASE_CONNECTIONS of the reserve."""
        with_handlers = bool(self.config.handlers)
        return AsyncConnectionPool(
            self._engine_conninfo,
            min_size=1,
            max_size=ENGINE_RESERVE - 1 - (LEASE_CONNECTIONS if with_handlers else 0),
            kwargs=self.settings.kwargs(autocommit=True),
            open=False,
            name="cyclone-engine",
            configure=self.settings.configure_async(),
        )

    async def _open(self) -> None:
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            # One direct connection first: a bad DSN fails at once with the server's
            # message (not after the pool's timeout), a missing schema with its remedy.
            try:
                await check_schema_async(self._conninfo, settings=self.settings)
            except psycopg.OperationalError as exc:
                raise connect_failure(exc) from exc
            await self._engine_pool.open()
            self._publisher = Publisher(self._engine_pool, coalesce=self.notify_coalesce)
            self._publisher.start()
            self._announcer = Announcer(self._publisher)
            self._opened = True

    async def start(self) -> None:
        """Open connections; with handlers, start workers, the sweep and the listener.

        Raises:
            ConfigurationError: Cyclone's schema is not installed (run ``migrate``).
            DatabaseUnavailable: the first connection failed (down, unreachable within
                ``connect_timeout``, or refused: the message gives the server's reason).
        """
        if self._started:
            return
        await self._open()
        self._started = True
        if not self.config.handlers:
            return
        try:
            await self._start_engine()
        except BaseException:
            await self.stop()  # leave nothing half started; a later start() retries
            raise

    async def _start_engine(self) -> None:
        assert self._announcer is not None
        self._engine = Engine(
            EngineSettings(
                worker=WorkerSettings(
                    owner=self.owner,
                    queues=dict(self.queues),
                    lease_ttl=self.lease_ttl,
                    poll_interval=self.poll_interval,
                    claim_batch=self.claim_batch,
                    shutdown_grace=self.shutdown_grace,
                    pinned_search_path=self.settings.per_transaction,
                ),
                sweep_interval=self.sweep_interval,
                max_reclaims=self.max_reclaims,
                schedule_catch_up=self.schedule_catch_up,
                purge_interval=self.purge_interval,
                tx_slots=self.tx_slots,
                pool_sizes=self._pool_sizes,
            ),
            config=self.config,
            connections=self.settings,
            pool=self._engine_pool,
            announcer=self._announcer,
        )
        await self._engine.start(listen=self._ensure_listener)

    def _ensure_listener(self) -> None:
        if self._listener is None and self.config.notify and self.settings.can_listen:
            self._listener = Listener(
                self.settings.conninfo_for("cyclone-listen"),
                on_available=self._on_available,
                on_run_done=self._on_run_done,
                on_connect=self._on_listen_connect,
                on_run_done_listen=self._wake_waiters,
                available=bool(self.config.handlers),
            )
            self._listener.want_run_done(bool(self._waiters))
            self._listener.start()

    async def stop(self) -> None:
        """Stop gracefully: workers drain (see ``shutdown_grace``), then connections close.

        Afterwards :attr:`threads_running` counts sync handlers whose thread has not
        returned yet; their steps were given back and their completion will be refused.
        """
        if self._stop_lock is None:
            self._stop_lock = asyncio.Lock()
        async with self._stop_lock:  # a second stop() waits for the first, then finds it done
            await self._stop()

    async def _stop(self) -> None:
        if self._engine is not None:
            # the engine stays reachable while it drains (wakeups, hurry, scanner kicks)
            await self._engine.stop()
            self._stopped, self._engine = self._engine, None
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._publisher is not None:
            await self._publisher.close()
            self._publisher = self._announcer = None
        if self._opened:
            await self._engine_pool.close()
        self._engine_pool = self._new_pool()
        self._opened = False
        self._started = False

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def threads_running(self) -> int:
        """Sync handler threads still running (after a stop, those that outlived it)."""
        engine = self._engine or self._stopped
        return engine.threads_running if engine is not None else 0

    def hurry(self) -> None:
        """Cut short the grace period of a stop in progress (a second SIGTERM)."""
        if self._engine is not None:
            self._engine.hurry()

    @property
    def listening(self) -> bool:
        """True while the LISTEN connection is up."""
        return self._listener is not None and self._listener.connected.is_set()

    @property
    def engine(self) -> Engine | None:
        """The running engine (worker and background passes), if started with handlers."""
        return self._engine

    @property
    def worker(self) -> Worker | None:
        """The running worker, if started with handlers."""
        return self._engine.worker if self._engine is not None else None

    @property
    def sweeper(self) -> Sweeper | None:
        """The recovery sweep, while started with handlers."""
        return self._engine.sweeper if self._engine is not None else None

    @property
    def wait_scanner(self) -> WaitScanner | None:
        """The timer, signal and deadline scanner, while started with handlers."""
        return self._engine.wait_scanner if self._engine is not None else None

    @property
    def schedule_scanner(self) -> ScheduleScanner | None:
        """The schedule scanner, while started with handlers."""
        return self._engine.schedule_scanner if self._engine is not None else None

    @property
    def purger(self) -> Purger | None:
        """The retention purge, while started with handlers and a ``purge_interval``."""
        return self._engine.purger if self._engine is not None else None

    # -- wakeups -------------------------------------------------------------------

    def _on_available(self, queue: str | None) -> None:
        if self._engine is not None:
            self._engine.wake(queue)

    def _on_run_done(self, run_ids: list[int]) -> None:
        for run_id in run_ids:
            for event in self._waiters.get(run_id, ()):
                event.set()

    def _on_listen_connect(self) -> None:
        self._on_available(None)
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        """Every pending wait reads its run again: run-done notifications sent before
        the listener's LISTEN (a reconnect, or the first wait in a while) were not heard."""
        for events in self._waiters.values():
            for event in events:
                event.set()

    def _watch_runs(self) -> None:
        """LISTEN on ``cyclone_run_done`` while a wait is pending (notify.Listener)."""
        if self._listener is not None:
            self._listener.want_run_done(bool(self._waiters))

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

    # -- producers -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for a producer or inspection call: the pool passed in, else the
        engine pool."""
        await self._open()
        async with borrow_async(self._user_pool or self._engine_pool, self.settings) as conn:
            yield conn

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

    # -- inspection and control ----------------------------------------------------

    async def get_run(self, run: RunRef) -> Run:
        """The run with its result and error.

        Raises:
            NotFoundError: no run has that id.
        """
        run_id = run_id_of(run)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.runs_get, {"run_id": run_id}))
        if not rows:
            raise NotFoundError(f"run {run_id} does not exist")
        return Run.from_row(rows[0])

    async def list_runs(
        self,
        state: RunState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[Run]:
        """Runs, newest first; ``before`` pages below a run id.

        Raises:
            ValidationError: an unknown state or a bad limit.
        """
        params = list_runs_params(state, workflow, limit, before)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.runs_list, params))
        return [Run.from_row(row) for row in rows]

    async def list_steps(self, run: RunRef) -> list[Step]:
        """Every step of a run, in insertion order (empty for an unknown run)."""
        run_id = run_id_of(run)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.steps_list, {"run_id": run_id}))
        return [Step.from_row(row) for row in rows]

    async def cancel(self, run: RunRef) -> None:
        """Cancel a running or paused run and its active steps.

        A step still in its handler learns it at its next heartbeat; its completion is
        then ignored.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is already completed, failed or cancelled.
        """
        await self._operate(cancel_plan(run_id_of(run)))

    async def pause(self, run: RunRef) -> None:
        """Pause a running run: no new step of it is claimed; running steps finish.

        Pending and available steps become ``paused``; waiting steps keep waiting, and
        their timeouts and the run's deadline move forward by the pause length at
        :meth:`resume`.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not running.
        """
        await self._operate(pause_plan(run_id_of(run)))

    async def resume(self, run: RunRef) -> None:
        """Resume a paused run (see :meth:`pause`).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not paused.
        """
        await self._operate(resume_plan(run_id_of(run)))

    async def retry(
        self, run: RunRef, node: str | None = None, *, deadline: Duration | None = None
    ) -> int:
        """Operator retry: reset the run's discarded and cancelled steps (all, or ``node``
        and those below it) and reopen the run.

        Each reset step has ``attempt`` and ``reclaims`` at 0 and no error; it is
        claimable again when its parents all completed, else pending. The run returns to
        ``running``; its deadline is cleared unless ``deadline`` (from now) is given. A
        reset child node reopens its child run (retried the same way).

        Returns:
            The number of steps reset.

        Raises:
            NotFoundError: no run has that id.
            StateError: nothing to retry, the run is paused, or (with ``node``) a
                discarded step outside the retried part would stay behind.
            ValidationError: a bad or unknown node, or a bad deadline.
        """
        if node is not None:
            check_text(node, "node")
        limit = seconds(deadline, "deadline")
        return await self._operate(retry_plan(run_id_of(run), node, limit))

    async def _operate(self, plan: Plan[Outcome[T]]) -> T:
        """Run an operator plan in one transaction; announce its outcome after the
        commit; its value."""
        async with self._engine_connection() as conn, conn.transaction():
            outcome = await run_plan_async(conn, plan)
        self._announce(outcome.wakeups, outcome.finished)
        return outcome.value

    def _announce(self, wakeups: Wakeups, finished: Iterable[int] = ()) -> None:
        """After a commit: wake for it (this client's engine, every listener)."""
        assert self._announcer is not None
        self._announcer.announce(wakeups, finished)

    # -- schedules, retention, monitoring ---------------------------------------

    async def create_schedule(
        self,
        id: str,
        target: KindTarget | Workflow,
        input: Any,
        cron: str,
        location: str = "Local",
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule that fires ``target`` with ``input`` at each slot.

        Args:
            id: the schedule's id (text, at most 256 bytes).
            target: a kind (handler or name) or a :class:`cyclone.Workflow`; a workflow
                schedule pins the workflow's current ``def_version``, and only a client
                that registers that definition fires it.
            input: the fired run's input, a JSON value.
            cron: five cron fields, six with a leading seconds field, or a macro
                (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``).
            location: an IANA time zone; ``"Local"`` is resolved to this machine's zone
                and stored.
            **options: for a kind: ``queue``, ``priority``, ``max_attempts``,
                ``timeout``, ``retention`` (default: the kind's, then the client's
                retention).

        Returns:
            The stored :class:`Schedule`; its first slot is the first after now.

        Raises:
            ValidationError: a bad id, cron expression, zone, input or option, or the
                id is taken; nothing is written.
            WorkflowError: an invalid workflow.
        """
        spec = self.config.schedule_spec(
            id, target, input, cron=cron, location=location, options=options
        )
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, create_plan(spec))
        return await self.get_schedule(spec.id)

    async def update_schedule(
        self,
        id: str,
        *,
        target: KindTarget | Workflow | None = None,
        input: Any = KEEP,
        cron: str | None = None,
        location: str | None = None,
        **options: Any,
    ) -> Schedule:
        """Change a schedule; what is not given stays as stored.

        A new cron expression or zone starts at the first slot after now; a new
        workflow target pins that workflow's current definition. The failure count and
        back-off are cleared.

        Raises:
            NotFoundError: no schedule has that id.
            ValidationError, WorkflowError: as :meth:`create_schedule`; nothing is
                written. An option given as ``None`` keeps its stored value.
        """
        rebuild = self.config.schedule_rebuild(
            target=target, input=input, cron=cron, location=location, options=options
        )
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, update_plan(check_text(id, "schedule id"), rebuild))
        return await self.get_schedule(id)

    async def enable_schedule(self, id: str) -> Schedule:
        """Let scanners fire the schedule again, from its next slot after now.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return await self._set_enabled(id, True)

    async def disable_schedule(self, id: str) -> Schedule:
        """Stop firing the schedule (its definition and history stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        return await self._set_enabled(id, False)

    async def _set_enabled(self, id: str, enabled: bool) -> Schedule:
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, set_enabled_plan(check_text(id, "schedule id"), enabled))
        return await self.get_schedule(id)

    async def delete_schedule(self, id: str) -> None:
        """Delete the schedule and its fire records (the fired runs stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        async with self._engine_connection() as conn:
            stmt = Stmt(Q.schedules_delete, {"id": check_text(id, "schedule id")})
            if not await fetch_async(conn, stmt):
                raise NotFoundError(f"schedule {id!r} does not exist")

    async def get_schedule(self, id: str) -> Schedule:
        """The schedule with that id.

        Raises:
            NotFoundError: no schedule has that id.
        """
        async with self._engine_connection() as conn:
            stmt = Stmt(Q.schedules_list, {"id": check_text(id, "schedule id")})
            rows = await fetch_dicts_async(conn, stmt)
        if not rows:
            raise NotFoundError(f"schedule {id!r} does not exist")
        return Schedule.from_row(rows[0])

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule, by id."""
        async with self._engine_connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.schedules_list, {"id": None}))
        return [Schedule.from_row(row) for row in rows]

    async def purge(self, older_than: Duration | None = None) -> int:
        """Delete terminal runs past their retention now, in batches; how many went.

        Args:
            older_than: ``timedelta`` or seconds; given, every terminal run that
                finished at least that long ago goes, whatever its retention.

        Returns:
            The number of runs deleted (their steps, deps, signals and fires with them).

        Raises:
            ValidationError: a negative ``older_than``.
        """
        limit = seconds(older_than, "older_than", allow_zero=True)
        async with self._engine_connection() as conn:
            return await purge_async(conn, limit)

    async def stats(self) -> dict[str, QueueStats]:
        """Depth and age of every queue with unfinished work (``cyclone_v_queues``).

        Returns:
            queue name -> :class:`QueueStats` (available, running and waiting counts,
            seconds since the oldest claimable step became due, expired leases).
        """
        async with self._engine_connection() as conn:
            return {q.queue: q for q in await queue_stats_async(conn)}

    @contextlib.asynccontextmanager
    async def _engine_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """An engine connection (autocommit, READ COMMITTED), whatever pool was given."""
        await self._open()
        async with borrow_async(self._engine_pool, self.settings) as conn:
            yield conn

    async def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:  # noqa: ASYNC109
        """Block until the run is terminal; the terminal :class:`Run`.

        Wakes on ``cyclone_run_done`` when LISTEN is available, and polls every
        ``poll_interval`` in any case; a database that goes away meanwhile (a restart)
        is waited for too. The client's listener LISTENs on that channel only while a
        wait is pending; the run is read again once the LISTEN is in place, so a run
        that ends meanwhile is not missed.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: a bad run reference or timeout.
            WaitTimeout: not terminal within ``timeout`` seconds.
        """
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        await self._open()
        self._ensure_listener()
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else loop.time() + limit
        event = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(event)
        self._watch_runs()
        try:
            while True:
                event.clear()
                try:
                    current: Run | None = await self.get_run(run_id)
                except psycopg.OperationalError as exc:  # a restart: keep waiting
                    log.info("wait for run %d: database unreachable, retrying: %s", run_id, exc)
                    current = None
                if current is not None and current.terminal:
                    return current
                pause = self.poll_interval
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        state = current.state.value if current else "unknown"
                        raise WaitTimeout(f"run {run_id} is still {state} after {limit} s")
                    pause = min(pause, remaining)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await event.wait()
        finally:
            events = self._waiters.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[run_id]
            self._watch_runs()


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


def _split_handler_pools(
    budget: int, handlers: list[Handler], max_connections: int
) -> tuple[int, int]:
    """(async pool size, sync pool size) for completion transactions, summing to ``budget``.

    With both flavours, each gets a share in proportion to its number of kinds, at
    least one connection each.

    Raises:
        PoolTooSmallError: both flavours registered and fewer than two connections left.
    """
    n_sync = sum(1 for h in handlers if not h.is_async)
    n_async = len(handlers) - n_sync
    if not (n_sync and n_async):
        return (budget if n_async else 0, budget if n_sync else 0)
    if budget < 2:
        raise PoolTooSmallError(
            f"max_connections={max_connections} leaves {budget} connection(s) for completion "
            f"transactions; sync and async kinds need at least {ENGINE_RESERVE + 2}"
        )
    sync_size = min(budget - 1, max(1, round(budget * n_sync / len(handlers))))
    return budget - sync_size, sync_size
