"""Cyclone beside Procrastinate and PgQueuer, on the same server, in one run.

``python -m bench.compare [--dsn ADMIN_DSN] [--jobs 10000]`` (``pip install -e
'.[bench]'``) runs the same no-op workload on each system, each in a throwaway
database of its own:

1. enqueue ``--jobs`` jobs one per transaction (one producer, the library's own
   "defer one job" call);
2. enqueue ``--jobs`` jobs in batches of ``--batch`` (the library's batch call);
3. process ``--jobs`` queued no-op jobs with 1, then 2 worker processes started
   together (imports and set-up done before the start barrier); the time runs until
   the database shows every job done. The systems take turns, ``--repeats`` times
   (default 3), and the median is reported.

and prints each figure, Cyclone's ratio to each peer, and the raw-PostgreSQL limit of
the raw-PostgreSQL pgbench scripts measured in the same run (single-row and 100-row INSERT,
claim+complete in batches of 1 and 10). Each system runs with its usual guarantees:
Cyclone and Procrastinate keep a row per job and update it on completion (Cyclone
under a lease with heartbeats, a CAS on completion and a run row); PgQueuer deletes the
job row and logs it. Workers: Cyclone ``--slots`` slots claiming ``--claim-batch`` at
a time; Procrastinate ``concurrency=--slots``; PgQueuer ``batch_size=--claim-batch`` and
``max_concurrent_tasks=--slots`` (at least twice the batch, which PgQueuer requires).

``--grid`` runs each system over slots {10, 50, 100} x claim batch {10, 50} (its own
equivalents, distinct settings only; by default only Cyclone and PgQueuer, ``--systems``
to choose) and reports each at its best setting per process count, with Cyclone's best
beside PgQueuer's (target >= 1.5x) and beside the raw limit. Figures also go to
``bench/results/compare-<time>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, log, throwaway_database
from bench.raw import measure_raw_limit
from bench.report import Row, render_table, write_results

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Settings:
    admin_dsn: str
    jobs: int
    batch: int
    slots: int
    claim_batch: int
    processes: tuple[int, ...]
    repeats: int
    grid: bool = False
    systems: tuple[str, ...] = ("cyclone", "procrastinate", "pgqueuer")


GRID_SLOTS = (10, 50, 100)
GRID_CLAIM_BATCH = (10, 50)


# -- Cyclone ----------------------------------------------------------------------------


@cyclone.action("compare_noop")
async def cyclone_noop(ctx: cyclone.Context, inp: Any) -> None:
    """The no-op job."""


class CycloneSystem:
    name = "cyclone"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def install(self) -> None:
        await cyclone.migrate_async(self.dsn)

    async def clear(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE cyclone_runs CASCADE")

    async def enqueue_one_by_one(self, n: int) -> None:
        async with cyclone.Client(self.dsn, notify=False) as client:
            for i in range(n):
                await client.enqueue(cyclone_noop, i)

    async def enqueue_batched(self, n: int, batch: int) -> None:
        async with cyclone.Client(self.dsn, notify=False) as client:
            for start in range(0, n, batch):
                await client.enqueue_many(cyclone_noop, list(range(start, min(n, start + batch))))

    async def done(self, conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT count(*) FROM cyclone_runs WHERE state = 'completed'")
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def cyclone_worker(dsn: str, slots: int, claim_batch: int, start: Barrier, stop: Any) -> None:
    async def serve() -> None:
        client = cyclone.Client(
            dsn, handlers=[cyclone_noop], queues={"default": slots}, claim_batch=claim_batch
        )
        async with client:
            await asyncio.to_thread(stop.wait)

    start.wait()
    asyncio.run(serve())


# -- Procrastinate ----------------------------------------------------------------------


def _procrastinate_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="compare_noop", queue="default")  # type: ignore[untyped-decorator, unused-ignore]
    async def noop(i: int) -> None:
        return None

    return app


class ProcrastinateSystem:
    name = "procrastinate"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.app = _procrastinate_app(dsn)

    async def install(self) -> None:
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()

    async def clear(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE procrastinate_jobs CASCADE")

    async def enqueue_one_by_one(self, n: int) -> None:
        async with self.app.open_async():
            task = self.app.tasks["compare_noop"]
            for i in range(n):
                await task.defer_async(i=i)

    async def enqueue_batched(self, n: int, batch: int) -> None:
        async with self.app.open_async():
            task = self.app.tasks["compare_noop"]
            for start in range(0, n, batch):
                await task.batch_defer_async(
                    *({"i": i} for i in range(start, min(n, start + batch)))
                )

    async def done(self, conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def procrastinate_worker(
    dsn: str, slots: int, claim_batch: int | None, start: Barrier, stop: Any
) -> None:
    import logging

    logging.disable(logging.INFO)
    app = _procrastinate_app(dsn)  # imports and set-up before the barrier, as for Cyclone

    async def serve() -> None:
        async with app.open_async():
            await app.run_worker_async(concurrency=slots, wait=False, install_signal_handlers=False)

    start.wait()
    asyncio.run(serve())


# -- PgQueuer ---------------------------------------------------------------------------


class PgQueuerSystem:
    name = "pgqueuer"

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def _queries(self) -> tuple[Any, psycopg.AsyncConnection[Any]]:
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.queries import Queries

        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True)
        return Queries(PsycopgDriver(conn)), conn

    async def install(self) -> None:
        queries, conn = await self._queries()
        async with conn:
            await queries.install()

    async def clear(self) -> None:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log")

    async def enqueue_one_by_one(self, n: int) -> None:
        queries, conn = await self._queries()
        async with conn:
            for i in range(n):
                await queries.enqueue("compare_noop", str(i).encode())

    async def enqueue_batched(self, n: int, batch: int) -> None:
        queries, conn = await self._queries()
        async with conn:
            for start in range(0, n, batch):
                size = min(n, start + batch) - start
                await queries.enqueue(
                    ["compare_noop"] * size,
                    [str(i).encode() for i in range(start, start + size)],
                    [0] * size,
                )

    async def done(self, conn: psycopg.AsyncConnection[Any]) -> int:
        cur = await conn.execute("SELECT count(*) FROM pgqueuer")
        row = await cur.fetchone()
        return -int(row[0]) if row else 0  # jobs are deleted when done: 0 left is all done


def pgqueuer_worker(dsn: str, slots: int, claim_batch: int, start: Barrier, stop: Any) -> None:
    """PgQueuer's drain: ``batch_size=claim_batch``, ``max_concurrent_tasks=slots``."""
    import logging

    logging.disable(logging.WARNING)
    # imports before the barrier, as for Cyclone
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def serve() -> None:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        qm = QueueManager(Queries(PsycopgDriver(conn)))

        @qm.entrypoint("compare_noop")  # type: ignore[untyped-decorator, unused-ignore]
        async def noop(job: Any) -> None:
            return None

        await qm.run(
            batch_size=claim_batch,
            max_concurrent_tasks=slots,
            mode=QueueExecutionMode.drain,
            dequeue_timeout=timedelta(seconds=1),
        )

    start.wait()
    asyncio.run(serve())


SYSTEMS: dict[str, tuple[type[Any], Callable[..., None]]] = {
    "cyclone": (CycloneSystem, cyclone_worker),
    "procrastinate": (ProcrastinateSystem, procrastinate_worker),
    "pgqueuer": (PgQueuerSystem, pgqueuer_worker),
}


async def timed(call: Awaitable[None]) -> float:
    began = time.perf_counter()
    await call
    return time.perf_counter() - began


async def process(
    system: Any,
    worker: Callable[..., None],
    settings: Settings,
    n: int,
    *,
    slots: int,
    batch: int | None,
) -> float:
    """jobs/s of ``n`` worker processes (``slots``, claim ``batch``) over
    ``settings.jobs`` queued no-op jobs."""
    await system.clear()
    await system.enqueue_batched(settings.jobs, settings.batch)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(n + 1)
    stop = ctx.Event()
    procs = [
        ctx.Process(target=worker, args=(system.dsn, slots, batch, start, stop)) for _ in range(n)
    ]
    for proc in procs:
        proc.start()
    target = 0 if system.name == "pgqueuer" else settings.jobs
    async with await psycopg.AsyncConnection.connect(system.dsn, autocommit=True) as conn:
        await asyncio.to_thread(start.wait)
        began = time.perf_counter()
        while await system.done(conn) < target:
            if not any(proc.is_alive() for proc in procs) and await system.done(conn) < target:
                raise RuntimeError(f"{system.name}: every worker process exited before the end")
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - began
    stop.set()
    for proc in procs:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    return settings.jobs / elapsed


async def enqueue_figures(name: str, dsn: str, settings: Settings) -> dict[str, float]:
    """Install, then the two enqueue figures of one system."""
    factory, _ = SYSTEMS[name]
    system = factory(dsn)
    await system.install()
    figures: dict[str, float] = {}
    await system.clear()
    seconds = await timed(system.enqueue_one_by_one(settings.jobs))
    figures["enqueue 1/tx"] = settings.jobs / seconds
    log(f"  {name:<14} enqueue 1/tx        {figures['enqueue 1/tx']:>10,.0f} jobs/s")
    await system.clear()
    seconds = await timed(system.enqueue_batched(settings.jobs, settings.batch))
    figures[f"enqueue batch {settings.batch}"] = settings.jobs / seconds
    log(f"  {name:<14} enqueue batched     {settings.jobs / seconds:>10,.0f} jobs/s")
    return figures


def _processing(n: int) -> str:
    return f"no-op jobs, {n} process{'es' if n > 1 else ''}"


def cells(name: str, grid: Sequence[tuple[int, int]]) -> list[tuple[int, int | None]]:
    """The distinct (slots, claim batch) settings system ``name`` runs for ``grid``.

    PgQueuer's equivalents are ``max_concurrent_tasks`` and ``batch_size``, and it
    refuses fewer tasks than twice the batch, so its slots are raised to that;
    Procrastinate has ``concurrency`` and no claim batch (``None``).
    """
    found: list[tuple[int, int | None]] = []
    for slots, batch in grid:
        cell: tuple[int, int | None] = (slots, batch)
        if name == "pgqueuer":
            cell = (max(slots, 2 * batch), batch)
        elif name == "procrastinate":
            cell = (slots, None)
        if cell not in found:
            found.append(cell)
    return found


def cell_label(name: str, slots: int, batch: int | None) -> str:
    """A system's setting in its own words."""
    if name == "pgqueuer":
        return f"max_concurrent_tasks {slots}, batch_size {batch}"
    if name == "procrastinate":
        return f"concurrency {slots}"
    return f"{slots} slots x claim_batch {batch}"


def best_cells(samples: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per system and process count: the cell with the highest median jobs/s."""
    medians: dict[tuple[str, int, str], list[float]] = {}
    loads: dict[tuple[str, int, str], list[float]] = {}
    for sample in samples:
        key = (sample["system"], sample["processes"], sample["cell"])
        medians.setdefault(key, []).append(sample["jobs_per_s"])
        loads.setdefault(key, []).append(sample["load_avg"])
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for (name, n, cell), rates in medians.items():
        rate = statistics.median(rates)
        if rate > best.get((name, n), {}).get("jobs_per_s", -1.0):
            load = statistics.median(loads[(name, n, cell)])
            best[(name, n)] = {"cell": cell, "jobs_per_s": rate, "load_avg": load}
    return best


def run(settings: Settings) -> dict[str, Any]:
    log("raw PostgreSQL limit (pgbench, bench/raw-postgres)")
    raw = measure_raw_limit(
        settings.admin_dsn,
        insert_clients=(1,),
        claim_clients=settings.processes,
        seconds=3,
    )
    grid = (
        list(itertools.product(GRID_SLOTS, GRID_CLAIM_BATCH))
        if settings.grid
        else [(settings.slots, settings.claim_batch)]
    )
    measured: dict[str, dict[str, float]] = {}
    samples: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        dsns = {
            name: stack.enter_context(throwaway_database(settings.admin_dsn, f"bench_{name}"))
            for name in settings.systems
        }
        for name, dsn in dsns.items():
            log(name)
            measured[name] = asyncio.run(enqueue_figures(name, dsn, settings))
        # processing: the systems and their settings take turns, repeat after repeat, so
        # that drift of a shared machine hits each alike; the median of the repeats is
        # reported, at each system's best setting
        for repeat in range(settings.repeats):
            for n in settings.processes:
                for name, dsn in dsns.items():
                    factory, worker = SYSTEMS[name]
                    for slots, batch in cells(name, grid):
                        rate = asyncio.run(
                            process(factory(dsn), worker, settings, n, slots=slots, batch=batch)
                        )
                        label = cell_label(name, slots, batch)
                        samples.append(
                            {
                                "system": name,
                                "processes": n,
                                "cell": label,
                                "repeat": repeat,
                                "jobs_per_s": rate,
                                "load_avg": os.getloadavg()[0],
                            }
                        )
                        log(
                            f"  repeat {repeat + 1} {name:<14} {n} process(es), {label}: "
                            f"{rate:>10,.0f} jobs/s"
                        )
    best = best_cells(samples)
    for (name, n), cell in best.items():
        measured[name][_processing(n)] = cell["jobs_per_s"]
    return {
        "raw": [r.to_json() for r in raw],
        "systems": measured,
        "best": [{"system": name, "processes": n, **c} for (name, n), c in best.items()],
        "samples": samples,
    }


def _target_rows(settings: Settings, results: dict[str, Any]) -> list[Row]:
    """Cyclone's best vs PgQueuer's best (target >= 1.5x) and vs the raw limit."""
    best = {(b["system"], b["processes"]): b for b in results["best"]}
    raw = {f"{r['script']} c={r['clients']}": r["jobs_per_s"] for r in results["raw"]}
    rows = []
    for n in settings.processes:
        mine = best.get(("cyclone", n))
        if mine is None:
            continue
        load = f"{mine['load_avg']:.2f}"
        peer = best.get(("pgqueuer", n))
        if peer is not None:
            rows.append(
                Row(
                    f"no-op jobs, {n} proc, cyclone best: {mine['cell']}",
                    mine["jobs_per_s"],
                    "jobs/s",
                    f"pgqueuer best: {peer['cell']}",
                    peer["jobs_per_s"],
                    min_ratio=1.5,
                    load=load,
                )
            )
        limit = raw.get(f"claim_complete10.sql c={n}")
        rows.append(
            Row(
                f"  cyclone best, {n} proc, vs raw",
                mine["jobs_per_s"],
                "jobs/s",
                f"claim_complete10.sql c={n}",
                limit,
                min_ratio=0.5,
                load=load,
            )
        )
    return rows


def print_report(settings: Settings, results: dict[str, Any]) -> None:
    systems = results["systems"]
    raw = {f"{r['script']} c={r['clients']}": r["jobs_per_s"] for r in results["raw"]}
    limits = {
        "enqueue 1/tx": raw.get("insert1.sql c=1"),
        f"enqueue batch {settings.batch}": raw.get("insert100.sql c=1"),
        **{_processing(n): raw.get(f"claim_complete10.sql c={n}") for n in settings.processes},
    }
    names = list(systems)
    peers = [n for n in names if n != "cyclone"]
    header = [
        "figure (jobs/s)",
        *names,
        *(f"cyclone/{p}" for p in peers),
        "raw limit",
        "cyclone/raw",
    ]
    print()
    setting = (
        "each system at its best cell of slots {10, 50, 100} x claim batch {10, 50}"
        if settings.grid
        else f"{settings.slots} slots, claim batch {settings.claim_batch}"
    )
    print(
        f"{settings.jobs:,} no-op jobs per figure; batch {settings.batch}; {setting}; each "
        f"processing figure is the median of {settings.repeats} interleaved repeats"
    )
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for figure, limit in limits.items():
        values = [systems[n].get(figure) for n in names]
        cy = systems["cyclone"].get(figure)
        row = [figure, *(f"{v:,.0f}" if v else "-" for v in values)]
        row += [
            f"{cy / systems[p][figure]:.2f}x" if cy and systems[p].get(figure) else "-"
            for p in peers
        ]
        row += [f"{limit:,.0f}" if limit else "-", f"{cy / limit:.0%}" if cy and limit else "-"]
        print(" | ".join(row))
    print(
        "raw limits: insert1.sql (1/tx), insert100.sql (batched), claim_complete10.sql at the "
        "same client count (processing)"
    )
    targets = _target_rows(settings, results)
    if targets:
        print()
        print(render_table(targets))
    print()
    for b in results["best"]:
        print(f"  best of {b['system']}, {b['processes']} process(es): {b['cell']}")
    spread: dict[tuple[str, int, str], list[float]] = {}
    for sample in results["samples"]:
        key = (sample["system"], sample["processes"], sample["cell"])
        spread.setdefault(key, []).append(sample["jobs_per_s"])
    for (name, n, cell), rates in spread.items():
        print(
            f"  {name}, {n} process(es), {cell}: median {statistics.median(rates):,.0f}, "
            f"repeats from {min(rates):,.0f} to {max(rates):,.0f} jobs/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="a DSN that may create databases")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--claim-batch", type=int, default=50)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3, help="processing repeats (median)")
    parser.add_argument(
        "--grid", action="store_true", help="each system at its best of slots x claim batch"
    )
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEMS),
        default=None,
        help="systems to run (default: all; with --grid: cyclone and pgqueuer)",
    )
    args = parser.parse_args()
    systems = args.systems or (["cyclone", "pgqueuer"] if args.grid else list(SYSTEMS))
    if "cyclone" not in systems:
        parser.error("--systems must include cyclone (every ratio is Cyclone's)")
    settings = Settings(
        admin_dsn=args.dsn,
        jobs=args.jobs,
        batch=args.batch,
        slots=args.slots,
        claim_batch=args.claim_batch,
        processes=tuple(args.processes),
        repeats=args.repeats,
        grid=args.grid,
        systems=tuple(dict.fromkeys(systems)),
    )
    started = datetime.now(UTC)
    results = run(settings)
    print_report(settings, results)
    write_results(RESULTS, "compare", started, {"settings": vars(args), **results})


if __name__ == "__main__":
    main()
