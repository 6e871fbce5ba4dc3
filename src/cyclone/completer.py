"""Writing the outcomes of held steps: batched completions, and failures.

Completions of steps without ``completion_tx()`` are written many per transaction,
each row with its own CAS on state, owner and lease generation. A batch goes out as
soon as the previous one is written (up to two in flight), so a lone completion is not
delayed and a busy worker folds many into one transaction. A failed execution is a
retry (one CAS) or a discard (one transaction that resolves the run); a handler's
``Snooze`` is a snooze (one CAS) or, past the kind's ``max_snoozes``, a discard
(:mod:`cyclone.snoozing`). What they wake
and the runs they end go to the client's announcer after the commit, so a NOTIFY that
fails can never turn a committed outcome into a failed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Results, Stmt, batch_async
from cyclone.graph import parse_advanced
from cyclone.observability.hooks import Outcome
from cyclone.observability.logs import StepLog, step_log
from cyclone.observability.tracing import engine_span
from cyclone.retry import WRITE_RETRIES, error_backoff
from cyclone.snoozing import Snoozed, snooze_limit_applied, snooze_limit_stmts, snooze_stmt
from cyclone.sql import Q
from cyclone.transitions import (
    Claimed,
    Failure,
    complete_stmts,
    failure_applied,
    failure_stmts,
)
from cyclone.wakeups import NO_WAKEUPS, Announcer

__all__ = ["MAX_BATCH", "Completer"]

log = logging.getLogger("cyclone.worker")

MAX_BATCH = 300
"""Completions one transaction writes at most."""


class Completer:
    """Completes steps that have no completion transaction, many per transaction."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        batch: int,
        announcer: Announcer,
        wake: Callable[[str], None],
    ) -> None:
        self._pool = pool
        self._wake = wake  # this worker's claim loop of a queue
        self._announcer = announcer  # after the commit: wakeups, every run the batch ended
        self._batch = batch
        self._items: list[tuple[Claimed, str | None, asyncio.Future[tuple[bool, bool]]]] = []
        self._ready = asyncio.Event()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, flushers: int) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name=f"cyclone-completer-{i}") for i in range(flushers)
        ]

    async def close(self) -> None:
        """Wait until every requested completion is written, then stop."""
        await self._idle.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def complete(self, step: Claimed, output: str | None) -> tuple[bool, bool]:
        """Complete ``step``; (completed, run finished). False: a stale completion."""
        future: asyncio.Future[tuple[bool, bool]] = asyncio.get_running_loop().create_future()
        self._items.append((step, output, future))
        self._idle.clear()
        self._ready.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._ready.wait()
            batch, self._items = self._items[: self._batch], self._items[self._batch :]
            if not self._items:
                self._ready.clear()
            if batch:
                self._in_flight += 1
                try:
                    await self._flush(batch)
                finally:
                    self._in_flight -= 1
            if not self._items and not self._in_flight:
                self._idle.set()

    async def _flush(
        self, batch: list[tuple[Claimed, str | None, asyncio.Future[tuple[bool, bool]]]]
    ) -> None:
        stmts = complete_stmts([(step, output) for step, output, _ in batch])
        for attempt in range(WRITE_RETRIES):
            try:
                with engine_span("cyclone.complete_batch", {"cyclone.steps": len(batch)}):
                    async with self._pool.connection() as conn:
                        results = await batch_async(conn, stmts, transaction=True)
                break
            except psycopg.OperationalError as exc:  # the connection or the server
                if attempt == WRITE_RETRIES - 1:
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    return
                log.warning("completing %d steps failed, retrying: %s", len(batch), exc)
                await asyncio.sleep(error_backoff(attempt))
            except Exception as exc:
                if len(batch) == 1:
                    _, _, future = batch[0]
                    if not future.done():
                        future.set_exception(exc)
                    return
                # Something in the batch cannot be written: complete each step alone,
                # so that only the step at fault fails.
                log.warning("completing %d steps failed, one by one now: %s", len(batch), exc)
                for item in batch:
                    await self._flush([item])
                return
        advanced = parse_advanced(results)
        # the batch's runs that finished, and child runs runs_cancel_children cancelled
        self._announcer.announce(advanced.wakeups, advanced.finished)
        for step, _, future in batch:
            if not future.done():
                future.set_result((step.id in advanced.done, step.run_id in advanced.finished))

    async def fail(self, step: Claimed, failure: Failure, slog: StepLog | None = None) -> bool:
        """Record a failed execution of ``step``: a retry with backoff (one CAS), or a
        discard that resolves the run (one transaction); announce, after the commit,
        the runs it ended. Written with retries; given up (the sweep recovers the
        step) when the database stays out of reach. ``slog``: the step's logger.

        Returns:
            True if the failure was recorded; False if it was stale (the lease was lost
            before it) or could not be written.
        """
        slog = slog or step_log(log, step)
        stmts, transaction = failure_stmts(step, failure)
        results = await self._write(stmts, transaction=transaction)
        if results is None:
            return False
        # child runs runs_cancel_children ended (a discard of a run with child nodes)
        ended = set(parse_advanced(results).finished)
        applied = failure_applied(failure, results)
        if not applied:
            slog.info("stale failure ignored")
        elif failure.discard:
            slog.warning("discarded: %s", failure.error)
            ended.add(step.run_id)
        else:
            # Nothing announces the end of a backoff: wake this queue then ourselves.
            asyncio.get_running_loop().call_later(failure.delay, self._wake, step.queue)
            slog.info(
                "failed attempt %d, retry in %.1f s: %s",
                step.attempt + 1,
                failure.delay,
                failure.error,
            )
        self._announcer.announce(NO_WAKEUPS, ended)
        return applied

    async def snooze(
        self, step: Claimed, snoozed: Snoozed, slog: StepLog | None = None
    ) -> Outcome | None:
        """Record a handler's ``Snooze`` of ``step``: given back until ``now() +
        snoozed.delay`` (one CAS), or past ``snoozed.max_snoozes`` discarded with
        ``error_kind = 'snooze_limit'`` and its run resolved (one transaction, as a
        discard); announce, after the commit, the runs a discard ended. Written with
        retries, as :meth:`fail`.

        Returns:
            ``"released"`` (snoozed), ``"discarded"`` (past the limit), or ``None``: stale
            (the lease was lost before it) or could not be written.
        """
        slog = slog or step_log(log, step)
        results = await self._write([snooze_stmt(step, snoozed)], transaction=False)
        if results is None:
            return None
        for row in results.of(Q.steps_snooze):
            # Nothing announces the end of a snooze: wake this queue then ourselves.
            asyncio.get_running_loop().call_later(snoozed.delay, self._wake, step.queue)
            slog.info(
                "snoozed for %.1f s, no attempt used (snooze %d of max_snoozes %d)",
                snoozed.delay,
                row.snoozes,
                snoozed.max_snoozes,
            )
            return "released"
        results = await self._write(snooze_limit_stmts(step, snoozed), transaction=True)
        if results is None:
            return None
        ended = set(parse_advanced(results).finished)  # child runs it cancelled
        outcome: Outcome | None = None
        if snooze_limit_applied(results):
            slog.warning("discarded: snoozed past max_snoozes %d", snoozed.max_snoozes)
            ended.add(step.run_id)
            outcome = "discarded"
        else:
            slog.info("stale snooze ignored")
        self._announcer.announce(NO_WAKEUPS, ended)
        return outcome

    async def _write(self, stmts: list[Stmt[Any]], *, transaction: bool) -> Results | None:
        """Run engine statements with retries; ``None`` if they could not be written."""
        for attempt in range(WRITE_RETRIES):
            try:
                async with self._pool.connection() as conn:
                    return await batch_async(conn, stmts, transaction=transaction)
            except Exception as exc:
                log.warning("engine write failed (attempt %d): %s", attempt + 1, exc)
                await asyncio.sleep(error_backoff(attempt))
        return None
