"""The parts of a wait scanner pass that the clock or the mailbox moves: due timers,
signal waits past their timeout, signal waits their mailbox satisfies, and run
deadlines.

Each part runs in a transaction of its own over runs it locks with ``SKIP LOCKED`` and
returns a :class:`cyclone.scanners.settle.Settlement` for the scanner to announce after
the commit.
"""

from __future__ import annotations

import logging
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, fetch_async, run_plan_async
from cyclone.graph import Completion
from cyclone.scanners.settle import Settlement, advance, end_children
from cyclone.signals import settle_plan
from cyclone.sql import Q
from cyclone.states import StepState

__all__ = ["deadlines", "signal_timeouts", "signals", "timers"]

log = logging.getLogger("cyclone.waits")


async def timers(pool: AsyncConnectionPool[Any], batch: int) -> Settlement:
    """Complete due timers (``waiting_timer`` past ``scheduled_at``) and advance their
    runs."""
    done = Settlement()
    async with pool.connection() as conn, conn.transaction():
        due = await fetch_async(conn, Stmt(Q.steps_timers_due, {"limit": batch}))
        if due:
            waiting = StepState.WAITING_TIMER.value
            done.add(
                await advance(conn, [Completion(t.id, t.run_id, waiting=waiting) for t in due])
            )
    return done


async def signal_timeouts(pool: AsyncConnectionPool[Any], batch: int) -> Settlement:
    """Discard signal waits past their timeout (``signal_timeout``), resolving their
    runs as for any discard."""
    done = Settlement()
    async with pool.connection() as conn, conn.transaction():
        due = await fetch_async(conn, Stmt(Q.steps_signal_timeouts_due, {"limit": batch}))
        for wait in due:
            error = f"signal wait {wait.node!r} timed out after {wait.wait_for_s:g} s"
            await done.discard(conn, wait, StepState.WAITING_SIGNAL, "signal_timeout", error)
    return done


async def signals(pool: AsyncConnectionPool[Any], batch: int) -> Settlement:
    """Complete signal waits whose mailbox already holds their signals (sent before
    the wait was reached)."""
    async with pool.connection() as conn, conn.transaction():
        runs = await fetch_async(conn, Stmt(Q.signals_ready_runs, {"limit": batch}))
        if not runs:
            return Settlement()
        settled = await run_plan_async(conn, settle_plan([run.id for run in runs]))
    return Settlement(settled.completed, set(settled.finished), settled.wakeups)


async def deadlines(pool: AsyncConnectionPool[Any], batch: int) -> Settlement:
    """Fail running runs past ``deadline_at``, their active steps and child runs
    cancelled."""
    async with pool.connection() as conn, conn.transaction():
        failed = await fetch_async(conn, Stmt(Q.runs_fail_deadline, {"limit": batch}))
        ended = {run.run_id for run in failed}
        cancelled = await end_children(conn, ended)
    if failed:
        log.warning("runs %s failed: deadline passed", sorted(ended))
    return Settlement(len(failed), ended | cancelled)
