"""Retained history: terminal runs written before a drain, as a database that has run
for a while keeps them until their retention ends.

:func:`fill_retained` writes ``n`` terminal standalone runs of the no-op kind with one
set-based statement (``INSERT ... SELECT FROM generate_series``; run ids from the
identity, the steps inserted from the runs' ``RETURNING``):

* nine in ten ``completed``, with one ``completed`` step (attempt 0);
* one in ten ``failed``, with one ``discarded`` step (its attempts used up, an error);
* finished within the last day (from 23 h 1 min ago to 1 min ago, in id order), each
  step and run with ``retention = 7 days`` (a run's retention is its step's, as
  ``enqueue`` writes it), so every run is inside its retention and the purge deletes
  none of them.

Then, by default, ``ANALYZE`` of both tables, so the planner knows their size (none
when ``n`` is 0). With
``stale_stats``, the tables are analyzed while still empty and autovacuum is switched
off on them (``ALTER TABLE ... SET (autovacuum_enabled = false)``), so that the
statistics keep saying "empty" through the fill and the drain after it: the planner's
view of a table that grew faster than autovacuum's analyze threshold.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from bench.db import execute
from bench.workers import NOOP_KIND, QUEUE

__all__ = ["RETAINED_SQL", "fill_retained"]

_TABLES = ("cyclone_runs", "cyclone_steps")

RETAINED_SQL = """
WITH runs AS (
    INSERT INTO cyclone_runs (
        workflow, def_version, input, state, result_node, created_at, updated_at,
        finished_at, retention)
    SELECT %(kind)s, 'job', '{}'::jsonb,
           CASE WHEN mod(g.i, 10) = 0 THEN 'failed' ELSE 'completed' END,
           %(kind)s, f.at - interval '2 milliseconds', f.at, f.at, interval '7 days'
    FROM generate_series(1, %(n)s::bigint) AS g (i)
    CROSS JOIN LATERAL (
        SELECT now() - interval '1 minute'
               - interval '23 hours' * (1 - g.i::float8 / %(n)s::bigint) AS at
    ) AS f
    RETURNING id, state, finished_at
)
INSERT INTO cyclone_steps (
    run_id, node, kind, state, queue, attempt, max_attempts, scheduled_at,
    lease_generation, error, error_kind, retention, created_at, started_at, completed_at)
SELECT runs.id, %(kind)s, %(kind)s,
       CASE runs.state WHEN 'failed' THEN 'discarded' ELSE 'completed' END,
       %(queue)s,
       CASE runs.state WHEN 'failed' THEN 5 ELSE 0 END,
       5,
       runs.finished_at - interval '2 milliseconds',
       CASE runs.state WHEN 'failed' THEN 5 ELSE 1 END,
       CASE runs.state WHEN 'failed' THEN 'bench: a retained failure' END,
       CASE runs.state WHEN 'failed' THEN 'exception' END,
       interval '7 days',
       runs.finished_at - interval '2 milliseconds',
       runs.finished_at - interval '1 millisecond',
       runs.finished_at
FROM runs
"""
"""The statement that writes the retained runs and their steps (``%(n)s`` of them)."""


def _fill(dsn: str, n: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(RETAINED_SQL, {"n": n, "kind": NOOP_KIND, "queue": QUEUE})


async def fill_retained(dsn: str, n: int, *, stale_stats: bool = False) -> dict[str, Any]:
    """Write ``n`` retained terminal runs into Cyclone's (empty) tables in ``dsn``.

    Returns:
        ``runs``, ``fill_s`` (the seconds of the INSERT), ``analyze_s`` (of the ANALYZE
        after it; 0 with ``stale_stats``) and ``stale_stats``.
    """
    if stale_stats:
        await asyncio.to_thread(
            execute,
            dsn,
            f"ANALYZE {', '.join(_TABLES)}",
            *(f"ALTER TABLE {table} SET (autovacuum_enabled = false)" for table in _TABLES),
        )
    began = time.perf_counter()
    if n:
        await asyncio.to_thread(_fill, dsn, n)
    filled = time.perf_counter()
    if n and not stale_stats:  # empty tables stay unanalyzed (bench.drain.reset_tables)
        await asyncio.to_thread(execute, dsn, f"ANALYZE {', '.join(_TABLES)}")
    return {
        "runs": n,
        "fill_s": filled - began,
        "analyze_s": time.perf_counter() - filled,
        "stale_stats": stale_stats,
    }
