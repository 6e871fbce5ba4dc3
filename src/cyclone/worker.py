"""The worker: claim loops, handler execution, heartbeats, completion, shutdown.

Each queue has its own claim loop and number of slots. A loop claims as many steps as
it has free slots (up to ``claim_batch``) in one statement (:mod:`cyclone.claims`),
runs each handler in its own task, renews every held lease from one heartbeat ticker
(:mod:`cyclone.heartbeats`: one statement a tick for all the leases due), and records
the outcome with a CAS on state, owner and lease generation:

* output without a completion transaction: handed to the completer, which completes
  many steps in one transaction (each row keeps its own CAS);
* with ``ctx.completion_tx()``: completed inside that transaction, alone;
* an exception: retried with backoff, or discarded (and the run failed fast).

A claim that errors does not stop its loop; polling at ``poll_interval`` is the floor
and a ``cyclone_available`` wakeup for the queue cuts the wait short.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from cyclone.dbio import Stmt, batch_async, batch_sync, fetch_async
from cyclone.errors import Discard, StepInterrupted
from cyclone.graph import Advanced, parse_advanced
from cyclone.handlers import Handler
from cyclone.heartbeats import Heartbeats
from cyclone.payloads import encode_json
from cyclone.producer import EnqueueRequest
from cyclone.retry import WRITE_RETRIES, error_backoff
from cyclone.sql import CLAIM_LIMITS, claim_limit
from cyclone.transitions import (
    FAILURE_CAS,
    Claimed,
    Failure,
    complete_stmts,
    decide_failure,
    failure_stmts,
    release_stmt,
)
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
class _Held:
    """A step this worker holds, from claim until its outcome is written."""

    step: Claimed
    ctx: Context
    task: asyncio.Task[None] | None = None
    in_handler: bool = False
    completing: bool = False  # the handler returned; its outcome is being written
    lost: bool = False  # a heartbeat found the lease gone
    released: bool = False  # given back at shutdown
    finished: bool = False  # its outcome is written (or given up)


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
    ) -> None:
        self.settings = settings
        self._build_submit = build_submit
        self._handlers = dict(handlers)
        self._claimer = Claimer(
            owner=settings.owner,
            lease_ttl=settings.lease_ttl,
            handlers=self._handlers,
            lease_pool=lease_pool,
            workflows=workflows or {},
            parents=parents,
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
        self._held: dict[tuple[int, str], _Held] = {}  # by (step id, lease owner)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._completer = Completer(
            pool,
            batch=min(MAX_BATCH, max(10, settings.claim_cap)),
            announcer=announcer,
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
            await self._release([held.step for held in leftover])
            for held in leftover:
                if held.task is not None and self._handlers[held.step.kind].is_async:
                    held.task.cancel()
            if self._tasks:
                await asyncio.wait(set(self._tasks), timeout=1.0)
        await self._completer.close()
        await self.heartbeats.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _release(self, steps: list[Claimed], why: str = "at shutdown") -> None:
        try:
            async with self._pool.connection() as conn:
                rows = await fetch_async(conn, release_stmt(steps))
            self._announcer.announce(Wakeups.of_queues(row[1] for row in rows))
            log.info("released %d held steps %s", len(rows), why)
        except Exception as exc:
            log.warning(
                "releasing %d steps failed; the sweep will reclaim them: %s", len(steps), exc
            )

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
                claimed = await self._claim(queue, limit)
                failures = 0
            except Exception as exc:
                failures += 1
                self.claim_errors += 1
                log.warning("claim in queue %r failed (attempt %d): %s", queue.name, failures, exc)
                await self._wait_wake(queue, error_backoff(failures))
                continue
            if claimed:
                self._schedule_heartbeats([self._dispatch(queue, step) for step in claimed])
            if len(claimed) < limit:
                await self._wait_wake(queue, settings.poll_interval)

    async def _wait_wake(self, queue: _Queue, limit: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await queue.wake.wait()

    async def _claim(self, queue: _Queue, limit: int) -> list[Claimed]:
        return await self._claimer.claim(queue.name, limit, release=self._release)

    # -- running a step ------------------------------------------------------------

    def _dispatch(self, queue: _Queue, step: Claimed) -> _Held:
        """Start the handler of a claimed step in its own task; the step as held."""
        handler = self._handlers[step.kind]
        tx = CompletionTx(
            self._slots,
            self._async_tx_pool,
            self._sync_tx_pool,
            pinned=self.settings.pinned_search_path,
        )
        ctx = Context(
            run_id=step.run_id,
            step_id=step.id,
            node=step.node,
            kind=step.kind,
            workflow=step.workflow,
            queue=step.queue,
            attempt=step.attempt,
            max_attempts=step.max_attempts,
            lease_generation=step.generation,
            is_async=handler.is_async,
            tx=tx,
            build_request=self._build_request,
            build_submit=self._build_submit,
        )
        held = _Held(step, ctx)
        self._held[step.id, step.owner] = held
        queue.busy += 1
        run = self._execute_async if handler.is_async else self._execute_sync
        task = asyncio.create_task(self._execute(run(handler, held, tx), queue, held))
        held.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return held

    async def _execute(self, running: Awaitable[None], queue: _Queue, held: _Held) -> None:
        """Run a step to its written outcome, then free its slot."""
        try:
            await running
        except Exception:
            step = held.step
            log.exception("step %d (%s) outcome could not be recorded", step.id, step.kind)
        finally:
            held.finished = True
            self.heartbeats.drop(held.step)
            self._held.pop((held.step.id, held.step.owner), None)
            queue.busy -= 1
            queue.freed.set()

    async def _execute_async(self, handler: Handler, held: _Held, tx: CompletionTx) -> None:
        step, ctx = held.step, held.ctx
        failure: Failure | None = None
        output: str | None = None
        timeout_cm = asyncio.timeout(step.timeout) if step.timeout is not None else None
        held.in_handler = True
        try:
            try:
                if step.input_error is not None:
                    raise Discard(step.input_error)
                if timeout_cm is None:
                    value = await handler.fn(ctx, handler.codec.decode(step.input))
                else:
                    async with timeout_cm:
                        value = await handler.fn(ctx, handler.codec.decode(step.input))
                output = self._encode_output(handler, value)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not (held.lost or held.released) or task is None:
                    raise
                task.uncancel()
                why = "released at shutdown" if held.released else "lease lost"
                log.info("step %d (%s): %s, handler cancelled", step.id, step.kind, why)
                return
            except StepInterrupted as exc:
                if held.lost or held.released or ctx.cancelled:
                    log.info("step %d (%s): handler stopped, step not held", step.id, step.kind)
                    return
                failure = self._decide(handler, step, exc)
            except Exception as exc:
                timed_out = timeout_cm is not None and timeout_cm.expired()
                error: BaseException = (
                    TimeoutError(f"step exceeded its timeout of {step.timeout} s")
                    if timed_out
                    else exc
                )
                failure = self._decide(handler, step, error, "timeout" if timed_out else None)
            finally:
                held.in_handler = False
                held.completing = True
            if failure is not None:
                await tx.close_async(commit=False)
                await self._record_failure(held, failure)
            elif held.released or held.lost:
                return
            elif tx.opened:
                await self._complete_in_tx_async(handler, held, tx, output)
            else:
                await self._complete_batched(held, output)
        finally:
            await tx.close_async(commit=False)  # whatever happened: never leak a slot

    def _decide(
        self, handler: Handler, step: Claimed, exc: BaseException, kind: str | None = None
    ) -> Failure:
        return decide_failure(
            step, exc, retry=handler.retry, no_retry=handler.no_retry, error_kind=kind
        )

    async def _execute_sync(self, handler: Handler, held: _Held, tx: CompletionTx) -> None:
        step = held.step
        loop = asyncio.get_running_loop()
        self._threads_running += 1
        future = loop.run_in_executor(self._executor, self._run_sync_handler, handler, held, tx)
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
                    log.info("step %d (%s): completion transaction ended", step.id, step.kind)
            except Exception as error:  # the sweep and the CAS still fence the thread
                log.warning("step %d: ending its transaction failed: %s", step.id, error)
            exc = TimeoutError(f"step exceeded its timeout of {step.timeout} s")
            await self._record_failure(held, self._decide(handler, step, exc, "timeout"))
            result = await future
        if result is None:
            return
        kind, payload = result
        if kind == "completed":  # committed in its transaction, even if the timeout fired
            self._after_completion(held, *payload)
        elif timed_out:
            return
        elif kind == "failed":
            await self._record_failure(held, payload)
        elif kind == "output" and not (held.released or held.lost):
            await self._complete_batched(held, payload)

    def _thread_returned(self, _: object) -> None:
        self._threads_running -= 1

    def _run_sync_handler(
        self, handler: Handler, held: _Held, tx: CompletionTx
    ) -> tuple[str, Any] | None:
        """In a handler thread: run it, and complete in its completion tx if opened.

        Returns ``("output", json)`` for the completer, ``("completed", Advanced)``,
        ``("failed", Failure)``, or ``None`` when there is nothing to record.
        """
        step, ctx = held.step, held.ctx
        held.in_handler = True
        try:
            try:
                if step.input_error is not None:
                    raise Discard(step.input_error)
                value = handler.fn(ctx, handler.codec.decode(step.input))
                output = self._encode_output(handler, value)
            except StepInterrupted as exc:
                if held.lost or held.released or ctx.cancelled:
                    return None
                return "failed", self._decide(handler, step, exc)
            except Exception as exc:
                return "failed", self._decide(handler, step, exc)
            finally:
                held.in_handler = False
                held.completing = True
            if not tx.opened:
                return "output", output
            if held.released or held.lost or ctx.cancelled:
                return None
            assert tx.sync_conn is not None
            try:
                rows = batch_sync(tx.sync_conn, complete_stmts([(step, output)]), transaction=False)
                advanced = parse_advanced(rows[1:])
                if step.id not in advanced.done:
                    log.info("step %d (%s): stale completion rolled back", step.id, step.kind)
                    return None
                tx.close_sync(commit=True)
            except StepInterrupted:  # the engine ended the transaction: nothing committed
                log.info("step %d (%s): timed out before its commit", step.id, step.kind)
                return None
            except Exception as exc:
                log.warning(
                    "step %d (%s): completion transaction failed: %s", step.id, step.kind, exc
                )
                return "failed", self._decide(handler, step, exc)
            return "completed", advanced
        finally:
            tx.close_sync(commit=False)  # whatever happened: never leak a slot

    def _encode_output(self, handler: Handler, value: Any) -> str | None:
        if not handler.has_output:
            return None
        return encode_json(handler.codec.encode(value), f"output of kind {handler.kind!r}")

    async def _complete_in_tx_async(
        self, handler: Handler, held: _Held, tx: CompletionTx, output: str | None
    ) -> None:
        """Complete the step inside its completion transaction and commit both.

        A failure there (the completion statement, or the commit: a deferred constraint,
        a serialization failure, an error the handler swallowed) is a failed attempt.
        """
        step = held.step
        conn = tx.async_conn
        assert conn is not None
        try:
            rows = await batch_async(conn, complete_stmts([(step, output)]), transaction=False)
            advanced = parse_advanced(rows[1:])
            if step.id not in advanced.done:
                await tx.close_async(commit=False)
                log.info("step %d (%s): stale completion rolled back", step.id, step.kind)
                return
            await tx.close_async(commit=True)
        except Exception as exc:
            await tx.close_async(commit=False)
            log.warning("step %d (%s): completion transaction failed: %s", step.id, step.kind, exc)
            await self._record_failure(held, self._decide(handler, step, exc))
            return
        self._after_completion(held, advanced)

    async def _complete_batched(self, held: _Held, output: str | None) -> None:
        try:
            completed, _ = await self._completer.complete(held.step, output)
        except psycopg.OperationalError:
            raise  # the database is gone: the sweep will give the step back
        except Exception as exc:
            log.warning("step %d (%s): completion failed: %s", held.step.id, held.step.kind, exc)
            handler = self._handlers[held.step.kind]
            await self._record_failure(held, self._decide(handler, held.step, exc))
            return
        if not completed:
            log.info("step %d (%s): stale completion ignored", held.step.id, held.step.kind)
        # the completer announced finished runs after its commit

    def _after_completion(self, held: _Held, advanced: Advanced) -> None:
        """After the commit of a completion transaction: the wakeups its handler's
        ``*_tx`` calls recorded and the advance's, and the runs it finished (the step's
        run, child runs it cancelled)."""
        wakeups = advanced.wakeups | Wakeups.of_queues(held.ctx._wakeups)
        self._announcer.announce(wakeups, advanced.finished)

    async def _record_failure(self, held: _Held, failure: Failure) -> None:
        step = held.step
        stmts, transaction = failure_stmts(step, failure)
        rows = await self._write(stmts, transaction=transaction)
        if rows is None:
            return
        if failure.discard and step.has_children:  # child runs runs_cancel_children ended
            self._announcer.announce(Wakeups(), (row[1] for row in rows[-1]))
        if not rows[FAILURE_CAS[transaction]]:
            log.info("step %d (%s): stale failure ignored", step.id, step.kind)
            return
        if failure.discard:
            log.warning("step %d (%s) discarded: %s", step.id, step.kind, failure.error)
            self._announcer.announce(Wakeups(), (step.run_id,))  # after the commit
        else:
            # Nothing announces the end of a backoff: wake this queue then ourselves.
            asyncio.get_running_loop().call_later(failure.delay, self.wake, step.queue)
            log.info(
                "step %d (%s) failed attempt %d, retry in %.1f s: %s",
                step.id,
                step.kind,
                step.attempt + 1,
                failure.delay,
                failure.error,
            )

    async def _write(self, stmts: list[Stmt], *, transaction: bool) -> list[Any] | None:
        """Run engine statements with retries; ``None`` if they could not be written."""
        for attempt in range(WRITE_RETRIES):
            try:
                async with self._pool.connection() as conn:
                    return await batch_async(conn, stmts, transaction=transaction)
            except Exception as exc:
                log.warning("engine write failed (attempt %d): %s", attempt + 1, exc)
                await asyncio.sleep(error_backoff(attempt))
        return None

    # -- heartbeats ----------------------------------------------------------------

    def _schedule_heartbeats(self, helds: list[_Held]) -> None:
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
        log.info("step %d (%s): lease lost (reclaimed, cancelled or timed out)", step.id, step.kind)
        handler = self._handlers[step.kind]
        if handler.is_async and held.in_handler and held.task is not None:
            held.task.cancel()
