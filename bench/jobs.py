"""The job-engine benchmark: Cyclone against the raw-PostgreSQL limit, in one run.

``python -m bench.jobs [--dsn ADMIN_DSN] [options]`` measures, on this machine:

1. **The raw limit** (:mod:`bench.raw`): the pgbench scripts of bench/raw-postgres, unchanged, in a
   throwaway database: single-row INSERT (``insert1.sql``) with 1 and ``--producers``
   clients, 100-row INSERT (``insert100.sql``) with 1 client, and claim+complete in
   batches of 1 and of 10 (``claim_complete1.sql``, ``claim_complete10.sql``) with as
   many clients as there are worker processes in each Cyclone run, refilled before each,
   with the server CPU time of pgbench's backends. jobs/s = TPS x jobs per transaction.
   Each raw figure is measured right before the Cyclone figure it is compared with, so
   that drift of a shared machine hits both alike, and a monitor (:mod:`bench.monitor`)
   records the foreign database activity (``busy``) and the load average (``load``)
   each pair ran beside. The raw wake probe (:mod:`bench.wake`) runs beside Cyclone's
   wake latency.
2. **Cyclone**, ``--repeats`` times each, the repeats interleaved (figure A, figure B,
   figure A, figure B, ...), each figure reported as the median of its repeats:

   a. enqueue/s, one run per transaction (``Client.enqueue``, which also sends the
      wakeup NOTIFY after commit): one producer, then ``--producers`` concurrent producer
      tasks sharing one client, each into emptied, checkpointed tables for
      ``--enqueue-seconds`` after a short warm-up;
   b. enqueue/s batched: ``Client.enqueue_many`` of ``--batch`` inputs, one producer;
   c. no-op jobs/s (:mod:`bench.drain`): for each count of ``--retained`` runs and each
      count of worker *processes* (``--processes``; ``--slots`` slots and
      ``--claim-batch`` each), in a fresh throwaway database: that many retained
      terminal runs (:mod:`bench.retained`; ``--stale-stats``), then ``--jobs`` available
      runs, then the workers start together at a barrier and the time runs until every
      one of the ``--jobs`` runs is completed. Worker CPU (getrusage) and server CPU
      (their backends, :mod:`bench.cpu`) per job are recorded too;
   d. ``--grid``: the no-op drain for every cell of slots {10, 50, 100} x claim_batch
      {10, 50}, and once with the client's defaults (neither given), at each process
      count;
   e. enqueue-to-start latency with one idle, LISTENING worker process:
      ``--latency-jobs`` probe runs (after ``--latency-warmup``) per repeat, one at a
      time; each is enqueued, its handler's start awaited, then the run's completion
      (``Client.wait``), so the worker is idle again before the next. Two measures:
      ``started_at - created_at`` of the step (the database's clock), and from
      ``enqueue()`` returning in this process to the handler starting in the worker
      (CLOCK_MONOTONIC, sent back through a pipe), beside the raw probe's.

   With ``--pooler``, a, b, c and e run again through a PgBouncer in transaction mode
   (clients built with ``pooler="transaction"``), labelled ``pooler``.
3. **The report** (:mod:`bench.jobs_report`): each figure beside its reference, the
   ratio and the target, on stdout, and as JSON in ``bench/results/jobs-<timestamp>.json``.
   Progress goes to stderr.

``--py-spy DIR`` samples every worker process of the drains with py-spy while it holds
the GIL and prints where that time goes; ``--phases`` runs a subset.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg.conninfo import conninfo_to_dict

import cyclone
from bench.db import (
    DEFAULT_ADMIN_DSN,
    log,
    server_settings,
    throwaway_database,
    transaction_pooler,
)
from bench.drain import (
    DrainOptions,
    WorkerConfig,
    db_span,
    fill_backlog,
    noop_drain,
    reset_tables,
    wait_completed,
)
from bench.jobs_report import build_rows, print_report, to_json
from bench.monitor import LoadMonitor
from bench.raw import CLAIM_SCRIPTS, DEFAULT_SCRIPTS, PgbenchResult, RawLimit
from bench.report import provenance, write_results
from bench.retained import fill_retained
from bench.wake import cyclone_wake, raw_wake
from bench.workers import NOOP_KIND, QUEUE, noop

__all__ = [
    "DIRECT",
    "GRID",
    "Bench",
    "DrainOptions",
    "Settings",
    "Via",
    "db_span",
    "fill_backlog",
    "main",
    "measure",
    "reset_tables",
    "run",
    "wait_completed",
]

PHASES = ("raw", "enqueue", "workers", "latency")
RESULTS_DIR = Path(__file__).resolve().parent / "results"
GRID = tuple((slots, batch) for slots in (10, 50, 100) for batch in (10, 50))
"""The cells of ``--grid``: (slots, claim_batch)."""


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
    retained: tuple[int, ...] = (0,)
    stale_stats: bool = False
    repeats: int = 1
    grid: bool = False
    pooler: bool = False
    pooler_pool_size: int = 20
    pooler_latency_jobs: int = 30

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (paths as strings, no DSN secrets)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "admin_dsn"}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


@dataclass(frozen=True, slots=True)
class Via:
    """How Cyclone's clients reach a database: directly, or through a pooler."""

    name: str
    to_client: Callable[[str], str]
    """A direct DSN to the DSN the clients use."""
    pooler: str | None = None
    """The clients' ``pooler=``."""


DIRECT = Via("direct", lambda dsn: dsn)


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


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


class Bench:
    """One run: the Cyclone database, the raw-limit databases, and the figures so far.

    Each raw figure is measured right before the Cyclone figure it is compared with, so
    that drift of a shared machine (flush latency, other sessions) hits both alike; the
    foreign activity seen during each pair is kept with the Cyclone figure.
    """

    def __init__(
        self,
        settings: Settings,
        dsn: str,
        raw: RawLimit | None,
        monitor: LoadMonitor,
        *,
        wake_dsn: str | None = None,
    ) -> None:
        self.settings = settings
        self.dsn = dsn
        self.raw = raw
        self.monitor = monitor
        self.wake_dsn = wake_dsn
        self.raw_results: list[PgbenchResult] = []

    def config(
        self, via: Via = DIRECT, *, slots: int | None = -1, claim_batch: int | None = -1
    ) -> WorkerConfig:
        """The workers' client settings: ``--slots`` and ``--claim-batch`` unless given
        (``None``: the client's default)."""
        s = self.settings
        return WorkerConfig(
            slots=s.slots if slots == -1 else slots,
            claim_batch=s.claim_batch if claim_batch == -1 else claim_batch,
            poll_interval=s.poll_interval,
            pooler=via.pooler,
        )

    async def limits(self, scripts: Sequence[str], clients: int) -> dict[str, PgbenchResult]:
        """The raw figures of ``scripts`` with ``clients`` (none when raw is skipped)."""
        found: dict[str, PgbenchResult] = {}
        if self.raw is None:
            return found
        for script in scripts:
            result = await asyncio.to_thread(self.raw.measure, script, clients)
            self.raw_results.append(result)
            found[script] = result
            cpu = result.server_cpu_us_per_job
            log(
                f"  raw     {result.label:<26} {result.jobs_per_s:>10,.0f} jobs/s"
                + ("" if cpu is None else f"  server CPU {cpu:.0f} us/job")
            )
        return found

    # -- a, b: enqueue -------------------------------------------------------------

    async def enqueue(self, via: Via = DIRECT) -> list[dict[str, Any]]:
        """Enqueue/s one per transaction (1 and N producers) and with ``enqueue_many``;
        one sample per figure and repeat."""
        settings = self.settings
        inputs: list[dict[str, Any]] = [{}] * settings.batch
        warmup = min(0.5, settings.enqueue_seconds / 4)
        samples: list[dict[str, Any]] = []
        async with cyclone.Client(via.to_client(self.dsn), pooler=via.pooler) as client:

            async def one() -> int:
                await client.enqueue(NOOP_KIND, {})
                return 1

            async def many() -> int:
                await client.enqueue_many(NOOP_KIND, inputs)
                return len(inputs)

            plan: list[tuple[str, Callable[[], Awaitable[int]], int, str]] = [
                ("enqueue_1_producer", one, 1, "insert1.sql"),
                (f"enqueue_{settings.producers}_producers", one, settings.producers, "insert1.sql"),
                (f"enqueue_many_{settings.batch}", many, 1, "insert100.sql"),
            ]
            for repeat in range(settings.repeats):
                for name, call, tasks, script in plan:
                    with self.monitor.window() as foreign:
                        paired = await self.limits([script], tasks)
                        await reset_tables(self.dsn)
                        await sustained_rate(call, tasks, warmup)
                        rate = await sustained_rate(call, tasks, settings.enqueue_seconds)
                    samples.append(
                        {
                            "name": name,
                            "repeat": repeat,
                            "producers": tasks,
                            "batch": len(inputs) if call is many else 1,
                            "jobs_per_s": rate,
                            "raw": paired,
                            "foreign": foreign,
                        }
                    )
                    log(f"  cyclone {via.name} {name:<26} {rate:>10,.0f} jobs/s")
        return samples

    # -- c, d: no-op drains --------------------------------------------------------

    async def throughput(self, processes: int) -> dict[str, Any]:
        """One no-op drain of ``--jobs`` runs in this run's database (``bench.bloat``'s
        peak), with the raw claim figures measured right before."""
        settings = self.settings
        with self.monitor.window() as foreign:
            paired = await self.limits(list(CLAIM_SCRIPTS), processes)
            await fill_backlog(self.dsn, settings.jobs)
            result = await noop_drain(
                self.dsn,
                processes=processes,
                jobs=settings.jobs,
                config=self.config(),
                count_interval=settings.count_interval,
                worker_timeout=settings.worker_timeout,
                py_spy=settings.py_spy,
            )
        result["raw"] = paired
        result["foreign"] = foreign
        log(f"  cyclone no-op, {processes} process(es)     {result['jobs_per_s']:>10,.0f} jobs/s")
        return result

    async def drain_fresh(
        self, processes: int, config: WorkerConfig, *, retained: int, via: Via = DIRECT
    ) -> dict[str, Any]:
        """A no-op drain in a fresh database holding ``retained`` terminal runs."""
        settings = self.settings
        with throwaway_database(settings.admin_dsn, "bench_drain") as dsn:
            self.monitor.own(_dbname(dsn))
            await asyncio.to_thread(cyclone.migrate, dsn)
            history = await fill_retained(dsn, retained, stale_stats=settings.stale_stats)
            backlog_s = await fill_backlog(
                dsn, settings.jobs, reset=False, settle=not settings.stale_stats
            )
            result = await noop_drain(
                dsn,
                processes=processes,
                jobs=settings.jobs,
                config=config,
                worker_dsn=via.to_client(dsn),
                count_interval=settings.count_interval,
                worker_timeout=settings.worker_timeout,
                py_spy=settings.py_spy,
            )
        result["retained"] = history
        result["backlog_s"] = backlog_s
        cpu = result["server_cpu_us_per_job"]
        log(
            f"  cyclone {via.name} no-op {processes} proc, {config.label}, {retained:,} "
            f"retained: {result['jobs_per_s']:>8,.0f} jobs/s; worker CPU "
            f"{result['worker_cpu_us_per_job']:.0f} us/job, server CPU "
            f"{'?' if cpu is None else f'{cpu:.0f}'} us/job"
            + (f" (retained written in {history['fill_s']:.2f} s)" if retained else "")
        )
        return result

    async def noop(self, via: Via = DIRECT) -> list[dict[str, Any]]:
        """The no-op drains: repeats x ``--retained`` x ``--processes``, interleaved."""
        settings = self.settings
        samples = []
        for repeat in range(settings.repeats):
            for retained in settings.retained:
                for processes in settings.processes:
                    with self.monitor.window() as foreign:
                        paired = await self.limits(list(CLAIM_SCRIPTS), processes)
                        result = await self.drain_fresh(
                            processes, self.config(via), retained=retained, via=via
                        )
                    samples.append(
                        {
                            **result,
                            "repeat": repeat,
                            "retained_runs": retained,
                            "raw": paired,
                            "foreign": foreign,
                        }
                    )
        return samples

    async def grid(self) -> dict[str, Any]:
        """The no-op drain over :data:`GRID` and with the client's defaults."""
        settings = self.settings
        defaults = cyclone.Client(self.dsn, handlers=[noop])
        configs = [self.config(slots=s, claim_batch=b) for s, b in GRID]
        configs.append(self.config(slots=None, claim_batch=None))
        samples = []
        for repeat in range(settings.repeats):
            for processes in settings.processes:
                with self.monitor.window() as foreign:
                    paired = await self.limits(["claim_complete10.sql"], processes)
                for config in configs:
                    with self.monitor.window() as seen:
                        result = await self.drain_fresh(processes, config, retained=0)
                    samples.append(
                        {
                            **result,
                            "repeat": repeat,
                            "defaults": config.slots is None,
                            "raw": paired,
                            "raw_foreign": foreign,
                            "foreign": seen,
                        }
                    )
        return {
            "samples": samples,
            "client_defaults": {
                "slots": defaults.queues[QUEUE],
                "claim_batch": defaults.claim_batch,
            },
        }

    # -- e: wake latency -----------------------------------------------------------

    async def latency(self, via: Via = DIRECT) -> dict[str, Any]:
        """Enqueue-to-start latency with one idle LISTENING worker process, both ways,
        and the raw wake probe right before it, ``--repeats`` times; samples pooled."""
        settings = self.settings
        pooled = via.pooler is not None
        jobs = settings.pooler_latency_jobs if pooled else settings.latency_jobs
        warmup = min(settings.latency_warmup, 5) if pooled else settings.latency_warmup
        samples: dict[str, list[float]] = {}
        raw_samples: list[float] = []
        paired: list[dict[str, PgbenchResult]] = []
        with self.monitor.window() as foreign:
            for _ in range(settings.repeats):
                paired.append(await self.limits(["insert1.sql"], 1))
                if self.wake_dsn is not None:
                    raw_samples += await asyncio.to_thread(
                        raw_wake,
                        self.wake_dsn,
                        settings.scripts,
                        jobs=settings.latency_jobs,
                        warmup=settings.latency_warmup,
                    )
                await reset_tables(self.dsn)
                found = await cyclone_wake(
                    self.dsn,
                    self.config(via),
                    client_dsn=via.to_client(self.dsn),
                    jobs=jobs,
                    warmup=warmup,
                )
                for name, values in found.items():
                    samples.setdefault(name, []).extend(values)
        result: dict[str, Any] = {
            "jobs": len(samples.get("db", [])),
            "samples_ms": samples,
            "raw_wake_ms": raw_samples,
            "raw": paired,
            "foreign": foreign,
        }
        log(f"  cyclone {via.name} latency: {result['jobs']} probes")
        return result


async def _phases(bench: Bench, via: Via) -> dict[str, Any]:
    phases = bench.settings.phases
    found: dict[str, Any] = {}
    if "enqueue" in phases:
        found["enqueue"] = await bench.enqueue(via)
    if "workers" in phases:
        found["workers"] = await bench.noop(via)
    if "latency" in phases:
        found["latency"] = await bench.latency(via)
    return found


async def measure(settings: Settings) -> tuple[list[PgbenchResult], dict[str, Any]]:
    """Every figure of the selected phases, in throwaway databases made and dropped here."""
    admin = settings.admin_dsn
    use_raw = "raw" in settings.phases
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(throwaway_database(admin, "bench_cyclone"))
        own = {_dbname(dsn)}
        raw: RawLimit | None = None
        wake_dsn: str | None = None
        if use_raw:
            raw_dsn = stack.enter_context(throwaway_database(admin, "bench_raw"))
            own.add(_dbname(raw_dsn))
            raw = RawLimit(raw_dsn, settings.scripts, seconds=settings.pgbench_seconds)
            await asyncio.to_thread(raw.create_schema)
            if "latency" in settings.phases:
                wake_dsn = stack.enter_context(throwaway_database(admin, "bench_wake"))
                own.add(_dbname(wake_dsn))
                wake = RawLimit(wake_dsn, settings.scripts, seconds=settings.pgbench_seconds)
                await asyncio.to_thread(wake.create_schema, fill=False)
        await asyncio.to_thread(cyclone.migrate, dsn)
        monitor = stack.enter_context(LoadMonitor(admin, own))
        bench = Bench(settings, dsn, raw, monitor, wake_dsn=wake_dsn)
        measured = await _phases(bench, DIRECT)
        if settings.grid:
            measured["grid"] = await bench.grid()
        if settings.pooler:
            to_client = stack.enter_context(
                transaction_pooler(admin, pool_size=settings.pooler_pool_size)
            )
            log("through PgBouncer (pool_mode = transaction):")
            measured["pooler"] = await _phases(bench, Via("pooler", to_client, "transaction"))
        if monitor.error:
            log(f"  (the load monitor stopped: {monitor.error})")
    return bench.raw_results, measured


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
    write_results(settings.results_dir, "jobs", started, results, default=to_json)
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
    add("--raw-scripts", type=Path, default=DEFAULT_SCRIPTS, help="raw-limit pgbench scripts")
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
    add("--retained", type=int, nargs="+", default=[0], metavar="N", help="retained runs")
    add("--stale-stats", action="store_true", help="keep the empty tables' statistics")
    add("--repeats", type=int, default=3, help="interleaved repeats of each figure (median)")
    add("--grid", action="store_true", help="no-op drains over slots x claim_batch")
    add("--pooler", action="store_true", help="again through PgBouncer, transaction mode")
    add("--pooler-pool-size", type=int, default=20, help="PgBouncer's default_pool_size")
    add("--pooler-latency-jobs", type=int, default=30, help="latency probes via the pooler")
    add("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="what to measure")
    add("--py-spy", type=Path, default=None, metavar="DIR", help="profile no-op workers into DIR")
    add("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    if min(args.repeats, args.jobs, args.batch, *args.processes) < 1:
        parser.error("--repeats, --jobs, --batch and --processes must be >= 1")
    if min(args.retained) < 0:
        parser.error("--retained counts must be >= 0")
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
        retained=tuple(dict.fromkeys(args.retained)),
        stale_stats=args.stale_stats,
        repeats=args.repeats,
        grid=args.grid,
        pooler=args.pooler,
        pooler_pool_size=args.pooler_pool_size,
        pooler_latency_jobs=args.pooler_latency_jobs,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.jobs``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
