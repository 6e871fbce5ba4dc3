"""The static-DAG benchmark: no-op workflow steps against no-op standalone jobs.

``python -m bench.dag [--dsn ADMIN_DSN] [options]`` measures, in a throwaway database
(``cyclone.migrate``; dropped at the end), with the workflows of :mod:`bench.dag_app`:

1. **Drains.** For each workload and each count of worker *processes* (``--processes``;
   ``--slots`` slots and ``--claim-batch`` each, :func:`bench.dag_app.dag_worker`):

   a. the baseline: as many standalone no-op jobs as the workload has steps, enqueued
      with ``enqueue_many`` (the same ``@cyclone.step`` kind the DAG nodes run);
   b. the DAG: the workload's runs, each submitted with ``Client.submit``.

   Each starts from emptied tables (TRUNCATE, CHECKPOINT); the whole backlog is written
   first, then vacuumed, analyzed and checkpointed, then the worker processes start
   together at a barrier, as in ``python -m bench.jobs``. The drain ends when every run
   is completed (``cyclone_runs``, polled every ``--count-interval`` s). The figure is
   steps/s over the span on the database's clock: first ``started_at`` to last
   ``completed_at`` of ``cyclone_steps``, so neither the submits nor the worker start-up
   count (a DAG's pending steps are created at submit, long before the drain, which is
   why ``created_at`` is not the start); the time from the barrier to the last
   completion seen is recorded too. The workloads:

   * ``chain``: ``--runs`` runs of a 10-step chain ``n0 -> n1 -> ... -> n9``;
   * ``wide``: ``--wide-runs`` runs of ``root -> 100 middle nodes -> sink``, the sink's
     input the hundred outputs (``inputs=[...]``).

   Baseline and DAG of one workload and process count run back to back, so that drift
   of a shared machine hits both alike; a monitor (:mod:`bench.monitor`) records how much
   foreign database activity each pair ran beside (the ``busy`` column).
2. **The DAG overhead per step**: ``1/dag_steps_per_s - 1/jobs_steps_per_s`` in
   microseconds, at the same process count (time, not CPU; the worker CPU per step of
   both is printed beside it).
3. **Submit time** of one 1,000-node DAG (a chain of 1,000, and ``root -> 998 -> sink``)
   with no worker running: the first submit of a client (which compiles the workflow),
   then the median, min and max of ``--submit-repeats`` more.

The report goes to stdout and, as JSON, to ``bench/results/dag-<timestamp>.json``;
progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import cyclone
from bench.cpu import BackendCpu
from bench.dag_app import NOOP_STEP, WORKFLOWS, chain, dag_worker, wide
from bench.dag_report import print_report
from bench.db import DEFAULT_ADMIN_DSN, execute, log, server_settings, throwaway_database
from bench.drain import reset_tables
from bench.fleet import started_together
from bench.jobs import RESULTS_DIR
from bench.jobs_report import to_json
from bench.monitor import LoadMonitor, busy_cores, machine_cpu
from bench.raw import DEFAULT_SCRIPTS, RawLimit
from bench.report import provenance, write_results

__all__ = ["Settings", "Workload", "main", "measure", "run"]

WORKLOADS = ("chain", "wide")
PHASES = (*WORKLOADS, "submit")
_BACKLOG_CHUNK = 1_000  # jobs per enqueue_many call when filling the baseline backlog
_SUBMIT_NODES = 1_000  # nodes of the submit probes
_TABLES = "cyclone_runs, cyclone_steps, cyclone_deps, cyclone_step_inputs"


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run is configured with (see ``--help``)."""

    admin_dsn: str
    runs: int
    wide_runs: int
    processes: tuple[int, ...]
    slots: int
    claim_batch: int | None
    poll_interval: float
    count_interval: float
    worker_timeout: float
    submit_repeats: int
    phases: tuple[str, ...]
    results_dir: Path
    scripts: Path = DEFAULT_SCRIPTS
    pgbench_seconds: int = 3
    """Length of each raw-limit run; 0: no raw limit."""

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (paths as strings, no DSN secrets)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "admin_dsn"}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


@dataclass(frozen=True, slots=True)
class Workload:
    """``runs`` runs of one of :data:`bench.dag_app.WORKFLOWS`."""

    name: str
    workflow: cyclone.Workflow
    runs: int

    @property
    def nodes(self) -> int:
        """Steps per run."""
        return len(self.workflow.nodes)

    @property
    def steps(self) -> int:
        """Steps of all runs: also the baseline's job count."""
        return self.runs * self.nodes

    @property
    def label(self) -> str:
        """E.g. ``chain 10 x 300 runs``."""
        shape = "chain 10" if self.name == "chain" else f"wide 1-{self.nodes - 2}-1"
        return f"{shape} x {self.runs} runs"


# -- backlogs --------------------------------------------------------------------------


async def _settle(dsn: str) -> None:
    """After a backlog is written: fresh statistics, no dead rows, a clean checkpoint."""
    await asyncio.to_thread(execute, dsn, f"VACUUM ANALYZE {_TABLES}", "CHECKPOINT")


async def fill_jobs(dsn: str, jobs: int) -> float:
    """A backlog of ``jobs`` standalone no-op steps; the seconds the enqueue took."""
    await reset_tables(dsn)
    async with cyclone.Client(dsn) as producer:
        began = time.perf_counter()
        for first in range(0, jobs, _BACKLOG_CHUNK):
            await producer.enqueue_many(NOOP_STEP, [{}] * min(_BACKLOG_CHUNK, jobs - first))
        took = time.perf_counter() - began
    await _settle(dsn)
    return took


async def fill_runs(dsn: str, workload: Workload) -> float:
    """A backlog of the workload's runs, one ``submit`` each; the seconds they took."""
    await reset_tables(dsn)
    # registers nothing: a client that registers a workflow registers its kinds, and
    # would start running the steps as they are submitted
    async with cyclone.Client(dsn) as producer:
        began = time.perf_counter()
        for _ in range(workload.runs):
            await producer.submit(workload.workflow, {})
        took = time.perf_counter() - began
    await _settle(dsn)
    return took


# -- drains ----------------------------------------------------------------------------

_PROGRESS = """
SELECT count(*) FILTER (WHERE state = 'completed'),
       count(*) FILTER (WHERE state IN ('failed', 'cancelled'))
FROM cyclone_runs
"""
_STARTED = "SELECT count(*) FROM cyclone_steps WHERE started_at IS NOT NULL"
_STEPS = """
SELECT count(*) FILTER (WHERE state = 'completed'), count(*),
       extract(epoch FROM max(completed_at) - min(started_at))::float8
FROM cyclone_steps
"""


async def _fetch(conn: psycopg.AsyncConnection[Any], query: str) -> tuple[Any, ...]:
    cur = await conn.execute(query)
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


async def drain(settings: Settings, dsn: str, processes: int, runs: int) -> dict[str, Any]:
    """Start ``processes`` workers at a barrier and time them through ``runs`` runs."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        (started,) = await _fetch(conn, _STARTED)
    if started:  # the span would start before the barrier
        raise RuntimeError(f"{started} steps of the backlog ran before the workers started")
    options = {
        "slots": settings.slots,
        "claim_batch": settings.claim_batch,
        "poll_interval": settings.poll_interval,
    }
    server: BackendCpu | None = None
    try:
        async with started_together(dag_worker, [(dsn,)] * processes, options) as fleet:
            server = await asyncio.to_thread(BackendCpu(dsn, "cyclone").start)
            began = time.perf_counter()
            cpu_before = machine_cpu()
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while True:
                    completed, failed = await _fetch(conn, _PROGRESS)
                    if completed + failed >= runs:
                        break
                    if not fleet.alive():
                        raise RuntimeError("a worker process died; see its output above")
                    if time.perf_counter() - began > settings.worker_timeout:
                        raise TimeoutError(
                            f"{completed} of {runs} runs completed in {settings.worker_timeout} s"
                        )
                    await asyncio.sleep(settings.count_interval)
                elapsed = time.perf_counter() - began
                cores = busy_cores(cpu_before, machine_cpu())
                server_cpu = await asyncio.to_thread(server.stop)  # before the workers stop
                done, steps, span = await _fetch(conn, _STEPS)
    finally:
        if server is not None:
            server.stop()
    if failed or done != steps:
        raise RuntimeError(f"{failed} runs failed, {steps - done} of {steps} steps not completed")
    span = float(span) if span else elapsed
    worker_cpu = fleet.cpu_s
    return {
        "processes": processes,
        "runs": runs,
        "steps": steps,
        "elapsed_s": elapsed,
        "steps_per_s": steps / elapsed,
        "db_span_s": span,
        "db_span_steps_per_s": steps / span,
        "worker_cpu_s": worker_cpu,
        "worker_cpu_us_per_step": 1e6 * sum(worker_cpu) / steps,
        "server_cpu": server_cpu.to_json(),
        "server_cpu_us_per_step": server_cpu.us_per(steps),
        "machine_busy_cores": cores,
    }


async def pair(
    settings: Settings,
    dsn: str,
    monitor: LoadMonitor,
    workload: Workload,
    processes: int,
    *,
    raw: RawLimit | None = None,
) -> dict[str, Any]:
    """The raw limit (``claim_complete10.sql``, one client per process), the baseline
    jobs, then the DAG runs, of one workload with ``processes`` workers."""
    with monitor.window() as foreign:
        limit = None
        if raw is not None:
            limit = await asyncio.to_thread(raw.measure, "claim_complete10.sql", processes)
            log(f"  raw {limit.label:<24} {limit.jobs_per_s:>8,.0f} jobs/s")
        fill = await fill_jobs(dsn, workload.steps)
        jobs = await drain(settings, dsn, processes, workload.steps)
        jobs["enqueue_s"] = fill
        log(_progress(f"jobs, {workload.steps} of them", jobs))
        fill = await fill_runs(dsn, workload)
        dag = await drain(settings, dsn, processes, workload.runs)
        dag["submit_s"] = fill
        log(_progress(workload.label, dag))
    overhead = 1e6 * (1 / dag["db_span_steps_per_s"] - 1 / jobs["db_span_steps_per_s"])
    cpu_overhead = dag["worker_cpu_us_per_step"] - jobs["worker_cpu_us_per_step"]
    log(f"    DAG overhead {overhead:+.0f} us/step (worker CPU {cpu_overhead:+.0f} us/step)")
    return {
        "workload": workload.name,
        "label": workload.label,
        "nodes": workload.nodes,
        "processes": processes,
        "jobs": jobs,
        "dag": dag,
        "overhead_us_per_step": overhead,
        "cpu_overhead_us_per_step": cpu_overhead,
        "raw": limit,
        "foreign": foreign,
    }


def _progress(what: str, result: dict[str, Any]) -> str:
    return (
        f"  {what:<28} {result['processes']} process(es) {result['db_span_steps_per_s']:>8,.0f}"
        f" steps/s (span {result['db_span_s']:.2f} s, worker CPU "
        f"{result['worker_cpu_us_per_step']:.0f} us/step, server CPU "
        f"{result['server_cpu_us_per_step'] or 0:.0f} us/step)"
    )


# -- submit time -----------------------------------------------------------------------


async def submit_times(settings: Settings, dsn: str) -> dict[str, Any]:
    """Submit time of one 1,000-node DAG, chain and wide, with no worker running."""
    shapes = {
        "chain": chain(_SUBMIT_NODES, name="bench_submit_chain"),
        "wide": wide(_SUBMIT_NODES - 2, name="bench_submit_wide"),
    }
    found: dict[str, Any] = {}
    for name, workflow in shapes.items():
        await reset_tables(dsn)
        async with cyclone.Client(dsn) as producer:  # registers nothing: compiles at submit
            began = time.perf_counter()
            await producer.submit(workflow, {})
            first = 1e3 * (time.perf_counter() - began)
            samples = []
            for _ in range(settings.submit_repeats):
                began = time.perf_counter()
                await producer.submit(workflow, {})
                samples.append(1e3 * (time.perf_counter() - began))
        found[name] = {
            "nodes": len(workflow.nodes),
            "edges": sum(len(spec.deps) for spec in workflow.nodes.values()),
            "first_ms": first,
            "median_ms": statistics.median(samples),
            "min_ms": min(samples),
            "max_ms": max(samples),
            "samples_ms": samples,
        }
        log(
            f"  submit {name} of {_SUBMIT_NODES} nodes: first {first:.1f} ms, "
            f"median {found[name]['median_ms']:.1f} ms of {len(samples)}"
        )
    await reset_tables(dsn)
    return found


# -- the run ---------------------------------------------------------------------------


def workloads(settings: Settings) -> list[Workload]:
    """The selected workloads with their run counts."""
    counts = {"chain": settings.runs, "wide": settings.wide_runs}
    return [
        Workload(name, WORKFLOWS[name], counts[name])
        for name in WORKLOADS
        if name in settings.phases
    ]


async def measure(settings: Settings) -> dict[str, Any]:
    """Every figure of the selected phases, in a throwaway database made and dropped here."""
    measured: dict[str, Any] = {"pairs": []}
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(throwaway_database(settings.admin_dsn, "bench_dag"))
        await asyncio.to_thread(cyclone.migrate, dsn)
        own = {str(conninfo_to_dict(dsn)["dbname"])}
        raw: RawLimit | None = None
        if settings.pgbench_seconds and workloads(settings):
            raw_dsn = stack.enter_context(throwaway_database(settings.admin_dsn, "bench_raw"))
            own.add(str(conninfo_to_dict(raw_dsn)["dbname"]))
            raw = RawLimit(raw_dsn, settings.scripts, seconds=settings.pgbench_seconds)
            await asyncio.to_thread(raw.create_schema)
        monitor = stack.enter_context(LoadMonitor(settings.admin_dsn, own))
        for workload in workloads(settings):
            for processes in settings.processes:
                measured["pairs"].append(
                    await pair(settings, dsn, monitor, workload, processes, raw=raw)
                )
        if "submit" in settings.phases:
            measured["submit"] = await submit_times(settings, dsn)
        if monitor.error:
            log(f"  (the load monitor stopped: {monitor.error})")
    return measured


def run(settings: Settings) -> dict[str, Any]:
    """Measure, print the report, write the JSON; the results as a dict."""
    started = datetime.now(UTC)
    log("measuring (baseline jobs right before the DAG runs they are compared with):")
    measured = asyncio.run(measure(settings))
    server = server_settings(settings.admin_dsn)
    print_report(settings, server, measured)
    results = {
        **provenance(started, server, settings.to_json()),
        "measured": measured,
    }
    write_results(settings.results_dir, "dag", started, results, default=to_json)
    return results


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """The command line as :class:`Settings`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.dag",
        description="Cyclone's static-DAG benchmark against standalone jobs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN; a throwaway database is made here")
    add("--runs", type=int, default=300, help="runs of the 10-step chain per drain")
    add("--wide-runs", type=int, default=30, help="runs of the 1-100-1 DAG per drain")
    add("--processes", type=int, nargs="+", default=[1, 2], help="worker processes per drain")
    add("--slots", type=int, default=20, help="worker slots per process")
    add("--claim-batch", type=int, help="steps per claim statement (default: the free slots)")
    add("--poll-interval", type=float, default=1.0, help="workers' poll interval (s)")
    add("--count-interval", type=float, default=0.05, help="completed-count poll interval (s)")
    add("--worker-timeout", type=float, default=120.0, help="give up on a drain after (s)")
    add("--submit-repeats", type=int, default=10, help="timed submits of each 1,000-node DAG")
    add("--raw-scripts", type=Path, default=DEFAULT_SCRIPTS, help="raw-limit pgbench scripts")
    add("--pgbench-seconds", type=int, default=3, help="raw-limit run length (0: none)")
    add("--phases", nargs="+", choices=PHASES, default=list(PHASES), help="what to measure")
    add("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    if min(args.runs, args.wide_runs, args.submit_repeats, *args.processes) < 1:
        parser.error("--runs, --wide-runs, --submit-repeats and --processes must be >= 1")
    return Settings(
        admin_dsn=args.dsn,
        runs=args.runs,
        wide_runs=args.wide_runs,
        processes=tuple(args.processes),
        slots=args.slots,
        claim_batch=args.claim_batch,
        poll_interval=args.poll_interval,
        count_interval=args.count_interval,
        worker_timeout=args.worker_timeout,
        submit_repeats=args.submit_repeats,
        phases=tuple(args.phases),
        results_dir=args.results_dir,
        scripts=args.raw_scripts,
        pgbench_seconds=args.pgbench_seconds,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.dag``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
