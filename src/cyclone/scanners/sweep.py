"""The recovery sweep: give back steps whose worker is gone or whose timeout passed.

A running step whose ``lease_expiry`` has passed
(its worker crashed or lost the database) or whose ``started_at + timeout`` has passed
(even while heartbeats still run) goes back to ``available`` with ``reclaims + 1``, the
lease cleared and ``attempt`` and ``scheduled_at`` unchanged: a reclaim is not an
attempt. Past ``max_reclaims`` the step is discarded with ``error_kind =
'reclaim_limit'``, its run failed and the run's active child runs cancelled. Each
reclaim is its own transaction, guarded on the lease generation the sweep read.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, batch_async, fetch_async
from cyclone.graph import parse_advanced
from cyclone.observability.hooks import Observers
from cyclone.observability.logs import step_log
from cyclone.observability.tracing import record_span
from cyclone.scanners.loop import Scanner
from cyclone.sql import Q
from cyclone.transitions import reclaim_stmts
from cyclone.wakeups import NO_WAKEUPS, Announcer, Wakeups

__all__ = ["SweepResult", "Sweeper"]

log = logging.getLogger("cyclone.sweep")


class Sweeper(Scanner):
    """Runs the recovery sweep every ``interval`` seconds (with 10 % jitter)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        announcer: Announcer,
        *,
        interval: float,
        max_reclaims: int,
        batch: int = 500,
        observers: Observers | None = None,
    ) -> None:
        super().__init__(pool, announcer, interval=interval, name="recovery sweep", batch=batch)
        self.max_reclaims = max_reclaims
        self._observers = observers if observers is not None else Observers()

    async def pass_once(self) -> bool:
        """One :meth:`sweep_once`."""
        await self.sweep_once()
        return False

    async def sweep_once(self) -> SweepResult:
        """One pass over every expired step; returns what it changed (a pass that
        changed something is traced as a ``cyclone.sweep`` span)."""
        started_ns = time.time_ns()
        async with self._pool.connection() as conn:
            rows = await fetch_async(conn, Stmt(Q.steps_sweep_candidates, {"limit": self._batch}))
        seen: set[int] = set()
        reclaimed = discarded = 0
        for row in rows:
            if row.id in seen:
                continue
            seen.add(row.id)
            stmts, is_discard = reclaim_stmts(row, max_reclaims=self.max_reclaims)
            async with self._pool.connection() as conn:
                results = await batch_async(conn, stmts, transaction=is_discard)
            if is_discard:
                ended = set(parse_advanced(results).finished)  # child runs ended
                if results.of(Q.steps_reclaim_discard):
                    discarded += 1
                    step_log(log, row).warning("discarded: reclaim limit reached")
                    ended.add(row.run_id)
                    if self._observers:
                        self._observers.step_swept_discard(row.kind, row.queue)
                self._announcer.announce(NO_WAKEUPS, ended)
            elif back := results.of(Q.steps_reclaim):
                reclaimed += 1
                why = "timeout" if row.timed_out else "lease expired"
                step_log(log, row).info("reclaimed (%s)", why)
                self._announcer.announce(Wakeups.of_queues(step.queue for step in back))
                if self._observers:
                    self._observers.step_reclaimed(row.kind, row.queue)
        if reclaimed or discarded:
            attributes = {"cyclone.reclaimed": reclaimed, "cyclone.discarded": discarded}
            record_span("cyclone.sweep", started_ns, attributes)
        return SweepResult(reclaimed=reclaimed, discarded=discarded)


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What one pass did: steps made available again, steps discarded."""

    reclaimed: int = 0
    discarded: int = 0
