"""What tracing and metrics cost: enqueues and drains with each on and off.

``python -m bench.observability [--dsn ADMIN_DSN] [--jobs N] [--enqueues N]
[--repeats R]`` measures, in a throwaway database, for each mode:

* ``off``: no ``TracerProvider`` set (``opentelemetry-api`` installed: the cost of
  asking whether tracing is on) and no metrics registered;
* ``traces``: the OpenTelemetry SDK's ``TracerProvider`` with a batch span processor
  and an exporter that drops what it receives (every span is made, sampled and
  queued; only the network is left out);
* ``metrics``: ``register_metrics`` on the worker's client (counters and histograms
  updated per step);
* ``both``.

the rate of ``--enqueues`` ``Client.enqueue`` calls (one per transaction, one producer
in its own process: a provider is process-wide) and the drain of ``--jobs`` no-op jobs
by one worker process (jobs/s over the database's clock, and the worker's CPU time per
job). The modes run interleaved, ``--repeats`` times (median shown), each repeat after
the raw-PostgreSQL limit of the same statements (``insert1.sql`` and
``claim_complete10.sql``, one client), with the one-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier, Event
from queue import SimpleQueue
from typing import Any

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, log, throwaway_database
from bench.drain import WorkerConfig, fill_backlog, noop_drain, reset_tables
from bench.raw import measure_raw_limit
from bench.report import text_table
from bench.workers import NOOP_KIND, client_options, cpu_seconds, noop

MODES = ("off", "traces", "metrics", "both")


def _install_tracing() -> None:
    """The SDK's provider with a batch processor whose exporter drops every span."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)


async def _serve(client: cyclone.Client, stop: Event) -> None:
    async with client:
        await asyncio.to_thread(stop.wait)


def observed_worker(
    dsn: str,
    *,
    mode: str,
    slots: int | None,
    claim_batch: int | None,
    poll_interval: float,
    start: Barrier,
    stop: Event,
    usage: SimpleQueue[float],
    pooler: str | None = None,
) -> None:
    """A no-op worker process (as :func:`bench.workers.throughput_worker`) with the
    tracing and metrics of ``mode``."""
    if mode in ("traces", "both"):
        _install_tracing()
    client = cyclone.Client(
        dsn,
        handlers=[noop],
        poll_interval=poll_interval,
        purge_interval=None,
        **client_options(slots=slots, claim_batch=claim_batch, pooler=pooler),
    )
    if mode in ("metrics", "both"):
        from prometheus_client import CollectorRegistry

        from cyclone.observability import register_metrics

        register_metrics(client, CollectorRegistry())
    start.wait()
    began = cpu_seconds()
    asyncio.run(_serve(client, stop))
    usage.put(cpu_seconds() - began)


async def _enqueue(dsn: str, count: int) -> float:
    async with cyclone.Client(dsn) as client:
        for _ in range(50):  # warm: connections, prepared statements
            await client.enqueue(NOOP_KIND, {})
        began = time.perf_counter()
        for _ in range(count):
            await client.enqueue(NOOP_KIND, {})
        return count / (time.perf_counter() - began)


def enqueue_process(dsn: str, mode: str, count: int, out: Connection) -> None:
    """In a fresh process: ``count`` enqueues with the tracing of ``mode``; sends
    enqueues/s."""
    if mode in ("traces", "both"):
        _install_tracing()
    out.send(asyncio.run(_enqueue(dsn, count)))


def enqueue_rate(dsn: str, mode: str, count: int) -> float:
    """Enqueues/s of one producer process in ``mode``."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    process = ctx.Process(target=enqueue_process, args=(dsn, mode, count, send))
    process.start()
    rate = float(receive.recv())
    process.join()
    return rate


async def run(args: argparse.Namespace) -> None:
    """Measure every mode of ``args.modes`` ``args.repeats`` times; print the table."""
    figures: dict[str, dict[str, list[float]]] = {
        m: {"enqueue": [], "drain": [], "cpu": []} for m in MODES
    }
    raw: dict[str, list[float]] = {"insert1": [], "claim_complete10": []}
    loads: list[float] = []
    config = WorkerConfig(slots=args.slots, claim_batch=args.claim_batch, poll_interval=0.05)
    with throwaway_database(args.dsn, "bench_observability") as dsn:
        await asyncio.to_thread(cyclone.migrate, dsn)
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1} of {args.repeats}")
            for result in await asyncio.to_thread(
                measure_raw_limit,
                args.dsn,
                insert_clients=(1,),
                claim_clients=(1,),
                batch_insert=False,
            ):
                for key, values in raw.items():
                    if result.script.startswith(key + ".") and result.clients == 1:
                        values.append(result.jobs_per_s)
            loads.append(os.getloadavg()[0])
            for mode in args.modes:
                await reset_tables(dsn)
                rate = await asyncio.to_thread(enqueue_rate, dsn, mode, args.enqueues)
                figures[mode]["enqueue"].append(rate)
                await fill_backlog(dsn, args.jobs)
                drained = await noop_drain(
                    dsn,
                    processes=1,
                    jobs=args.jobs,
                    config=config,
                    worker=observed_worker,
                    worker_options={"mode": mode},
                )
                figures[mode]["drain"].append(drained["db_span_jobs_per_s"])
                figures[mode]["cpu"].append(drained["worker_cpu_us_per_job"])
                log(
                    f"  {mode:<8} enqueue {rate:>8,.0f}/s  drain "
                    f"{drained['db_span_jobs_per_s']:>8,.0f} jobs/s  "
                    f"{drained['worker_cpu_us_per_job']:>6.0f} us CPU/job"
                )
            loads.append(os.getloadavg()[0])
    print(report({m: f for m, f in figures.items() if m in args.modes}, raw, loads))


def report(
    figures: dict[str, dict[str, list[float]]],
    raw: dict[str, list[float]],
    loads: Sequence[float],
) -> str:
    """The table of medians, each mode against ``off``, and the raw limits."""
    med = {m: {k: statistics.median(v) for k, v in f.items() if v} for m, f in figures.items()}
    base = med.get("off") or next(iter(med.values()))
    lines = [("mode", "enqueue/s", "vs off", "drain jobs/s", "vs off", "worker CPU us/job")]
    for mode, m in med.items():
        lines.append(
            (
                mode,
                f"{m['enqueue']:,.0f}",
                f"{100 * m['enqueue'] / base['enqueue']:.0f}%",
                f"{m['drain']:,.0f}",
                f"{100 * m['drain'] / base['drain']:.0f}%",
                f"{m['cpu']:.0f}",
            )
        )
    table = text_table(lines, right=range(1, 6))
    limits = ", ".join(
        f"{name}.sql c=1 {statistics.median(values):,.0f}/s"
        for name, values in raw.items()
        if values
    )
    load = f"load average (1 min) {min(loads):.2f}-{max(loads):.2f}" if loads else ""
    return f"{table}\nraw PostgreSQL, same run: {limits}\n{load}"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.observability``: see the module."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.observability",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--enqueues", type=int, default=3_000, help="enqueues per producer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--claim-batch", type=int, default=None)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
