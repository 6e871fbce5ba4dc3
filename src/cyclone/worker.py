"""The worker: claim loops, handler execution, heartbeats, completion, shutdown.

Each queue has its own claim loop and number of slots. A loop claims as many steps as
it has free slots (up to ``claim_batch``) in one statement (:mod:`cyclone.claims`),
runs each handler in its own task, renews every held lease from one heartbeat ticker
(:mod:`cyclone.heartbeats`: one statement a tick for all the leases due), and records
the outcome with a CAS on state, owner and lease generation:

* output without a completion transaction: handed to the completer, which completes
  many steps in one transaction (each row keeps its own CAS);
* with ``ctx.completion_tx()``: completed inside that transaction, alone;
* an exception: retried with backoff, or discarded (and the run failed fast);
* a ``Snooze``: given back for later with no attempt counted (:mod:`cyclone.snoozing`).

A claim that errors does not stop its loop; polling at ``poll_interval`` is the floor
and a ``cyclone_available`` wakeup for the queue cuts the wait short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.claims import Claimer
from cyclone.completer import MAX_BATCH, Completer
from cyclone.completion import CompletionTx, TxSlots
from cyclone.context import Context
from cyclone.dbio import batch_async, fetch_async
from cyclone.execute import Held, failure_of, run_async_handler, run_sync_handler
from cyclone.graph import Advanced, parse_advanced
from cyclone.handlers import Handler
from cyclone.heartbeats import Heartbeats
from cyclone.observability.hooks import Observers
from cyclone.observability.logs import step_log
from cyclone.observability.tracing import enabled as tracing_enabled
from cyclone.observability.tracing import engine_span, record_span, step_span
from cyclone.producer import EnqueueRequest
from cyclone.retry import error_backoff
from cyclone.snoozing import Snoozed
from cyclone.sql import CLAIM_LIMITS, claim_limit
from cyclone.transitions import Claimed, Failure, complete_stmts, release_stmt
from cyclone.wakeups import Announcer, Wakeups

__all__ = ["MAX_CLAIM_BATCH", "Worker", "WorkerSettings"]

log = logging.getLogger("cyclone.worker")

MAX_CLAIM_BATCH = CLAIM_LIMITS[-1]
"""Most steps one claim statement takes, whatever the free slots (and the highest
``claim_batch`` a client accepts): a queue with more free slots claims again at once."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """Settings of a worker (all durations in seconds).

    ``claim_batch``: most steps one claim takes; ``None``: as many as the queue has free
    slots (at most :data:`MAX_CLAIM_BATCH` either way).
    """

    owner: str
    queues: Mapping[str, int]
    lease_ttl: float
    poll_interval: float
    claim_batch: int | None
    shutdown_grace: float
    pinned_search_path: bool = False

    @property
    def claim_cap(self) -> int:
        """The most steps one claim statement takes."""
        return min(self.claim_batch or MAX_CLAIM_BATCH, MAX_CLAIM_BATCH)


@dataclass(slots=True, eq=False)
class _Queue:
    name: str
    slots: int
    busy: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    freed: asyncio.Event = field(default_factory=asyncio.Event)


class Worker:
    """Claims and runs the steps of the registered kinds in the configured queues."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        handlers: Mapping[str, Handler],
        pool: AsyncConnectionPool[Any],
        lease_pool: AsyncConnectionPool[Any],
        slots: TxSlots,
        tx_pools: tuple[Any, Any],
        announcer: Announcer,
        build_request: Callable[..., EnqueueRequest],
        build_submit: Callable[..., Any] | None = None,
        workflows: Mapping[str, list[str]] | None = None,
        parents: Collection[str] = (),
        observers: Observers | None = None,
    ) -> None:
        self.settings = settings
        self._observers = observers if observers is not None else Observers()
        self._build_submit = build_submit
        self._handlers = dict(handlers)
        self._claimer = Claimer(
            owner=settings.owner,
            lease_ttl=settings.lease_ttl,
            handlers=self._handlers,
            lease_pool=lease_pool,
            workflows=workflows or {},
            parents=parents,
            measure=self._measuring,
        )
        self.outputs = self._claimer.outputs
        """Upstream outputs read to assemble data-edge inputs (the claimer's cache)."""
        self._pool = pool
        self._lease_pool = lease_pool
        self._slots = slots
        self._async_tx_pool, self._sync_tx_pool = tx_pools
        self._announcer = announcer
        self._build_request = build_request
        self._queues = {name: _Queue(name, n) for name, n in settings.queues.items()}
        self._held: dict[tuple[int, str], Held] = {}  # by (step id, lease owner)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._completer = Completer(
            pool,
            batch=min(MAX_BATCH, max(10, settings.claim_cap)),
            announcer=announcer,
            wake=self.wake,
        )
        total = sum(settings.queues.values())
        self._executor = ThreadPoolExecutor(max_workers=total, thread_name_prefix="cyclone-step")
        self._stopping = False
        self._hurry = asyncio.Event()
        self._threads_running = 0
        self.claims = 0
        """Claim statements run so far."""
        self.claim_errors = 0
        """Claim statements that failed so far."""
        self.heartbeats = Heartbeats(lease_pool, ttl=settings.lease_ttl, lost=self._lease_lost)
        """The lease renewals of the steps held (its counters tell what it sent)."""

    def _measuring(self) -> bool:
        """True when something reads steps' queue latency (observers or tracing)."""
        return bool(self._observers) or tracing_enabled()

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Start one claim loop per queue and the completer."""
        self._completer.start(flushers=2)
        for queue in self._queues.values():
            task = asyncio.create_task(self._claim_loop(queue), name=f"cyclone-claim-{queue.name}")
            self._loops.append(task)

    def wake(self, queue: str | None) -> None:
        """A wakeup for ``queue`` (``None``: every queue); others are ignored."""
        if queue is None:
            for q in self._queues.values():
                q.wake.set()
        elif (target := self._queues.get(queue)) is not None:
            target.wake.set()

    @property
    def held(self) -> int:
        """Steps held right now."""
        return len(self._held)

    @property
    def load(self) -> dict[str, tuple[int, int]]:
        """Per served queue, ``(slots, busy)``: its slots and those running a step now."""
        return {q.name: (q.slots, q.busy) for q in self._queues.values()}

    @property
    def completion_tx_open(self) -> int:
        """Completion transactions open right now (slots of ``tx_slots`` taken)."""
        return self._slots.size - self._slots.free

    def hurry(self) -> None:
        """Cut the grace period of a stop in progress short: release what is held now."""
        self._hurry.set()

    @property
    def threads_running(self) -> int:
        """Sync handlers whose thread has not returned (they cannot be stopped)."""
        return self._threads_running

    async def stop(self) -> None:
        """Stop claiming, let handlers finish within the grace period, release the rest.

        Steps still running after ``shutdown_grace`` seconds (or at :meth:`hurry`) are
        given back with no attempt and no reclaim counted; an async handler is
        cancelled, a sync handler's thread cannot be, and its late completion is fenced
        by the lease generation (see :attr:`threads_running`).
        """
        self._stopping = True
        for queue in self._queues.values():
            queue.wake.set()
            queue.freed.set()
        # Loops finish their claim in flight (and dispatch what it returned) and exit.
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._tasks and not self._hurry.is_set():
            all_done = asyncio.ensure_future(asyncio.wait(set(self._tasks)))
            hurried = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait(
                {all_done, hurried},
                timeout=self.settings.shutdown_grace,
                return_when=asyncio.FIRST_COMPLETED,
            )
            all_done.cancel()
            hurried.cancel()
        leftover = [held for held in self._held.values() if not held.released]
        if leftover:
            for held in leftover:
                held.released = True
                held.ctx._cancelled = True
                self.heartbeats.drop(held.step)
            released = await self._release([held.step for held in leftover])
            for held in leftover:
                if held.step.id in released:
                    held.outcome = "released"  # a write that came first keeps its outcome
                if held.task is not None and self._handlers[held.step.kind].is_async:
                    held.task.cancel()
                elif held.step.id in released:
                    held.report(self._observers)  # its thread may outlive the process
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=1.0)
        await self._completer.close()
        await self.heartbeats.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _release(self, steps: list[Claimed], why: str = "at shutdown") -> set[int]:
        """Give ``steps`` back (no attempt, no reclaim counted); the ids given back (a
        step whose outcome was written first is not)."""
        try:
            async with self._pool.connection() as conn:
                rows = await fetch_async(conn, release_stmt(steps))
            self._announcer.announce(Wakeups.of_queues(row.queue for row in rows))
            released = {row.id for row in rows}
            for step in steps:
                if step.id in released:
                    step_log(log, step).info("released %s", why)
            return released
        except Exception as exc:
            log.warning(
                "releasing %d steps failed; the sweep will reclaim them: %s (steps %s)",
                len(steps),
                exc,
                ", ".join(f"run {s.run_id} step {s.id}" for s in steps),
            )
            return set()

    # -- claiming ------------------------------------------------------------------

    async def _claim_loop(self, queue: _Queue) -> None:
        failures = 0
        settings = self.settings
        while not self._stopping:
            free = queue.slots - queue.busy
            if free <= 0:
                queue.freed.clear()
                await queue.freed.wait()
                continue
            limit = claim_limit(min(free, settings.claim_cap))
            queue.wake.clear()
            try:
                self.claims += 1
                started_ns = time.time_ns()
                claimed = await self._claim(queue, limit)
                failures = 0
            except Exception as exc:
                failures += 1
                self.claim_errors += 1
                log.warning("claim in queue %r failed (attempt %d): %s", queue.name, failures, exc)
                await self._wait_wake(queue, error_backoff(failures))
                continue
            if claimed:
                attributes = {"cyclone.queue": queue.name, "cyclone.claimed": len(claimed)}
                record_span(f"cyclone.claim {queue.name}", started_ns, attributes)
                self._schedule_heartbeats([self._dispatch(queue, step) for step in claimed])
            # A limit held steps back: claim again at once (the next claim passes the
            # groups now full); short of them, rate-limited kinds look at their window.
            if len(claimed) < limit and not (
                claimed and self._claimer.waits_for_places(queue.name)
            ):
                await self._wait_wake(queue, min(settings.poll_interval, self._claimer.rate_window))

    async def _wait_wake(self, queue: _Queue, limit: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await queue.wake.wait()

    async def _claim(self, queue: _Queue, limit: int) -> list[Claimed]:
        return await self._claimer.claim(queue.name, limit, release=self._release)

    # -- running a step ------------------------------------------------------------

    def _dispatch(self, queue: _Queue, step: Claimed) -> Held:
        """Start the handler of a claimed step in its own task; the step as held."""
        handler = self._handlers[step.kind]
        tx = CompletionTx(
            self._slots,
            self._async_tx_pool,
            self._sync_tx_pool,
            pinned=self.settings.pinned_search_path,
        )
        ctx = Context(
            step,
            is_async=handler.is_async,
            tx=tx,
            build_request=self._build_request,
            build_submit=self._build_submit,
        )
        held = Held(step, ctx, step_span(step))
        if self._observers:
            self._observers.step_claimed(step)
        self._held[step.id, step.owner] = held
        queue.busy += 1
        run = self._execute_async if handler.is_async else self._execute_sync
        task = asyncio.create_task(self._execute(run(handler, held, tx), queue, held))
        held.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return held

    async def _execute(self, running: Awaitable[None], queue: _Queue, held: Held) -> None:
        """Run a step to its written outcome, then free its slot."""
        try:
            await running
        except Exception as exc:
            held.log.exception("outcome could not be recorded")
            held.error = held.error or exc
        finally:
            held.finished = True
            self.heartbeats.drop(held.step)
            self._held.pop((held.step.id, held.step.owner), None)
            queue.busy -= 1
            queue.freed.set()
            if self._claimer.waits_for_places(queue.name):  # a place is free: claim
                queue.wake.set()
                self._announcer.announce(Wakeups.of_queues([queue.name]))
            held.report(self._observers)

    async def _execute_async(self, handler: Handler, held: Held, tx: CompletionTx) -> None:
        with held.active():
            await self._run_async(handler, held, tx)

    async def _run_async(self, handler: Handler, held: Held, tx: CompletionTx) -> None:
        try:
            outcome = await run_async_handler(handler, held)
            if outcome is None:
                return
            if outcome.dropped:
                held.log.info("handler stopped, step not held")
            elif outcome.failure is not None:
                await tx.close_async(commit=False)
                await self._record_failure(held, outcome.failure)
            elif held.gone:
                return
            elif tx.opened:
                await self._complete_in_tx_async(handler, held, tx, outcome.output)
            else:
                await self._complete_batched(held, outcome.output)
        finally:
            await tx.close_async(commit=False)  # whatever happened: never leak a slot

    async def _execute_sync(self, handler: Handler, held: Held, tx: CompletionTx) -> None:
        step = held.step
        loop = asyncio.get_running_loop()
        self._threads_running += 1
        future = loop.run_in_executor(self._executor, run_sync_handler, handler, held, tx)
        future.add_done_callback(self._thread_returned)
        timed_out = False
        try:
            result = await asyncio.wait_for(asyncio.shield(future), step.timeout)
        except TimeoutError:
            # A thread cannot be killed: end its completion transaction from here (its
            # locks and xid go now, so the retry is not blocked behind them), then
            # record the timeout (the slot stays busy until the thread returns; its
            # late writes fail and its late completion is fenced by the CAS).
            timed_out = True
            held.ctx._cancelled = True
            try:
                if await tx.end_from_engine(self._pool):
                    held.log.info("completion transaction ended")
            except Exception as error:  # the sweep and the CAS still fence the thread
                held.log.warning("ending its transaction failed: %s", error)
            failure = failure_of(handler, step, TimeoutError(), timed_out=True)
            held.error = TimeoutError(failure.error)  # recorded on the span if it counted
            await self._record_failure(held, failure)
            result = await future
        if isinstance(result, Advanced):  # committed in its transaction, even if it timed out
            held.outcome = "completed"
            self._after_completion(held, result)
        elif result is None or timed_out:
            return
        elif result.failure is not None:
            await self._record_failure(held, result.failure)
        elif not held.gone:
            await self._complete_batched(held, result.output)

    def _thread_returned(self, _: object) -> None:
        self._threads_running -= 1

    async def _complete_in_tx_async(
        self, handler: Handler, held: Held, tx: CompletionTx, output: str | None
    ) -> None:
        """Complete the step inside its completion transaction and commit both.

        A failure there (the completion statement, or the commit: a deferred constraint,
        a serialization failure, an error the handler swallowed) is a failed attempt.
        """
        step = held.step
        conn = tx.async_conn
        assert conn is not None
        try:
            with engine_span("cyclone.completion_tx.commit", root=False):
                stmts = complete_stmts([(step, output)])
                results = await batch_async(conn, stmts, transaction=False)
                advanced = parse_advanced(results)
                if step.id not in advanced.done:
                    await tx.close_async(commit=False)
                    held.log.info("stale completion rolled back")
                    return
                await tx.close_async(commit=True)
        except Exception as exc:
            await tx.close_async(commit=False)
            held.log.warning("completion transaction failed: %s", exc)
            held.error = exc
            await self._record_failure(held, failure_of(handler, step, exc))
            return
        held.outcome = "completed"
        self._after_completion(held, advanced)

    async def _complete_batched(self, held: Held, output: str | None) -> None:
        try:
            completed, _ = await self._completer.complete(held.step, output)
        except psycopg.OperationalError:
            raise  # the database is gone: the sweep will give the step back
        except Exception as exc:
            held.log.warning("completion failed: %s", exc)
            held.error = exc
            handler = self._handlers[held.step.kind]
            await self._record_failure(held, failure_of(handler, held.step, exc))
            return
        if completed:
            held.outcome = "completed"
        else:
            held.log.info("stale completion ignored")
        # the completer announced finished runs after its commit

    def _after_completion(self, held: Held, advanced: Advanced) -> None:
        """After the commit of a completion transaction: the wakeups its handler's
        ``*_tx`` calls recorded and the advance's, and the runs it finished (the step's
        run, child runs it cancelled)."""
        wakeups = advanced.wakeups | Wakeups.of_queues(held.ctx._wakeups)
        self._announcer.announce(wakeups, advanced.finished)

    async def _record_failure(self, held: Held, failure: Failure | Snoozed) -> None:
        if isinstance(failure, Snoozed):  # released for later, or discarded at the limit
            held.outcome = await self._completer.snooze(held.step, failure, held.log)
        elif await self._completer.fail(held.step, failure, held.log):
            held.outcome = "discarded" if failure.discard else "failed"
            held.failure = failure.error

    # -- heartbeats ----------------------------------------------------------------

    def _schedule_heartbeats(self, helds: list[Held]) -> None:
        """Renew the leases of steps just claimed, the first time TTL/3 from now."""
        self.heartbeats.hold(held.step for held in helds)

    def _lease_lost(self, step: Claimed) -> None:
        """A heartbeat found the lease of ``step`` gone: tell the handler (``ctx.cancelled``)
        and cancel an async one still in its handler."""
        held = self._held.get((step.id, step.owner))
        if held is None or held.finished or held.released:
            return
        if held.completing:
            return  # the outcome being written ended the lease, or its CAS will tell
        held.lost = True
        held.ctx._cancelled = True
        held.log.info("lease lost (reclaimed, cancelled or timed out)")
        handler = self._handlers[step.kind]
        if handler.is_async and held.in_handler and held.task is not None:
            held.task.cancel()
