"""The job-engine benchmark: Cyclone against the raw-PostgreSQL limit, in one run.

``python -m bench.jobs [--dsn ADMIN_DSN] [options]`` measures, on this machine:

1. **The raw limit** (:mod:`bench.raw`): the shared pgbench scripts, unchanged, in a
   throwaway database: single-row INSERT (``insert1.sql``) with 1 and ``--producers``
   clients, 100-row INSERT (``insert100.sql``) with 1 client, and claim+complete in
   batches of 1 and of 10 (``claim_complete1.sql``, ``claim_complete10.sql``) with as
   many clients as there are worker processes in each Cyclone run, refilled before each.
   jobs/s = TPS x jobs per transaction. Each raw figure is measured right before the
   Cyclone figure it is compared with, so that drift of a shared machine (flush latency,
   other sessions) hits both alike, and a monitor (:mod:`bench.monitor`) records how
   much foreign database activity each pair ran beside (the ``busy`` column).
2. **Cyclone**, in its own throwaway database (``cyclone.migrate``; dropped at the end):

   a. enqueue/s, one run per transaction (``Client.enqueue``, which also sends the
      wakeup NOTIFY after commit): one producer, then ``--producers`` concurrent producer
      tasks sharing one client, each into emptied, checkpointed tables for
      ``--enqueue-seconds`` after a short warm-up;
   b. enqueue/s batched: ``Client.enqueue_many`` of ``--batch`` inputs, one producer;
   c. no-op jobs/s: ``--jobs`` runs are enqueued with ``enqueue_many`` into emptied
      tables, which are then vacuumed, analyzed and checkpointed (as ``refill.sql``
      does for the raw table),
      then 1, 2, ... worker *processes* (``--processes``; ``--slots`` slots and
      ``--claim-batch`` each) start together at a barrier; the time runs from that
      barrier until ``SELECT count(*) FROM cyclone_runs WHERE state='completed'``,
      polled every ``--count-interval`` s, reaches ``--jobs``. The span on the
      database's clock (first ``started_at`` to last ``completed_at``) is recorded too;
   d. enqueue-to-start latency with one idle, LISTENING worker process: ``--latency-jobs``
      probe runs (after ``--latency-warmup``), one at a time; each is enqueued, its
      handler's start awaited, then the run's completion (``Client.wait``), so the
      worker is idle again before the next. Two measures: ``started_at - created_at``
      of the step (both the database's now(): the enqueue transaction's start and the
      claim's), and from ``enqueue()`` returning in this process to the handler
      starting in the worker (CLOCK_MONOTONIC, sent back through a pipe).
3. **The report**: each Cyclone figure beside its raw limit, the ratio Cyclone / raw and
   its target (no-op jobs/s >= 50% of claim+complete in batches of 10 at the same
   client count; one-per-transaction enqueue >= 70% of single-row INSERT at the same
   client count; wake latency p50 < 1 ms, p99 < 5 ms, shown beside the mean latency of
   one single-row INSERT commit), on stdout, and as JSON in
   ``bench/results/jobs-<timestamp>.json``. Progress goes to stderr.

The no-op runs also record each worker process's CPU time per job and how many cores
the whole machine kept busy. ``--py-spy DIR`` samples every worker process of those
runs with py-spy while it holds the GIL (its Python CPU time; this slows it a little)
and prints where that time goes; ``--phases`` runs a subset.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg.conninfo import conninfo_to_dict

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, execute, log, server_settings, throwaway_database
from bench.fleet import START_TIMEOUT, STOP_TIMEOUT, Fleet, join_all, started_together
from bench.monitor import LoadMonitor, busy_cores, machine_cpu
from bench.raw import CLAIM_SCRIPTS, DEFAULT_SCRIPTS, PgbenchResult, RawLimit
from bench.report import (
    Row,
    latency_summary,
    profile_summary,
    provenance,
    render_table,
    write_results,
)
from bench.workers import NOOP_KIND, PROBE_KIND, monotonic_ns, probe_worker, throughput_worker

__all__ = [
    "Bench",
    "DrainOptions",
    "Settings",
    "db_span",
    "fill_backlog",
    "main",
    "measure",
    "run",
    "wait_completed",
]

PHASES = ("raw", "enqueue", "workers", "latency")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
_BACKLOG_CHUNK = 1_000  # runs per enqueue_many call when filling the backlog


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run is configured with (see ``--help``)."""

    admin_dsn: str
    scripts: Path
    pgbench_seconds: int
    enqueue_seconds: float
    producers: int
    batch: int
    jobs: int
    processes: tuple[int, ...]
    slots: int
    claim_batch: int | None
    poll_interval: float
    count_interval: float
    worker_timeout: float
    latency_jobs: int
    latency_warmup: int
    phases: tuple[str, ...]
    py_spy: Path | None
    results_dir: Path

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (paths as strings, no DSN secrets)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "admin_dsn"}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


# -- helpers ---------------------------------------------------------------------------


async def reset_tables(dsn: str) -> None:
    """Empty Cyclone's tables and CHECKPOINT.

    No ANALYZE of the empty tables: statistics that say "no rows" make every backend
    plan its foreign-key checks from ``cyclone_steps`` to ``cyclone_runs`` as sequential
    scans, which the growing table then makes slower with each insert until autovacuum
    analyzes it again (enqueue_many measured 7x slower that way).
    """
    await asyncio.to_thread(
        execute, dsn, "TRUNCATE cyclone_runs RESTART IDENTITY CASCADE", "CHECKPOINT"
    )


async def sustained_rate(call: Callable[[], Awaitable[int]], tasks: int, seconds: float) -> float:
    """Jobs/s of ``tasks`` concurrent loops of ``call`` (returning jobs done) for ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    done = 0

    async def repeat() -> None:
        nonlocal done
        while loop.time() < deadline:
            jobs = await call()  # not ``done += await call()``: that reads ``done`` first
            done += jobs

    began = loop.time()
    await asyncio.gather(*(repeat() for _ in range(tasks)))
    return done / (loop.time() - began)


async def fill_backlog(dsn: str, jobs: int) -> None:
    """A clean backlog of ``jobs`` available no-op runs, vacuumed and checkpointed."""
    await reset_tables(dsn)
    async with cyclone.Client(dsn) as client:
        for first in range(0, jobs, _BACKLOG_CHUNK):
            await client.enqueue_many(NOOP_KIND, [{}] * min(_BACKLOG_CHUNK, jobs - first))
    await asyncio.to_thread(
        execute, dsn, "VACUUM ANALYZE cyclone_runs, cyclone_steps", "CHECKPOINT"
    )


async def _count_completed(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM cyclone_runs WHERE state = 'completed'")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


class DrainOptions(Protocol):
    """How a drain is watched: the settings of each no-op benchmark have these."""

    @property
    def jobs(self) -> int:
        """Runs the drain works off."""

    @property
    def worker_timeout(self) -> float:
        """Seconds from the barrier after which the drain is given up."""

    @property
    def count_interval(self) -> float:
        """Seconds between two counts of the completed runs."""


async def wait_completed(
    conn: psycopg.AsyncConnection[Any], options: DrainOptions, fleet: Fleet, began: float
) -> None:
    """Count the completed runs every ``count_interval`` s until there are ``jobs``.

    Raises:
        RuntimeError: a process of ``fleet`` died first.
        TimeoutError: not done ``worker_timeout`` s after ``began``
            (``time.perf_counter()``).
    """
    jobs, timeout = options.jobs, options.worker_timeout
    while (completed := await _count_completed(conn)) < jobs:
        if not fleet.alive():
            raise RuntimeError("a worker process died; see its output above")
        if time.perf_counter() - began > timeout:
            raise TimeoutError(f"{completed} of {jobs} runs completed in {timeout} s")
        await asyncio.sleep(options.count_interval)


async def db_span(conn: psycopg.AsyncConnection[Any]) -> float | None:
    """Seconds from the first ``started_at`` to the last ``completed_at`` of every
    step, on the database's clock (``None`` when no step finished)."""
    cur = await conn.execute(
        "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8 FROM cyclone_steps"
    )
    row = await cur.fetchone()
    return float(row[0]) if row and row[0] else None


def _start_py_spy(pid: int, output: Path) -> subprocess.Popen[bytes]:
    command = [
        "py-spy",
        "record",
        "--pid",
        str(pid),
        "--rate",
        "250",
        "--gil",
        "--format",
        "raw",
        "--output",
        str(output),
    ]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _receive(conn: Connection, timeout: float) -> tuple[str, int, int]:
    if not conn.poll(timeout):
        raise TimeoutError(f"no report from the probe worker within {timeout} s")
    kind, run_id, stamp = conn.recv()
    return str(kind), int(run_id), int(stamp)


# -- the measurements ------------------------------------------------------------------


class Bench:
    """One run: the Cyclone database, the raw-limit database, and the figures so far.

    Each raw figure is measured right before the Cyclone figure it is compared with, so
    that drift of a shared machine (flush latency, other sessions) hits both alike; the
    foreign activity seen during each pair is kept with the Cyclone figure.
    """

    def __init__(
        self, settings: Settings, dsn: str, raw: RawLimit | None, monitor: LoadMonitor
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.raw = raw
        self.monitor = monitor
        self.raw_results: list[PgbenchResult] = []

    async def limits(self, scripts: Sequence[str], clients: int) -> dict[str, PgbenchResult]:
        """The raw figures of ``scripts`` with ``clients`` (none when raw is skipped)."""
        found: dict[str, PgbenchResult] = {}
        if self.raw is None:
            return found
        for script in scripts:
            result = await asyncio.to_thread(self.raw.measure, script, clients)
            self.raw_results.append(result)
            found[script] = result
            log(f"  raw     {result.label:<26} {result.jobs_per_s:>10,.0f} jobs/s")
        return found

    # -- a, b: enqueue -------------------------------------------------------------

    async def enqueue(self) -> dict[str, Any]:
        """Enqueue/s one per transaction (1 and N producers) and with ``enqueue_many``."""
        settings = self.settings
        inputs: list[dict[str, Any]] = [{}] * settings.batch
        warmup = min(0.5, settings.enqueue_seconds / 4)
        results: dict[str, Any] = {}
        async with cyclone.Client(self.dsn) as client:

            async def one() -> int:
                await client.enqueue(NOOP_KIND, {})
                return 1

            async def many() -> int:
                await client.enqueue_many(NOOP_KIND, inputs)
                return len(inputs)

            plan: list[tuple[str, Callable[[], Awaitable[int]], int, str | None]] = [
                ("enqueue_1_producer", one, 1, "insert1.sql"),
                (
                    f"enqueue_{settings.producers}_producers",
                    one,
                    settings.producers,
                    "insert1.sql",
                ),
                (
                    f"enqueue_many_{settings.batch}",
                    many,
                    1,
                    "insert100.sql" if settings.batch == 100 else None,
                ),
            ]
            for name, call, tasks, script in plan:
                with self.monitor.window() as foreign:
                    paired = await self.limits([script] if script else [], tasks)
                    await reset_tables(self.dsn)
                    await sustained_rate(call, tasks, warmup)
                    rate = await sustained_rate(call, tasks, settings.enqueue_seconds)
                results[name] = {
                    "producers": tasks,
                    "jobs_per_s": rate,
                    "raw": paired,
                    "foreign": foreign,
                }
                log(f"  cyclone {name:<26} {rate:>10,.0f} jobs/s")
        return results

    # -- c: no-op throughput -------------------------------------------------------

    async def throughput(self, processes: int) -> dict[str, Any]:
        """No-op jobs/s of ``processes`` worker processes draining the backlog."""
        with self.monitor.window() as foreign:
            paired = await self.limits(list(CLAIM_SCRIPTS), processes)
            await fill_backlog(self.dsn, self.settings.jobs)
            result = await self._drain(processes)
        result["raw"] = paired
        result["foreign"] = foreign
        log(
            f"  cyclone no-op, {processes} process(es)     {result['jobs_per_s']:>10,.0f} jobs/s"
            f" ({result['elapsed_s']:.2f} s, worker CPU "
            f"{result['worker_cpu_us_per_job']:.0f} us/job)"
        )
        return result

    async def _drain(self, processes: int) -> dict[str, Any]:
        settings = self.settings
        options = {
            "slots": settings.slots,
            "claim_batch": settings.claim_batch,
            "poll_interval": settings.poll_interval,
        }
        spies: list[subprocess.Popen[bytes]] = []
        profiles: list[Path] = []
        try:
            async with started_together(
                throughput_worker, [(self.dsn,)] * processes, options
            ) as fleet:
                began = time.perf_counter()
                cpu_before = machine_cpu()
                if settings.py_spy is not None:
                    settings.py_spy.mkdir(parents=True, exist_ok=True)
                    for pid in fleet.pids:
                        profiles.append(settings.py_spy / f"worker-p{processes}-{pid}.txt")
                        spies.append(_start_py_spy(pid, profiles[-1]))
                async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    await wait_completed(conn, settings, fleet, began)
                    elapsed = time.perf_counter() - began
                    cores = busy_cores(cpu_before, machine_cpu())
                    span = await db_span(conn) or elapsed
        finally:
            for spy in spies:
                await asyncio.to_thread(spy.wait, STOP_TIMEOUT)
        worker_cpu = fleet.cpu_s
        return {
            "processes": processes,
            "slots": settings.slots,
            "claim_batch": settings.claim_batch,
            "jobs": settings.jobs,
            "elapsed_s": elapsed,
            "jobs_per_s": settings.jobs / elapsed,
            "db_span_s": span,
            "db_span_jobs_per_s": settings.jobs / span,
            "worker_cpu_s": worker_cpu,
            "worker_cpu_us_per_job": 1e6 * sum(worker_cpu) / settings.jobs,
            "machine_busy_cores": cores,
            "profiles": [str(p) for p in profiles if p.exists()],
        }

    # -- d: wake latency -----------------------------------------------------------

    async def latency(self) -> dict[str, Any]:
        """Enqueue-to-start latency with one idle LISTENING worker process, both ways."""
        with self.monitor.window() as foreign:
            paired = await self.limits(["insert1.sql"], 1)
            await reset_tables(self.dsn)
            samples = await self._probe()
        result: dict[str, Any] = {
            "jobs": self.settings.latency_jobs,
            **{name: latency_summary(values) for name, values in samples.items()},
            "raw": paired,
            "foreign": foreign,
        }
        for name in samples:
            summary = result[name]
            log(
                f"  cyclone latency {name:<18} p50 {summary['p50']:.3f} ms  "
                f"p99 {summary['p99']:.3f} ms  max {summary['max']:.3f} ms"
            )
        return result

    async def _probe(self) -> dict[str, list[float]]:
        settings = self.settings
        ctx = multiprocessing.get_context("spawn")
        receiver, sender = ctx.Pipe(duplex=False)
        stop = ctx.Event()
        options = {
            "slots": settings.slots,
            "claim_batch": settings.claim_batch,
            "poll_interval": settings.poll_interval,
            "report": sender,
            "stop": stop,
        }
        worker = ctx.Process(target=probe_worker, args=(self.dsn,), kwargs=options, name="probe")
        worker.start()
        sender.close()
        from_return: dict[int, float] = {}
        from_call: dict[int, float] = {}
        try:
            kind, _, _ = await asyncio.to_thread(_receive, receiver, START_TIMEOUT)
            if kind != "ready":
                raise RuntimeError(f"the probe worker said {kind!r} before 'ready'")
            async with cyclone.Client(self.dsn, poll_interval=0.05) as client:
                for n in range(settings.latency_warmup + settings.latency_jobs):
                    called = monotonic_ns()
                    handle = await client.enqueue(PROBE_KIND, {})
                    returned = monotonic_ns()
                    kind, run_id, started = await asyncio.to_thread(_receive, receiver, 10.0)
                    if kind != "started" or run_id != handle.run_id:
                        raise RuntimeError(f"expected run {handle.run_id}, got {kind} {run_id}")
                    await client.wait(handle, timeout=10.0)
                    if n >= settings.latency_warmup:
                        from_return[run_id] = (started - returned) / 1e6
                        from_call[run_id] = (started - called) / 1e6
        finally:
            stop.set()
            await asyncio.to_thread(join_all, [worker])
            receiver.close()
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 "
                "FROM cyclone_steps WHERE run_id = ANY(%s)",
                [list(from_return)],
            )
            db = [float(ms) for (ms,) in await cur.fetchall()]
        return {
            "db": db,
            "python_from_return": list(from_return.values()),
            "python_from_call": list(from_call.values()),
        }


async def measure(settings: Settings) -> tuple[list[PgbenchResult], dict[str, Any]]:
    """Every figure of the selected phases, in throwaway databases made and dropped here."""
    measured: dict[str, Any] = {}
    admin = settings.admin_dsn
    use_raw = "raw" in settings.phases
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(throwaway_database(admin, "bench_cyclone"))
        own = {conninfo_to_dict(dsn)["dbname"]}
        raw: RawLimit | None = None
        if use_raw:
            raw_dsn = stack.enter_context(throwaway_database(admin, "bench_raw"))
            own.add(conninfo_to_dict(raw_dsn)["dbname"])
            raw = RawLimit(raw_dsn, settings.scripts, seconds=settings.pgbench_seconds)
            await asyncio.to_thread(raw.create_schema)
        await asyncio.to_thread(cyclone.migrate, dsn)
        monitor = stack.enter_context(LoadMonitor(admin, {str(db) for db in own}))
        bench = Bench(settings, dsn, raw, monitor)
        if "enqueue" in settings.phases:
            measured["enqueue"] = await bench.enqueue()
        if "workers" in settings.phases:
            measured["workers"] = [await bench.throughput(n) for n in settings.processes]
        if "latency" in settings.phases:
            measured["latency"] = await bench.latency()
        if monitor.error:
            log(f"  (the load monitor stopped: {monitor.error})")
    return bench.raw_results, measured


# -- the report ------------------------------------------------------------------------


def _busy(figure: dict[str, Any]) -> str:
    share = figure.get("foreign", {}).get("busy_share")
    return "" if share is None else f"{share:.0%}"


def _limit(figure: dict[str, Any], script: str, *, latency: bool = False) -> dict[str, Any]:
    """The raw figure measured with ``figure`` as ``Row`` arguments (none if not run)."""
    found: PgbenchResult | None = figure.get("raw", {}).get(script)
    if found is None:
        return {}
    if latency:
        return {"raw_label": f"{found.label} latency", "raw_value": found.latency_ms}
    return {"raw_label": found.label, "raw_value": found.jobs_per_s}


def build_rows(settings: Settings, measured: dict[str, Any]) -> list[Row]:
    """Each Cyclone figure with the raw limit measured beside it, and its target."""
    rows: list[Row] = []
    for name, figure in measured.get("enqueue", {}).items():
        producers = figure["producers"]
        busy = _busy(figure)
        if name.startswith("enqueue_many"):
            raw_many = _limit(figure, "insert100.sql")
            label = f"enqueue_many of {settings.batch}, 1 producer"
            rows.append(Row(label, figure["jobs_per_s"], "jobs/s", busy=busy, **raw_many))
            continue
        rows.append(
            Row(
                f"enqueue, 1 per tx, {producers} producer{'s' * (producers > 1)}",
                figure["jobs_per_s"],
                "jobs/s",
                min_ratio=0.7,
                busy=busy,
                **_limit(figure, "insert1.sql"),
            )
        )
    for run in measured.get("workers", []):
        n, rate, busy = run["processes"], run["jobs_per_s"], _busy(run)
        figure = f"no-op jobs, {n} process{'es' * (n > 1)} x {run['slots']} slots"
        rows.append(
            Row(
                figure,
                rate,
                "jobs/s",
                min_ratio=0.5,
                busy=busy,
                **_limit(run, "claim_complete10.sql"),
            )
        )
        rows.append(
            Row("  same, vs batches of 1", rate, "jobs/s", **_limit(run, "claim_complete1.sql"))
        )
    latency = measured.get("latency")
    if latency:
        busy = _busy(latency)
        reference = _limit(latency, "insert1.sql", latency=True)
        for name, label in (
            ("db", "started_at - created_at"),
            ("python_from_return", "enqueue() return -> handler"),
        ):
            for pct, ceiling in (("p50", 1.0), ("p99", 5.0)):
                rows.append(
                    Row(
                        f"wake {pct}, {label}",
                        latency[name][pct],
                        "ms",
                        max_value=ceiling,
                        busy=busy,
                        **reference,
                    )
                )
        rows.append(
            Row("  p50, enqueue() call -> handler", latency["python_from_call"]["p50"], "ms")
        )
    return rows


def _to_json(value: Any) -> Any:
    if isinstance(value, PgbenchResult):
        return value.to_json()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def print_report(
    settings: Settings,
    server: dict[str, Any],
    rows: Sequence[Row],
    raw: Sequence[PgbenchResult],
    measured: dict[str, Any],
) -> None:
    """The table and the details below it, on stdout."""
    print()
    print(
        f"Cyclone {cyclone.__version__} vs raw PostgreSQL {server.get('server_version')} "
        f"on {os.cpu_count()} cores (synchronous_commit={server.get('synchronous_commit')}, "
        f"fsync={server.get('fsync')}); no-op: {settings.jobs:,} jobs, "
        f"claim_batch {settings.claim_batch or 'free slots'}, {settings.slots} slots/process"
    )
    print()
    print(render_table(rows))
    print()
    print(
        "ratio = Cyclone / raw; for latencies the raw figure is pgbench's mean latency of a "
        "single-row INSERT (one commit).\n"
        "busy = share of 0.5 s samples, during the raw+Cyclone pair, in which another "
        "database on the server had an active query."
    )
    if raw:
        print()
        print(f"raw limit runs (pgbench -n -M prepared, {settings.pgbench_seconds} s each):")
        for r in raw:
            cores = "?" if r.busy_cores is None else f"{r.busy_cores:.2f}"
            print(
                f"  {r.label:<26} {r.tps:>9,.0f} TPS  {r.jobs_per_s:>9,.0f} jobs/s  "
                f"latency {r.latency_ms:.3f} ms  machine busy {cores} cores"
            )
    for run_ in measured.get("workers", []):
        cores = run_["machine_busy_cores"]
        print(
            f"no-op, {run_['processes']} process(es): {run_['elapsed_s']:.2f} s from barrier to "
            f"last completion seen (database span {run_['db_span_s']:.2f} s = "
            f"{run_['db_span_jobs_per_s']:,.0f} jobs/s); worker CPU "
            f"{run_['worker_cpu_us_per_job']:.0f} us/job; machine busy "
            f"{'?' if cores is None else f'{cores:.2f}'} of {os.cpu_count()} cores"
        )
    latency = measured.get("latency")
    if latency:
        for name in ("db", "python_from_return", "python_from_call"):
            s = latency[name]
            print(
                f"latency {name:<18} n={s['count']}  p50 {s['p50']:.3f}  p90 {s['p90']:.3f}  "
                f"p99 {s['p99']:.3f}  mean {s['mean']:.3f}  max {s['max']:.3f} ms"
            )
    for run_ in measured.get("workers", []):
        if run_["profiles"]:
            print()
            print(f"py-spy, {run_['processes']} worker process(es):")
            print(profile_summary(Path(p) for p in run_["profiles"]))


def run(settings: Settings) -> dict[str, Any]:
    """Measure, print the report, write the JSON; the results as a dict."""
    started = datetime.now(UTC)
    log("measuring (raw figures right before the Cyclone figures they are compared with):")
    raw, measured = asyncio.run(measure(settings))
    rows = build_rows(settings, measured)
    server = server_settings(settings.admin_dsn)
    print_report(settings, server, rows, raw, measured)
    results = {
        **provenance(started, server, settings.to_json()),
        "raw": [r.to_json() for r in raw],
        "measured": measured,
        "rows": [row.to_json() for row in rows],
    }
    write_results(settings.results_dir, "jobs", started, results, default=_to_json)
    return results


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """The command line as :class:`Settings`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.jobs",
        description="Cyclone's job benchmark against the raw-PostgreSQL limit.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN; throwaway databases are made here")
    add("--raw-scripts", type=Path, default=DEFAULT_SCRIPTS, help="the shared pgbench scripts")
    add("--pgbench-seconds", type=int, default=3, help="length of each pgbench run")
    add("--enqueue-seconds", type=float, default=3.0, help="length of each enqueue measurement")
    add("--producers", type=int, default=4, help="concurrent producers of the second enqueue run")
    add("--batch", type=int, default=100, help="inputs per enqueue_many call")
    add("--jobs", type=int, default=20_000, help="no-op runs each worker measurement drains")
    add("--processes", type=int, nargs="+", default=[1, 2], help="worker processes per run")
    add("--slots", type=int, default=20, help="worker slots per process")
    add("--claim-batch", type=int, help="steps per claim statement (default: the free slots)")
    add("--poll-interval", type=float, default=1.0, help="workers' poll interval (s)")
    add("--count-interval", type=float, default=0.05, help="completed-count poll interval (s)")
    add("--worker-timeout", type=float, default=60.0, help="give up on a no-op run after (s)")
    add("--latency-jobs", type=int, default=300, help="probe runs measured for latency")
    add("--latency-warmup", type=int, default=20, help="probe runs before measuring")
    add("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="what to measure")
    add("--py-spy", type=Path, default=None, metavar="DIR", help="profile no-op workers into DIR")
    add("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    return Settings(
        admin_dsn=args.dsn,
        scripts=args.raw_scripts,
        pgbench_seconds=args.pgbench_seconds,
        enqueue_seconds=args.enqueue_seconds,
        producers=args.producers,
        batch=args.batch,
        jobs=args.jobs,
        processes=tuple(args.processes),
        slots=args.slots,
        claim_batch=args.claim_batch,
        poll_interval=args.poll_interval,
        count_interval=args.count_interval,
        worker_timeout=args.worker_timeout,
        latency_jobs=args.latency_jobs,
        latency_warmup=args.latency_warmup,
        phases=tuple(args.phases),
        py_spy=args.py_spy,
        results_dir=args.results_dir,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.jobs``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
