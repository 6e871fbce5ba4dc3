"""Running due steps inline, one at a time, in the calling task: :func:`drain` and
:func:`run_inline`.

:func:`drain` is a worker with one slot that never runs in the background. It builds
the engine's own parts on the client's connections (the claim of :mod:`cyclone.claims`,
the handler run of :mod:`cyclone.execute`, the completer, the wait scanner) and loops:

1. a full pass of the wait scanner (due timers, signal waits, signal timeouts, run
   deadlines, fan-out releases and completions, child runs started and settled);
2. one claim of one step, in the served queues by name order, the first that has one;
   its handler runs to its written outcome (completed; failed and retried later with
   its backoff; discarded; snoozed) before anything else happens;

until neither the pass nor the claim found anything. A retry or a snooze whose backoff
ends later is not due, and stays for a later drain (after :func:`advance_time`, for
example). The statements, transitions, leases and attempts are those of a worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool

from cyclone.client import Client
from cyclone.completion import TxSlots
from cyclone.errors import StateError, ValidationError
from cyclone.handlers import Handler
from cyclone.limits import store_limits
from cyclone.options import check_int
from cyclone.scanners.waits import ScanResult, WaitScanner
from cyclone.sql import claim_limit
from cyclone.transitions import Claimed
from cyclone.worker import Worker, WorkerSettings, _Queue
from cyclone.workflow import Workflow

if TYPE_CHECKING:
    from cyclone.records import Run
    from cyclone.wakeups import Announcer

__all__ = ["DEFAULT_MAX_STEPS", "drain", "run_inline"]

DEFAULT_MAX_STEPS = 10_000
"""Steps one :func:`drain` runs at most before it gives up (a loop that never ends)."""


def check_client(client: Any, what: str) -> Client:
    """``client`` if it is a :class:`cyclone.Client`.

    Raises:
        ValidationError: it is something else (a ``SyncClient`` included).
    """
    if not isinstance(client, Client):
        raise ValidationError(f"{what} needs a cyclone.Client (asyncio), got {client!r}")
    return client


async def _opened(client: Client) -> tuple[AsyncConnectionPool[Any], Announcer]:
    """The client's engine pool and announcer, its connections opened (what a started
    client's engine runs on; the client's own engine is not started)."""
    await client._open()
    announcer = client._announcer
    assert announcer is not None
    return client._engine_pool, announcer


class _Inline:
    """A one-slot worker run by hand: :meth:`claim_one`, then :meth:`run` or
    :meth:`give_back`; :meth:`scan` passes the wait scanner once."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._tx_pools: tuple[AsyncConnectionPool[Any] | None, ConnectionPool[Any] | None] = (
            None,
            None,
        )
        self.worker: Worker | None = None
        self.scanner: WaitScanner | None = None

    def _tx_options(self, is_async: bool) -> dict[str, Any]:
        connections = self._client.settings
        configure = connections.configure_async() if is_async else connections.configure_sync()
        return {
            "conninfo": connections.conninfo_for("cyclone-tx"),
            "min_size": 0,
            "max_size": 1,
            "kwargs": connections.kwargs(autocommit=False),
            "open": False,
            "name": "cyclone-tx-inline",
            "configure": configure,
        }

    async def open(self) -> None:
        client = self._client
        config = client.config
        pool, announcer = await _opened(client)
        self.scanner = WaitScanner(
            pool, announcer, interval=client.poll_interval, definitions=config.definitions
        )
        if not client.queues:
            return  # no kind registered: nothing to claim, the scanner still passes
        async_tx: AsyncConnectionPool[Any] = AsyncConnectionPool(**self._tx_options(True))
        self._tx_pools = (async_tx, None)
        await async_tx.open()
        if any(not h.is_async for h in config.handlers.values()):
            sync_tx: ConnectionPool[Any] = ConnectionPool(**self._tx_options(False))
            self._tx_pools = (async_tx, sync_tx)
            await asyncio.to_thread(sync_tx.open)
        owner = f"{client.owner}/inline"
        await store_limits(pool, config.handlers, owner)
        self.worker = Worker(
            WorkerSettings(
                owner=owner,
                queues=dict.fromkeys(client.queues, 1),
                lease_ttl=client.lease_ttl,
                poll_interval=client.poll_interval,
                claim_batch=1,
                shutdown_grace=0.0,
                pinned_search_path=client.settings.per_transaction,
            ),
            handlers=config.handlers,
            pool=pool,
            lease_pool=pool,
            slots=TxSlots(1, asyncio.get_running_loop()),
            tx_pools=self._tx_pools,
            announcer=announcer,
            build_request=config.request,
            build_submit=config.submit_request,
            workflows=config.workflows,
            parents=config.parents,
        )
        # The completer's flusher writes batched completions; no claim loop starts.
        self.worker._completer.start(flushers=1)

    async def scan(self) -> bool:
        """One full wait-scanner pass; whether it changed anything."""
        assert self.scanner is not None
        result = await self.scanner.scan_once()
        return any(getattr(result, f.name) for f in dataclasses.fields(ScanResult))

    async def claim_one(self) -> tuple[_Queue, Claimed] | None:
        """Claim one due step (the served queues in name order, the first that has
        one): its queue and the step; ``None`` when no served queue has a due step of
        a registered kind."""
        worker = self.worker
        if worker is None:
            return None
        for name in sorted(worker._queues):
            queue = worker._queues[name]
            claimed = await worker._claim(queue, claim_limit(1))
            if claimed:
                return queue, claimed[0]
        return None

    async def run(self, queue: _Queue, step: Claimed) -> None:
        """Run a claimed step's handler to its written outcome (as a worker does)."""
        worker = self.worker
        assert worker is not None
        held = worker._dispatch(queue, step)
        worker.heartbeats.hold([held.step])
        assert held.task is not None
        await held.task  # the outcome is written (or its failure logged) when it returns

    async def give_back(self, step: Claimed) -> None:
        """Give a claimed step back unrun (no attempt, no reclaim counted)."""
        worker = self.worker
        assert worker is not None
        await worker._release([step], "by drain at max_steps")

    async def close(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
        async_tx, sync_tx = self._tx_pools
        self._tx_pools = (None, None)
        if async_tx is not None:
            await async_tx.close()
        if sync_tx is not None:
            await asyncio.to_thread(sync_tx.close)


async def drain(client: Client, *, max_steps: int = DEFAULT_MAX_STEPS) -> int:
    """Run every due step of ``client``'s kinds inline until nothing is due.

    Deterministic: one step at a time, in the calling task, with no worker process and
    no background task left behind. The client must not be started with its own engine
    (``async with client`` on a client with handlers): build it with ``handlers=`` and
    ``workflows=`` and call this instead. Only the kinds and workflows the client
    registers run, in the queues it serves; schedules are not fired.

    Between steps the wait scanner passes, so fan-outs expand and collect, child runs
    start and settle, and due timers, signal timeouts and run deadlines take effect. A
    step that fails is retried only once its backoff has passed: move the clock with
    :func:`advance_time` and drain again.

    Args:
        client: a :class:`cyclone.Client` (not started) on a migrated database.
        max_steps: the most steps to run (1 or more, default 10,000).

    Returns:
        The number of steps run (handlers called, whatever their outcome).

    Raises:
        ValidationError: ``client`` is not a ``cyclone.Client``, or ``max_steps`` is not
            a positive integer.
        StateError: the client's own engine is running, or steps were still due after
            ``max_steps`` (a step that keeps enqueuing another, for example).
        ConfigurationError: the database is not migrated.
    """
    check_client(client, "drain")
    limit = check_int(max_steps, "max_steps", 1)
    if client.engine is not None:
        raise StateError(
            "drain runs steps inline, but this client's engine is running (the client "
            "was started with handlers); use a client that is not started"
        )
    inline = _Inline(client)
    ran = 0
    try:
        await inline.open()
        while True:
            changed = await inline.scan()
            claimed = await inline.claim_one()
            if claimed is None:
                if not changed:
                    return ran
                continue
            if ran >= limit:
                await inline.give_back(claimed[1])
                raise StateError(
                    f"drain ran max_steps={limit} steps and steps are still due "
                    "(a step that keeps enqueuing another?)"
                )
            await inline.run(*claimed)
            ran += 1
    finally:
        await inline.close()


def run_inline(
    workflow: Workflow | Handler,
    input: Any = None,
    *,
    dsn: str,
    handlers: Iterable[Handler] = (),
    workflows: Iterable[Workflow] = (),
    max_steps: int = DEFAULT_MAX_STEPS,
) -> Run:
    """Submit a new run of ``workflow`` (or enqueue a job of a kind) and run every
    step of it in this process, synchronously, with :func:`drain`.

    Runs its own event loop, so it cannot be called from a coroutine (use ``await
    drain(client)`` there).

    Args:
        workflow: a :class:`cyclone.Workflow`, or a kind (``@cyclone.step`` or
            ``@cyclone.action``) to enqueue as a job.
        input: the run's input (a JSON value, or what the kind's codec encodes).
        dsn: a libpq connection string of a migrated database.
        handlers, workflows: more kinds and workflows to register (kinds that steps
            enqueue, workflows of child nodes).
        max_steps: as for :func:`drain`.

    Returns:
        The run as it stands once nothing is due: finished (completed, failed or
        cancelled), or still ``running`` when it waits for a signal, a timer that is
        not due, or a retry whose backoff has not passed.

    Raises:
        StateError: called from a running event loop, or as :func:`drain` raises.
        ValidationError: ``workflow`` is neither a workflow nor a kind, or as
            ``submit``, ``enqueue`` and :func:`drain` raise.
        ConfigurationError: the database is not migrated.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise StateError(
            "run_inline runs its own event loop and cannot be called from a coroutine; "
            "use: await cyclone.testing.drain(client)"
        )
    check_int(max_steps, "max_steps", 1)
    if not isinstance(workflow, Workflow | Handler):
        raise ValidationError(f"run_inline needs a cyclone.Workflow or a kind, got {workflow!r}")
    kinds, flows = list(handlers), list(workflows)
    if isinstance(workflow, Workflow):
        flows.insert(0, workflow)
    else:
        kinds.insert(0, workflow)
    client = Client(dsn, handlers=kinds, workflows=flows)
    return asyncio.run(_run_inline(client, workflow, input, max_steps))


async def _run_inline(
    client: Client, target: Workflow | Handler, input: Any, max_steps: int
) -> Run:
    try:
        if isinstance(target, Workflow):
            run_id = (await client.submit(target, input)).run_id
        else:
            run_id = (await client.enqueue(target, input)).run_id
        await drain(client, max_steps=max_steps)
        return await client.get_run(run_id)
    finally:
        await client.stop()
