"""Batched completion of steps that have no completion transaction.

decisions.md, Who claims what: completions of steps without ``completion_tx()`` are
written many per transaction, each row with its own CAS on state, owner and lease
generation. A batch goes out as soon as the previous one is written (up to two in
flight), so a lone completion is not delayed and a busy worker folds many into one
transaction. Runs that end are handed to ``ended`` (the publisher's ``run_done``)
after the commit, so a NOTIFY that fails can never turn a committed completion into a
failed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import batch_async
from cyclone.graph import parse_advanced
from cyclone.retry import WRITE_RETRIES, error_backoff
from cyclone.transitions import Claimed, complete_stmts
from cyclone.wakeups import Announcer

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
    ) -> None:
        self._pool = pool
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
                async with self._pool.connection() as conn:
                    rows = await batch_async(conn, stmts, transaction=True)
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
        advanced = parse_advanced(rows[1:])
        # the batch's runs that finished, and child runs runs_cancel_children cancelled
        self._announcer.announce(advanced.wakeups, advanced.finished)
        for step, _, future in batch:
            if not future.done():
                future.set_result((step.id in advanced.done, step.run_id in advanced.finished))
