"""Bloat and held horizons: steady load while a foreign transaction holds the xmin horizon.

``python -m bench.bloat [--dsn ADMIN_DSN] [--minutes 15] [--hold-start M] [--hold-minutes 3]``
measures, in throwaway databases it creates and drops:

1. **The raw limit and the peak.** ``claim_complete10.sql`` and ``claim_complete1.sql``
   of :mod:`bench.raw` with one pgbench client per worker process, then the peak no-op
   throughput of the same worker processes draining a backlog of ``--peak-jobs`` runs
   (:meth:`bench.jobs.Bench.throughput`, the figure of ``python -m bench.jobs``).
2. **The steady phase** (:mod:`bench.steady`): ``--minutes`` of load at ``--load`` (half)
   of that peak, from fresh worker processes that purge every ``--purge-interval``
   seconds runs kept ``--retention`` seconds, so that the tables stay the same size;
   ``--hold-minutes`` in the middle (or from ``--hold-start``), a foreign transaction
   of the same database holds a snapshot and an xid. Per second: completions and each
   job's pickup latency (``started_at - created_at``, the database clock); every
   ``--sample-interval`` seconds: ``pg_stat_user_tables`` of ``cyclone_steps`` and
   ``cyclone_runs``, the oldest horizon holder, the queue's oldest available age, the load
   average.
3. **The raw limit again**, to show how much the machine drifted meanwhile.

The report (:mod:`bench.bloat_report`, from :mod:`bench.recovery`) gives the figures of
each window of ``--window`` seconds (a minute), the baseline (the median of windows 2-5,
ended by the hold), how long after the release completions/s (within +-10 %) and pickup
p99 (at most 10 % above) are back for a whole window, or ``not recovered``, and
``n_dead_tup`` of both tables against twice its baseline; beside them the raw limit and
the load average. ``--short`` tries it in about five minutes (3-minute load, 1-minute
hold from minute 1, 20-second windows). The figures go to
``bench/results/bloat-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

import cyclone
from bench import jobs
from bench.bloat_report import compute, print_report
from bench.db import DEFAULT_ADMIN_DSN, log, server_settings, throwaway_database
from bench.drain import reset_tables
from bench.jobs_report import to_json
from bench.monitor import LoadMonitor
from bench.raw import CLAIM_SCRIPTS, DEFAULT_SCRIPTS, RawLimit
from bench.report import provenance, write_results
from bench.steady import SteadyLoad, SteadyResult

__all__ = ["Settings", "main", "measure", "run"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run is configured with (see ``--help``); times in seconds."""

    admin_dsn: str
    scripts: Path
    pgbench_seconds: int
    duration_s: int
    hold_start_s: int
    hold_s: int
    window_s: int
    load: float
    rate: float | None
    peak_jobs: int
    processes: int
    slots: int
    claim_batch: int | None
    poll_interval: float
    retention_s: float
    purge_interval: float
    sample_interval: float
    tick: float
    vacuum_interval: float | None
    results_dir: Path

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (paths as strings, no DSN secrets)."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "admin_dsn"}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}

    def jobs_settings(self) -> jobs.Settings:
        """The :mod:`bench.jobs` settings of the peak drain."""
        return jobs.Settings(
            admin_dsn=self.admin_dsn,
            scripts=self.scripts,
            pgbench_seconds=self.pgbench_seconds,
            enqueue_seconds=0.0,
            producers=1,
            batch=1,
            jobs=self.peak_jobs,
            processes=(self.processes,),
            slots=self.slots,
            claim_batch=self.claim_batch,
            poll_interval=self.poll_interval,
            count_interval=0.05,
            worker_timeout=300.0,
            latency_jobs=0,
            latency_warmup=0,
            phases=("raw", "workers"),
            py_spy=None,
            results_dir=self.results_dir,
        )


async def measure(settings: Settings) -> dict[str, Any]:
    """The raw limit, the peak and the steady phase, in throwaway databases."""
    admin = settings.admin_dsn
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(throwaway_database(admin, "bench_bloat"))
        raw_dsn = stack.enter_context(throwaway_database(admin, "bench_raw"))
        own = {str(conninfo_to_dict(d)["dbname"]) for d in (dsn, raw_dsn)}
        raw = RawLimit(raw_dsn, settings.scripts, seconds=settings.pgbench_seconds)
        await asyncio.to_thread(raw.create_schema)
        await asyncio.to_thread(cyclone.migrate, dsn)
        monitor = stack.enter_context(LoadMonitor(admin, own))
        bench = jobs.Bench(settings.jobs_settings(), dsn, raw, monitor)
        log("raw limit and peak:")
        if settings.rate is None:
            peak: dict[str, Any] | None = await bench.throughput(settings.processes)
            assert peak is not None
            rate = settings.load * peak["jobs_per_s"]
            before = peak["raw"]
        else:
            peak, rate = None, settings.rate
            before = await bench.limits(list(CLAIM_SCRIPTS), settings.processes)
        await reset_tables(dsn)
        server = await asyncio.to_thread(_vacuum_settings, dsn)
        vacuum_interval = settings.vacuum_interval
        if vacuum_interval is None:  # auto: stand in for autovacuum only when it is off
            vacuum_interval = 10.0 if server["autovacuum"] == "off" else 0.0
        if vacuum_interval and server["autovacuum"] == "off":
            log(f"  autovacuum is off on this server: VACUUM every {vacuum_interval:g} s instead")
        log(
            f"steady load at {rate:,.0f} jobs/s for {settings.duration_s} s, horizon held "
            f"{settings.hold_start_s}-{settings.hold_start_s + settings.hold_s} s:"
        )
        steady = await SteadyLoad(
            dsn,
            monitor,
            rate=rate,
            duration_s=settings.duration_s,
            hold_start_s=settings.hold_start_s,
            hold_s=settings.hold_s,
            worker_options={
                "slots": settings.slots,
                "claim_batch": settings.claim_batch,
                "poll_interval": settings.poll_interval,
                "purge_interval": settings.purge_interval,
            },
            processes=settings.processes,
            retention_s=settings.retention_s,
            sample_interval=settings.sample_interval,
            tick=settings.tick,
            vacuum_interval=vacuum_interval or None,
        ).run()
        log("raw limit after:")
        after = await bench.limits(list(CLAIM_SCRIPTS), settings.processes)
    return {
        "peak": peak,
        "rate": rate,
        "raw_before": before,
        "raw_after": after,
        "steady": steady,
        "vacuum": {**server, "bench_vacuum_interval": vacuum_interval or None},
    }


def _vacuum_settings(dsn: str) -> dict[str, str]:
    """The server's autovacuum settings and the idle-in-transaction timeout."""
    names = ["autovacuum", "autovacuum_naptime", "idle_in_transaction_session_timeout"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", [names]
        ).fetchall()
    return {str(name): str(value) for name, value in rows}


def run(settings: Settings) -> dict[str, Any]:
    """Measure, print the report, write the JSON; the results as a dict."""
    started = datetime.now(UTC)
    measured = asyncio.run(measure(settings))
    steady: SteadyResult = measured["steady"]
    figures = compute(settings, steady)
    server = server_settings(settings.admin_dsn)
    results = {
        **provenance(started, server, settings.to_json()),
        "rate": measured["rate"],
        "peak": measured["peak"],
        "raw_before": measured["raw_before"],
        "raw_after": measured["raw_after"],
        "hold": {
            "held_at_s": steady.held_at_s,
            "released_at_s": steady.released_at_s,
            "xid": steady.holder_xid,
        },
        "errors": steady.errors,
        "vacuum": measured["vacuum"],
        "bench_vacuums": steady.vacuums,
        "figures": figures.to_json(),
        "per_second": {
            "enqueued": steady.series.enqueued,
            "completed": steady.series.completed,
            "pickups": [len(p) for p in steady.series.pickups_ms],
        },
        "samples": [s.to_json() for s in steady.samples],
    }
    try:
        print_report(settings, server, measured, figures)
    finally:  # a long run's figures are kept even if the report fails
        write_results(settings.results_dir, "bloat", started, results, default=to_json)
    return results


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """The command line as :class:`Settings`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.bloat",
        description="Steady load while a foreign transaction holds the xmin horizon.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN; throwaway databases are made here")
    add("--short", action="store_true", help="try it: 3 minutes, hold 1-2, 20 s windows")
    add("--minutes", type=float, default=None, help="length of the steady load [15; short 3]")
    add("--hold-start", type=float, default=None, help="minute the hold begins [the middle]")
    add("--hold-minutes", type=float, default=None, help="length of the hold [3; short 1]")
    add("--window", type=int, default=None, help="seconds of one window [60; short 20]")
    add("--load", type=float, default=0.5, help="steady rate as a share of the measured peak")
    add("--rate", type=float, default=None, help="steady jobs/s (skips the peak drain)")
    add("--peak-jobs", type=int, default=None, help="runs of the peak drain [20,000; short 5,000]")
    add("--processes", type=int, default=2, help="worker processes")
    add("--slots", type=int, default=20, help="worker slots per process")
    add("--claim-batch", type=int, help="steps per claim statement (default: the free slots)")
    add("--poll-interval", type=float, default=1.0, help="workers' poll interval (s)")
    add("--retention", type=float, default=60.0, help="seconds a finished run is kept")
    add("--purge-interval", type=float, default=10.0, help="workers' purge interval (s)")
    add("--sample-interval", type=float, default=5.0, help="pg_stat_user_tables every (s)")
    add("--tick", type=float, default=0.02, help="the producer enqueues every (s)")
    add(
        "--vacuum-interval",
        type=float,
        default=None,
        help="VACUUM both tables every (s); 0: never [10 s if autovacuum is off, else never]",
    )
    add("--raw-scripts", type=Path, default=DEFAULT_SCRIPTS, help="raw-limit pgbench scripts")
    add("--pgbench-seconds", type=int, default=None, help="length of each pgbench run [3; 2]")
    add("--results-dir", type=Path, default=jobs.RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)

    def pick(value: Any, normal: Any, short: Any) -> Any:
        return value if value is not None else (short if args.short else normal)

    duration = round(60 * pick(args.minutes, 15.0, 3.0))
    hold = round(60 * pick(args.hold_minutes, 3.0, 1.0))
    default_start = 60.0 if args.short else (duration - hold) / 2 / 60
    hold_start = round(60 * pick(args.hold_start, default_start, 1.0))
    window = pick(args.window, 60, 20)
    if window < 1 or duration < 2 * window:
        parser.error("--window must be >= 1 s and --minutes at least two windows")
    if hold < 0 or hold_start < 0 or hold_start + hold > duration:
        parser.error("the hold must lie within the steady load")
    if (args.rate is not None and args.rate <= 0) or not 0 < args.load <= 1:
        parser.error("--rate must be > 0 and --load in (0, 1]")
    return Settings(
        admin_dsn=args.dsn,
        scripts=args.raw_scripts,
        pgbench_seconds=pick(args.pgbench_seconds, 3, 2),
        duration_s=duration,
        hold_start_s=hold_start,
        hold_s=hold,
        window_s=window,
        load=args.load,
        rate=args.rate,
        peak_jobs=pick(args.peak_jobs, 20_000, 5_000),
        processes=args.processes,
        slots=args.slots,
        claim_batch=args.claim_batch,
        poll_interval=args.poll_interval,
        retention_s=args.retention,
        purge_interval=args.purge_interval,
        sample_interval=args.sample_interval,
        tick=args.tick,
        vacuum_interval=args.vacuum_interval,
        results_dir=args.results_dir,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.bloat``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
