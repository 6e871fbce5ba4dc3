"""The engine of a started client with handlers: the worker and the background passes.

``Client`` is the façade: producer and inspection calls, on its engine pool (or the
pool passed in), its announcer (:mod:`cyclone.wakeups`) and its LISTEN connection.
When a client with handlers starts, it builds one :class:`Engine` on those and starts
it; the engine owns everything only a worker needs:

* the lease pool (claims and heartbeats, :data:`LEASE_CONNECTIONS` connections) and the
  handler pools for completion transactions (async and sync, sized by the client);
* the :class:`cyclone.worker.Worker` (one claim loop per served queue);
* the recovery sweep, the wait scanner (timers, signals, deadlines, fan-outs, child
  runs), the schedule scanner and, with a ``purge_interval``, the retention purge, each
  a task of its own.

:meth:`Engine.stop` drains the worker (its ``shutdown_grace``), lets the scanners finish
the pass they are in, and closes the pools the engine opened. An engine runs once: a
client that starts again builds a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar, overload

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from cyclone.completion import TxSlots
from cyclone.config import ClientConfig
from cyclone.connections import ConnectionSettings
from cyclone.limits import store_limits
from cyclone.observability.hooks import Observers
from cyclone.scanners.purge import Purger
from cyclone.scanners.schedules import ScheduleScanner
from cyclone.scanners.sweep import Sweeper
from cyclone.scanners.waits import WaitScanner
from cyclone.schedules import CatchUp
from cyclone.wakeups import Announcer
from cyclone.worker import Worker, WorkerSettings

__all__ = ["LEASE_CONNECTIONS", "Engine", "EnginePart", "EngineSettings"]

log = logging.getLogger("cyclone.engine")

LEASE_CONNECTIONS = 2
"""Connections of the lease pool (claims and heartbeats)."""

T = TypeVar("T")

_GRACEFUL = frozenset({"cyclone-waits", "cyclone-schedules", "cyclone-purge"})
"""Background tasks that stop() lets finish their pass instead of cancelling."""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What an engine runs with, checked by the client that builds it.

    Attributes:
        worker: the worker's settings (owner, queues, lease TTL, poll interval, claim
            batch, shutdown grace, pooler mode); the scanners share its owner and poll
            interval.
        sweep_interval: seconds between recovery sweeps.
        max_reclaims: reclaims after which the sweep discards a step.
        schedule_catch_up: ``"latest"`` or ``"all"`` missed schedule slots.
        purge_interval: seconds between retention purges (``None``: no purge task).
        tx_slots: completion transactions open at once.
        pool_sizes: (async, sync) handler pool sizes.
    """

    worker: WorkerSettings
    sweep_interval: float
    max_reclaims: int
    schedule_catch_up: CatchUp
    purge_interval: float | None
    tx_slots: int
    pool_sizes: tuple[int, int]


class Engine:
    """The worker, its pools and the background passes of one started client."""

    def __init__(
        self,
        settings: EngineSettings,
        *,
        config: ClientConfig,
        connections: ConnectionSettings,
        pool: AsyncConnectionPool[Any],
        announcer: Announcer,
        observers: Observers | None = None,
    ) -> None:
        self.settings = settings
        self._observers = observers if observers is not None else Observers()
        self._config = config
        self._connections = connections
        self._pool = pool
        self._announcer = announcer
        self._lease_pool = AsyncConnectionPool(
            connections.conninfo_for("cyclone-lease"),
            min_size=1,
            max_size=LEASE_CONNECTIONS,
            kwargs=connections.kwargs(autocommit=True),
            open=False,
            name="cyclone-lease",
            configure=connections.configure_async(),
        )
        self._async_tx_pool: AsyncConnectionPool[Any] | None = None
        self._sync_tx_pool: ConnectionPool[Any] | None = None
        self.worker: Worker | None = None
        """The worker, once started."""
        self.sweeper: Sweeper | None = None
        """The recovery sweep, while started."""
        self.wait_scanner: WaitScanner | None = None
        """The timer, signal, deadline, fan-out and child-run scanner, while started."""
        self.schedule_scanner: ScheduleScanner | None = None
        """The schedule scanner, while started."""
        self.purger: Purger | None = None
        """The retention purge, while started with a ``purge_interval``."""
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, listen: Callable[[], None]) -> None:
        """Open the engine's pools, build the worker, call ``listen`` (the client
        starts its LISTEN connection then, before the first claim), and start the claim
        loops and the background passes.

        Raises:
            psycopg_pool.PoolTimeout: a pool could not open (the caller stops the
                engine: nothing is left half started).
        """
        settings = self.settings
        await self._lease_pool.open(wait=True)
        async_size, sync_size = settings.pool_sizes
        if async_size:
            self._async_tx_pool = AsyncConnectionPool(**self._tx_pool_options(async_size, True))
            await self._async_tx_pool.open()
        if sync_size:
            self._sync_tx_pool = ConnectionPool(**self._tx_pool_options(sync_size, False))
            await asyncio.to_thread(self._sync_tx_pool.open)
        config = self._config
        await store_limits(self._lease_pool, config.handlers, settings.worker.owner)
        worker = Worker(
            settings.worker,
            handlers=config.handlers,
            pool=self._pool,
            lease_pool=self._lease_pool,
            slots=TxSlots(settings.tx_slots, asyncio.get_running_loop()),
            tx_pools=(self._async_tx_pool, self._sync_tx_pool),
            announcer=self._announcer,
            build_request=config.request,
            build_submit=config.submit_request,
            workflows=config.workflows,
            parents=config.parents,
            observers=self._observers,
        )
        self.worker = worker
        self._announcer.local = worker.wake
        listen()
        queues = settings.worker.queues
        for handler in config.handlers.values():
            if handler.options.queue not in queues:
                log.warning(
                    "kind %r defaults to queue %r, which this client does not serve "
                    "(queues %s): only its steps enqueued into a served queue will run here",
                    handler.kind,
                    handler.options.queue,
                    sorted(queues),
                )
        worker.start()
        self._start_scanners(worker)
        log.info(
            "client %s started: kinds %s, queues %s",
            settings.worker.owner,
            sorted(config.handlers),
            dict(queues),
        )

    def _tx_pool_options(self, size: int, is_async: bool) -> dict[str, Any]:
        """Options of a handler pool for completion transactions (not autocommit)."""
        connections = self._connections
        configure = connections.configure_async() if is_async else connections.configure_sync()
        return {
            "conninfo": connections.conninfo_for("cyclone-tx"),
            "min_size": 0,
            "max_size": size,
            "kwargs": connections.kwargs(autocommit=False),
            "open": False,
            "name": "cyclone-tx" if is_async else "cyclone-tx-sync",
            "configure": configure,
        }

    def _start_scanners(self, worker: Worker) -> None:
        settings, pool, announcer = self.settings, self._pool, self._announcer
        definitions = self._config.definitions
        self.sweeper = Sweeper(
            pool,
            announcer,
            interval=settings.sweep_interval,
            max_reclaims=settings.max_reclaims,
            observers=self._observers,
        )
        interval = settings.worker.poll_interval
        self._spawn(self.sweeper.run(), "cyclone-sweep")
        waits = WaitScanner(pool, announcer, interval=interval, definitions=definitions)
        self.wait_scanner = waits
        announcer.scanner = waits
        self._spawn(waits.run(), "cyclone-waits")
        self.schedule_scanner = ScheduleScanner(
            pool,
            announcer,
            owner=settings.worker.owner,
            interval=interval,
            definitions=definitions,
            catch_up=settings.schedule_catch_up,
        )
        self._spawn(self.schedule_scanner.run(), "cyclone-schedules")
        if settings.purge_interval is not None:
            self.purger = Purger(pool, interval=settings.purge_interval)
            self._spawn(self.purger.run(), "cyclone-purge")

    def _spawn(self, run: Any, name: str) -> None:
        self._tasks.append(asyncio.create_task(run, name=name))

    def wake(self, queue: str | None) -> None:
        """A ``cyclone_available`` wakeup for ``queue`` (``None``: every queue)."""
        if self.worker is not None:
            self.worker.wake(queue)

    def hurry(self) -> None:
        """Cut short the grace period of a stop in progress (a second SIGTERM)."""
        if self.worker is not None:
            self.worker.hurry()

    @property
    def threads_running(self) -> int:
        """Sync handler threads still running (after a stop, those that outlived it)."""
        return self.worker.threads_running if self.worker is not None else 0

    async def stop(self) -> None:
        """Drain the worker (``shutdown_grace``), stop the passes (each finishes the
        one it is in, for at most 10 s), and close the engine's pools. The worker stays
        readable for :attr:`threads_running`."""
        if self.worker is not None:
            await self.worker.stop()
        for scanner in (self.wait_scanner, self.schedule_scanner, self.purger):
            if scanner is not None:
                scanner.stop()
        graceful = [t for t in self._tasks if t.get_name() in _GRACEFUL]
        if graceful:
            await asyncio.wait(graceful, timeout=10)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.sweeper = self.wait_scanner = self.schedule_scanner = self.purger = None
        self._announcer.scanner = None
        self._announcer.local = None
        if self._async_tx_pool is not None:
            await self._async_tx_pool.close()
            self._async_tx_pool = None
        if self._sync_tx_pool is not None:
            await asyncio.to_thread(self._sync_tx_pool.close)
            self._sync_tx_pool = None
        await self._lease_pool.close()


class EnginePart(Generic[T]):
    """A client attribute that reads a part of the client's running engine (the
    attribute of :class:`Engine` with the same name), ``None`` while no engine runs.

    Args:
        doc: the attribute's docstring.
    """

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type[Any]) -> T | None: ...

    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self
        engine = obj.engine
        return None if engine is None else getattr(engine, self.name)
