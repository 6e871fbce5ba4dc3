"""Retention: delete terminal runs past their retention, in bounded batches.

docs/design.md, Schedules and retention. Each step row stores its effective retention
at insert (the step's option, else the kind's, else the client default), so every purger
deletes the same runs: a run goes once every one of its steps has outlived its retention
since the run finished (a step with no retention keeps its run forever). Deleting a run
cascades to its steps, deps, input bindings, signals and schedule fires; a schedule's
``last_run_id`` becomes NULL. A terminal child run stays while its parent run is running
or paused; a non-terminal run is never touched.

Every started client purges every ``purge_interval`` seconds; ``Client.purge()`` and
``cyclone purge`` purge on demand.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Plan, Stmt, batch_async
from cyclone.options import micros
from cyclone.scanners.loop import Periodic
from cyclone.sql import Q
from cyclone.sql.rows import IdRow

__all__ = ["PASS_BATCHES", "PURGE_BATCH", "Purger", "purge_async", "purge_plan"]

log = logging.getLogger("cyclone.purge")

PURGE_BATCH = 500
"""Runs one purge transaction deletes at most."""
PASS_BATCHES = 20
"""Batches one background pass runs before it gives its connection back."""


def _stmts(older_than: float | None, batch: int) -> list[Stmt[Any]]:
    """One purge transaction's statements: no JIT for it (``runs_purge_plan``), then the
    delete of one batch."""
    if older_than is None:
        purge = Stmt(Q.runs_purge, {"limit": batch})
    else:
        purge = Stmt(Q.runs_purge_older, {"older_than_us": micros(older_than), "limit": batch})
    return [Stmt(Q.runs_purge_plan), purge]


async def purge_async(
    conn: psycopg.AsyncConnection[Any],
    older_than: float | None = None,
    *,
    batch: int = PURGE_BATCH,
    max_batches: int | None = None,
) -> int:
    """Delete expired terminal runs, one committed batch at a time; how many went.

    Args:
        conn: a connection outside a transaction (each batch is its own transaction).
        older_than: seconds; given, every terminal run finished at least that long ago
            goes, whatever its retention. ``None``: each run's own retention.
        batch: runs per transaction.
        max_batches: stop after this many batches (``None``: until none is left).
    """
    total = 0
    done = 0
    while max_batches is None or done < max_batches:
        async with conn.transaction():
            results = await batch_async(conn, _stmts(older_than, batch), transaction=False)
            deleted = len(results.typed(IdRow))
        total += deleted
        done += 1
        if deleted < batch:
            break
    return total


def purge_plan(older_than: float | None = None, batch: int = PURGE_BATCH) -> Plan[int]:
    """One purge batch as a plan, for a transaction of the caller's: the number of runs
    it deleted (fewer than ``batch``: none is left)."""
    deleted = 0
    for stmt in _stmts(older_than, batch):
        deleted = len((yield stmt))
    return deleted


class Purger(Periodic):
    """Purges expired runs every ``interval`` seconds (with 10 % jitter)."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, interval: float) -> None:
        super().__init__(interval, name="purge")
        self._pool = pool

    async def pass_once(self) -> bool:
        """One :meth:`purge_once`; True (the next pass at once) when it hit its cap."""
        return await self.purge_once() >= PASS_BATCHES * PURGE_BATCH

    async def purge_once(self) -> int:
        """One pass: at most :data:`PASS_BATCHES` batches (then the connection goes
        back to the pool, and :meth:`run` comes back at once for the rest)."""
        async with self._pool.connection() as conn:
            deleted = await purge_async(conn, max_batches=PASS_BATCHES)
        if deleted:
            log.info("purged %d expired run(s)", deleted)
        return deleted
