"""The report of ``python -m bench.dag``: the figures with their targets, the pair table
and the submit times.

The first table (:func:`build_rows`, :class:`bench.report.Row`) gives each figure beside
its reference: a DAG's steps/s and CPU per step beside the standalone jobs drained right
before by the same workers (server CPU per chain step: at most 1.3x a job's), the jobs
beside the raw limit (``claim_complete10.sql`` at as many pgbench clients as worker
processes, measured right before them), and the 1,000-node chain's submit time (median
of the submits after the first: at most 30 ms).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import cyclone
from bench.raw import PgbenchResult
from bench.report import Row, render_table, text_table

if TYPE_CHECKING:
    from bench.dag import Settings

__all__ = ["CHAIN_CPU_RATIO", "SUBMIT_CEILING_MS", "build_rows", "print_report"]

CHAIN_CPU_RATIO = 1.3
"""Target: server CPU per chain step at most this times that of a standalone job."""
SUBMIT_CEILING_MS = 30.0
"""Target: the 1,000-node chain's median submit time, in milliseconds."""


def _busy(pair: dict[str, Any]) -> dict[str, Any]:
    foreign = pair.get("foreign", {})
    share, load = foreign.get("busy_share"), foreign.get("load_avg")
    return {
        "busy": "" if share is None else f"{share:.0%}",
        "load": "" if load is None else f"{load:.2f}",
    }


def build_rows(measured: dict[str, Any]) -> list[Row]:
    """The figures of the drains and of the submits, each with its reference."""
    rows: list[Row] = []
    for p in measured["pairs"]:
        dag, jobs = p["dag"], p["jobs"]
        raw: PgbenchResult | None = p.get("raw")
        head = f"{p['label']}, {p['processes']} proc"
        chain = p["workload"] == "chain"
        rows += [
            Row(
                f"{head}: DAG steps/s",
                dag["db_span_steps_per_s"],
                "steps/s",
                "standalone jobs, same workers",
                jobs["db_span_steps_per_s"],
                **_busy(p),
            ),
            Row(
                "  server CPU per DAG step",
                dag.get("server_cpu_us_per_step"),
                "us",
                "per standalone job",
                jobs.get("server_cpu_us_per_step"),
                max_ratio=CHAIN_CPU_RATIO if chain else None,
            ),
            Row(
                "  worker CPU per DAG step",
                dag["worker_cpu_us_per_step"],
                "us",
                "per standalone job",
                jobs["worker_cpu_us_per_step"],
            ),
        ]
        if raw is not None:
            rows += [
                Row(
                    "  standalone jobs steps/s",
                    jobs["db_span_steps_per_s"],
                    "steps/s",
                    raw.label,
                    raw.jobs_per_s,
                    min_ratio=0.5,
                ),
                Row(
                    "  server CPU per standalone job",
                    jobs.get("server_cpu_us_per_step"),
                    "us",
                    f"{raw.label} server CPU",
                    raw.server_cpu_us_per_job,
                ),
            ]
    for name, s in measured.get("submit", {}).items():
        shape = "chain" if name == "chain" else f"wide 1-{s['nodes'] - 2}-1"
        rows.append(
            Row(
                f"submit {shape} of {s['nodes']:,} nodes, median of {len(s['samples_ms'])} "
                "after the first",
                s["median_ms"],
                "ms",
                max_value=SUBMIT_CEILING_MS if name == "chain" else None,
            )
        )
        rows.append(Row("  first submit (compiles the workflow)", s["first_ms"], "ms"))
    return rows


def _us(value: float | None) -> str:
    return "?" if value is None else f"{value:,.0f} us"


def print_report(settings: Settings, server: dict[str, Any], measured: dict[str, Any]) -> None:
    """The tables and the details below them, on stdout."""
    print()
    print(
        f"Cyclone {cyclone.__version__} static DAGs vs standalone jobs, PostgreSQL "
        f"{server.get('server_version')} on {os.cpu_count()} cores "
        f"(synchronous_commit={server.get('synchronous_commit')}, fsync={server.get('fsync')}); "
        f"no-op steps, claim_batch {settings.claim_batch or 'free slots'}, "
        f"{settings.slots} slots/process"
    )
    print()
    print(render_table(build_rows(measured)))
    pairs = measured["pairs"]
    if pairs:
        lines: list[tuple[str, ...]] = [
            (
                "workload",
                "procs",
                "steps",
                "DAG steps/s",
                "jobs steps/s",
                "DAG/jobs",
                "overhead",
                "CPU DAG",
                "CPU jobs",
                "server DAG",
                "server jobs",
                "busy",
            )
        ]
        for p in pairs:
            dag, jobs = p["dag"], p["jobs"]
            lines.append(
                (
                    p["label"],
                    str(p["processes"]),
                    f"{dag['steps']:,}",
                    f"{dag['db_span_steps_per_s']:,.0f}",
                    f"{jobs['db_span_steps_per_s']:,.0f}",
                    f"{dag['db_span_steps_per_s'] / jobs['db_span_steps_per_s']:.0%}",
                    f"{p['overhead_us_per_step']:+,.0f} us/step",
                    _us(dag["worker_cpu_us_per_step"]),
                    _us(jobs["worker_cpu_us_per_step"]),
                    _us(dag.get("server_cpu_us_per_step")),
                    _us(jobs.get("server_cpu_us_per_step")),
                    _busy(p)["busy"],
                )
            )
        print()
        print(text_table(lines, right=range(1, 12)))
        print()
        print(
            "steps/s over the database span (first started_at to last completed_at); jobs = "
            "the same number of standalone\nno-op jobs of the same kind, drained right before "
            "by the same workers. overhead = 1/DAG - 1/jobs steps/s.\nCPU = worker-process CPU "
            "per step (user + system); server = CPU of the workers' backends per step\n"
            "(bench/cpu.py). busy = share of 0.5 s samples, during the pair, in which another "
            "database on the server\nhad an active query; load = mean 1-minute load average "
            "meanwhile."
        )
        print()
        for p in pairs:
            for what, r in (("jobs", p["jobs"]), ("DAG ", p["dag"])):
                cores = r["machine_busy_cores"]
                filled = r.get("submit_s", r.get("enqueue_s", 0.0))
                print(
                    f"{p['label']}, {p['processes']} proc, {what}: backlog written in "
                    f"{filled:.2f} s; {r['elapsed_s']:.2f} s from barrier to last completion "
                    f"seen ({r['steps_per_s']:,.0f} steps/s), span {r['db_span_s']:.2f} s; "
                    f"machine busy {'?' if cores is None else f'{cores:.2f}'} cores"
                )
    submit = measured.get("submit")
    if submit:
        print()
        print(
            "submit of one 1,000-node DAG, no worker running (first = a client's first "
            f"submit, which compiles the workflow; then {settings.submit_repeats} more; "
            f"target for the chain: median <= {SUBMIT_CEILING_MS:g} ms):"
        )
        for name, s in submit.items():
            shape = "chain" if name == "chain" else f"wide 1-{s['nodes'] - 2}-1"
            print(
                f"  {shape:<12} {s['nodes']:,} nodes, {s['edges']:,} edges: first "
                f"{s['first_ms']:.1f} ms; median {s['median_ms']:.1f} ms "
                f"(min {s['min_ms']:.1f}, max {s['max_ms']:.1f})"
            )
