"""What migration 7's indexes cost the hot path: the same work with and without them.

``python -m bench.dashboard_cost`` makes two throwaway databases, both migrated, and
drops the dashboard's indexes (migration 7) from one. In each, interleaved and
repeated (``--repeats``, default 3): ``enqueue_many`` of ``--jobs`` no-op jobs, then
one worker draining them. It prints, per variant, the median rate of each (which the
other work of a shared machine moves a lot: the load average is printed beside), and
what the indexes of runs and steps grew by per job (every index entry a write adds;
steady, whatever else the machine does). The job benchmark (``python -m bench.jobs``) gives the
same rates against the raw-PostgreSQL limit; run it on both sides of the migration.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from contextlib import ExitStack
from typing import Any

import psycopg
from psycopg import sql

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, throwaway_database

DASHBOARD_INDEXES = ("idx_steps_completed_brin", "idx_runs_created_brin", "idx_runs_submit_key_any")
"""The indexes of migration 7."""


@cyclone.step("cost_noop")
async def noop(ctx: cyclone.Context, inp: Any) -> None:
    return None


def _index_bytes(dsn: str) -> int:
    """Bytes of every index of runs and steps (what index entries a write adds take
    on disk; unlike WAL, nothing another database does shows here)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(pg_relation_size(indexrelid)) FROM pg_index"
            " WHERE indrelid IN ('cyclone_runs'::regclass, 'cyclone_steps'::regclass)"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE cyclone_runs CASCADE")
        conn.execute("CHECKPOINT")


async def _round(dsn: str, jobs: int) -> dict[str, float]:
    """Enqueue ``jobs`` no-op jobs, then drain them with one worker."""
    _reset(dsn)
    size0 = _index_bytes(dsn)
    async with cyclone.Client(dsn) as producer:
        start = time.perf_counter()
        for at in range(0, jobs, 1000):
            await producer.enqueue_many("cost_noop", [None] * min(1000, jobs - at))
        enqueue_s = time.perf_counter() - start
    size1 = _index_bytes(dsn)
    worker = cyclone.Client(dsn, handlers=[noop], queues={"default": 20}, poll_interval=0.05)
    start = time.perf_counter()
    async with worker:
        while (await worker.stats()).get("default") is not None:
            await asyncio.sleep(0.05)
    drain_s = time.perf_counter() - start
    size2 = _index_bytes(dsn)
    return {
        "enqueue_per_s": jobs / enqueue_s,
        "drain_per_s": jobs / drain_s,
        "enqueue_index_per_job": (size1 - size0) / jobs,
        "drain_index_per_job": (size2 - size1) / jobs,
    }


async def measure(admin: str, jobs: int, repeats: int) -> dict[str, list[dict[str, float]]]:
    """Interleaved rounds in both variants."""
    out: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    with ExitStack() as stack:
        dsns = {
            name: stack.enter_context(throwaway_database(admin, f"bench_cost_{name}"))
            for name in out
        }
        for dsn in dsns.values():
            cyclone.migrate(dsn)
        with psycopg.connect(dsns["without"], autocommit=True) as conn:
            for index in DASHBOARD_INDEXES:
                conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(index)))
        for _ in range(repeats):
            for name, dsn in dsns.items():
                out[name].append(await _round(dsn, jobs))
    return out


def main() -> None:
    """``python -m bench.dashboard_cost``."""
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard_cost")
    parser.add_argument(
        "--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN; the bench's databases are made here"
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = asyncio.run(measure(args.dsn, args.jobs, args.repeats))
    print(f"{args.jobs:,} no-op jobs, median of {args.repeats} interleaved rounds")
    print(
        f"{'indexes of migration 7':<24} {'enqueue/s':>10} {'drain/s':>9} "
        f"{'index B/job enqueue':>20} {'index B/job drain':>18}"
    )
    for name, rounds in results.items():

        def med(key: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[key] for r in rounds)

        print(
            f"{name:<24} {med('enqueue_per_s'):>10,.0f} {med('drain_per_s'):>9,.0f} "
            f"{med('enqueue_index_per_job'):>20,.0f} {med('drain_index_per_job'):>18,.0f}"
        )
    print(f"load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
