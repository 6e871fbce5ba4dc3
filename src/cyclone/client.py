"""``Client`` (asyncio): producer and inspection calls, and the engine when started.

A client built with handlers runs an engine when started
(``async with client:``, :class:`cyclone.engine.Engine`): one claim loop per queue, the
recovery sweep and the other background passes; the client itself keeps the producer
and inspection calls, the publisher and the LISTEN connection. A client with no
handlers never claims or scans; it only enqueues and inspects. Connections
(docs/design.md, Connections and pools; docs/decisions.md, Connections):

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
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import timedelta
from typing import Any, Self, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.calls.async_shell import AsyncShell
from cyclone.calls.producers import ProducerCalls
from cyclone.calls.queues import QueueCalls
from cyclone.calls.runs import RunCalls
from cyclone.calls.schedules import ScheduleCalls
from cyclone.config import ClientConfig
from cyclone.connections import (
    DEFAULT_TCP_USER_TIMEOUT,
    borrow_async,
    client_connections,
    connect_failure,
)
from cyclone.engine import LEASE_CONNECTIONS, Engine, EnginePart, EngineSettings
from cyclone.errors import (
    StateError,
    ValidationError,
)
from cyclone.handlers import Handler
from cyclone.migrate import check_schema_async, migrate_async
from cyclone.notify import Listener, ListenerHooks, Publisher
from cyclone.observability.hooks import Observers
from cyclone.options import DAY, HOUR, Duration, check_int, seconds
from cyclone.scanners.purge import Purger
from cyclone.scanners.schedules import ScheduleScanner
from cyclone.scanners.sweep import Sweeper
from cyclone.scanners.waits import WaitScanner
from cyclone.schedules import CatchUp
from cyclone.sizing import DEFAULT_SLOTS, ENGINE_RESERVE, MAX_SLOTS, size_client
from cyclone.wakeups import Announcer, Wakeups
from cyclone.worker import MAX_CLAIM_BATCH, Worker, WorkerSettings
from cyclone.workflow import Workflow

__all__ = ["ENGINE_RESERVE", "LEASE_CONNECTIONS", "MAX_SLOTS", "Client"]

T = TypeVar("T")


def _owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Client(AsyncShell, ProducerCalls, RunCalls, ScheduleCalls, QueueCalls):
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
        self._user_pool, base, self.settings = client_connections(
            conninfo,
            AsyncConnectionPool,
            "Client",
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
        self.observers = Observers()
        """What this client's engine reports its steps to (metrics are one
        :class:`cyclone.observability.Observer`; add them before :meth:`start`)."""

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
        sizes = size_client(queues, list(self.config.handlers.values()), *self._given_sizes)
        self.queues, self.tx_slots = sizes.queues, sizes.tx_slots
        self.max_connections, self._pool_sizes = sizes.max_connections, sizes.pool_sizes

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
            observers=self.observers,
        )
        await self._engine.start(listen=self._ensure_listener)

    def _ensure_listener(self) -> None:
        if self._listener is None and self.config.notify and self.settings.can_listen:
            hooks = ListenerHooks(
                on_available=self._on_available,
                on_run_done=self._on_run_done,
                on_connect=self._on_listen_connect,
                on_run_done_listen=self._wake_waiters,
            )
            conninfo = self.settings.conninfo_for("cyclone-listen")
            self._listener = Listener(conninfo, hooks, available=bool(self.config.handlers))
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

    worker = EnginePart[Worker]("The running worker, if started with handlers.")
    sweeper = EnginePart[Sweeper]("The recovery sweep, while started with handlers.")
    wait_scanner = EnginePart[WaitScanner](
        "The timer, signal, deadline, fan-out and child-run scanner, while started with handlers."
    )
    schedule_scanner = EnginePart[ScheduleScanner](
        "The schedule scanner, while started with handlers."
    )
    purger = EnginePart[Purger](
        "The retention purge, while started with handlers and a ``purge_interval``."
    )

    # -- wakeups -------------------------------------------------------------------

    def _on_available(self, queue: str | None) -> None:
        if self._engine is not None:
            self._engine.wake(queue)

    def _on_listen_connect(self) -> None:
        self._on_available(None)
        self._wake_waiters()

    # -- producers -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection for a producer or inspection call: the pool passed in, else the
        engine pool."""
        await self._open()
        async with borrow_async(self._user_pool or self._engine_pool, self.settings) as conn:
            yield conn

    # -- inspection and control ----------------------------------------------------

    def _announce(self, wakeups: Wakeups, finished: Iterable[int] = ()) -> None:
        """After a commit: wake for it (this client's engine, every listener)."""
        assert self._announcer is not None
        self._announcer.announce(wakeups, finished)

    # -- schedules, retention, monitoring ---------------------------------------

    @contextlib.asynccontextmanager
    async def _engine_connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """An engine connection (autocommit, READ COMMITTED), whatever pool was given."""
        await self._open()
        async with borrow_async(self._engine_pool, self.settings) as conn:
            yield conn
