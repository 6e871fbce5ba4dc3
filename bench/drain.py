"""The no-op drain: a backlog of no-op runs, worker processes started at a barrier, and
the time until every run is completed.

:func:`fill_backlog` writes ``jobs`` available no-op runs with ``enqueue_many`` into
emptied tables and then vacuums, analyzes and checkpoints (as ``refill.sql`` does for
the raw table; with ``settle=False`` only the checkpoint, so that stale statistics stay
stale). :func:`noop_drain` starts the worker processes (:func:`bench.workers.
throughput_worker`, together at a barrier: :mod:`bench.fleet`), and polls ``SELECT
count(*) FROM cyclone_runs WHERE state = 'completed'`` (:func:`wait_completed`) until it
has grown by the backlog. It records:

* jobs/s from the barrier to the last completion seen, and over the span on the
  database's clock (first ``started_at`` to last ``completed_at``);
* the worker processes' CPU time (user + system, all threads, barrier to stop);
* the server CPU time of their backends (``application_name`` ``cyclone...``,
  :class:`bench.cpu.BackendCpu`), from the barrier to the last completion, before the
  workers stop;
* the cores the whole machine kept busy.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import psycopg

import cyclone
from bench.cpu import BackendCpu
from bench.db import execute
from bench.fleet import STOP_TIMEOUT, Fleet, started_together
from bench.monitor import busy_cores, machine_cpu
from bench.workers import NOOP_KIND, throughput_worker

__all__ = [
    "DrainOptions",
    "WorkerConfig",
    "count_completed",
    "db_span",
    "fill_backlog",
    "noop_drain",
    "reset_tables",
    "wait_completed",
]

BACKLOG_CHUNK = 1_000
"""Runs per ``enqueue_many`` call when filling the backlog."""


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How each worker process's client is built; ``None``: the client's default."""

    slots: int | None
    claim_batch: int | None
    poll_interval: float
    pooler: str | None = None

    @property
    def label(self) -> str:
        """``20 slots x claim_batch 10``, or ``client defaults``."""
        if self.slots is None and self.claim_batch is None:
            return "client defaults"
        slots = "default" if self.slots is None else str(self.slots)
        batch = "default" if self.claim_batch is None else str(self.claim_batch)
        return f"{slots} slots x claim_batch {batch}"

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`bench.workers.throughput_worker` and
        :func:`bench.workers.probe_worker` (besides their events and queues)."""
        return {
            "slots": self.slots,
            "claim_batch": self.claim_batch,
            "poll_interval": self.poll_interval,
            "pooler": self.pooler,
        }


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


async def fill_backlog(dsn: str, jobs: int, *, reset: bool = True, settle: bool = True) -> float:
    """``jobs`` available no-op runs (after emptying the tables when ``reset``), then
    VACUUM ANALYZE (when ``settle``) and CHECKPOINT; the seconds the enqueues took."""
    if reset:
        await reset_tables(dsn)
    began = time.perf_counter()
    async with cyclone.Client(dsn) as client:
        for first in range(0, jobs, BACKLOG_CHUNK):
            await client.enqueue_many(NOOP_KIND, [{}] * min(BACKLOG_CHUNK, jobs - first))
    took = time.perf_counter() - began
    statements = ["VACUUM ANALYZE cyclone_runs, cyclone_steps"] if settle else []
    await asyncio.to_thread(execute, dsn, *statements, "CHECKPOINT")
    return took


async def count_completed(
    conn: psycopg.AsyncConnection[Any], above_id: int = 0, span: int | None = None
) -> int:
    """Runs in state ``completed`` whose id is above ``above_id`` (and at most ``span``
    above it).

    Polled many times a second during a drain, so it reads only the backlog's runs, by
    primary key, never the retained history: a count of every completed run cost the
    server more than the drain it watched. The closed range keeps the planner on the
    primary key even with stale statistics.
    """
    cur = await conn.execute(
        "SELECT count(*) FROM cyclone_runs WHERE id > %s AND id <= %s AND state = 'completed'",
        [above_id, above_id + span if span is not None else 2**62],
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def start_py_spy(pid: int, output: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling process ``pid`` while it holds the GIL, into ``output``."""
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
    conn: psycopg.AsyncConnection[Any],
    options: DrainOptions,
    fleet: Fleet,
    began: float,
    *,
    before: int = 0,
    above_id: int = 0,
) -> None:
    """Count the completed runs above ``above_id`` every ``count_interval`` s until
    ``jobs`` more than ``before`` are.

    Raises:
        RuntimeError: a process of ``fleet`` died first.
        TimeoutError: not done ``worker_timeout`` s after ``began``
            (``time.perf_counter()``).
    """
    jobs, timeout = options.jobs, options.worker_timeout
    span = jobs if above_id else None
    while (completed := await count_completed(conn, above_id, span) - before) < jobs:
        if not fleet.alive():
            raise RuntimeError("a worker process died; see its output above")
        if time.perf_counter() - began > timeout:
            raise TimeoutError(f"{completed} of {jobs} runs completed in {timeout} s")
        await asyncio.sleep(options.count_interval)


async def db_span(
    conn: psycopg.AsyncConnection[Any], since: datetime | None = None
) -> float | None:
    """Seconds from the first ``started_at`` to the last ``completed_at`` of the steps
    started at or after ``since`` (every step: ``None``), on the database's clock
    (``None`` when no step finished)."""
    cur = await conn.execute(
        "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8 "
        "FROM cyclone_steps WHERE %(since)s::timestamptz IS NULL OR started_at >= %(since)s",
        {"since": since},
    )
    row = await cur.fetchone()
    return float(row[0]) if row and row[0] else None


@dataclass(frozen=True, slots=True)
class _Watch:
    jobs: int
    worker_timeout: float
    count_interval: float


async def noop_drain(
    dsn: str,
    *,
    processes: int,
    jobs: int,
    config: WorkerConfig,
    worker_dsn: str | None = None,
    count_interval: float = 0.05,
    worker_timeout: float = 60.0,
    py_spy: Path | None = None,
    worker: Callable[..., None] = throughput_worker,
    worker_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Drain the backlog of ``jobs`` runs in ``dsn`` with ``processes`` worker processes
    (:func:`bench.fleet.started_together`) running ``worker`` (default
    :func:`bench.workers.throughput_worker`) with ``config``'s options and
    ``worker_options``.

    ``worker_dsn``: where the workers connect (a pooler in front of ``dsn``); the
    driver's own connections and the server CPU sampler use ``dsn``.

    Raises:
        RuntimeError: a worker process died.
        TimeoutError: the backlog was not drained within ``worker_timeout`` seconds.
    """
    watch = _Watch(jobs, worker_timeout, count_interval)
    spies: list[subprocess.Popen[bytes]] = []
    profiles: list[Path] = []
    server: BackendCpu | None = None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # steps started before this moment (retained runs) stay out of the span, and
        # runs completed before it out of the count
        cur = await conn.execute("SELECT clock_timestamp()")
        row = await cur.fetchone()
        assert row is not None
        t0 = row[0]
        # the backlog's runs are the running ones; the retained history lies below them
        cur = await conn.execute(
            "SELECT coalesce(min(id), 1) - 1 FROM cyclone_runs WHERE state = 'running'"
        )
        first = await cur.fetchone()
        assert first is not None
        above_id = int(first[0])
        done_before = await count_completed(conn, above_id)
        try:
            options = {**config.options(), **(worker_options or {})}
            async with started_together(
                worker, [(worker_dsn or dsn,)] * processes, options
            ) as fleet:
                server = await asyncio.to_thread(BackendCpu(dsn, "cyclone").start)
                began = time.perf_counter()
                cpu_before = machine_cpu()
                if py_spy is not None:
                    await asyncio.to_thread(py_spy.mkdir, parents=True, exist_ok=True)
                    for pid in fleet.pids:
                        profiles.append(py_spy / f"worker-p{processes}-{pid}.txt")
                        spies.append(start_py_spy(pid, profiles[-1]))
                await wait_completed(
                    conn, watch, fleet, began, before=done_before, above_id=above_id
                )
                elapsed = time.perf_counter() - began
                cores = busy_cores(cpu_before, machine_cpu())
                server_cpu = await asyncio.to_thread(server.stop)  # before the workers stop
        finally:
            if server is not None:
                server.stop()
            for spy in spies:
                await asyncio.to_thread(spy.wait, STOP_TIMEOUT)
        span = await db_span(conn, t0) or elapsed
    worker_cpu = fleet.cpu_s
    return {
        "processes": processes,
        "slots": config.slots,
        "claim_batch": config.claim_batch,
        "config": config.label,
        "pooler": config.pooler,
        "jobs": jobs,
        "elapsed_s": elapsed,
        "jobs_per_s": jobs / elapsed,
        "db_span_s": span,
        "db_span_jobs_per_s": jobs / span,
        "worker_cpu_s": worker_cpu,
        "worker_cpu_us_per_job": 1e6 * sum(worker_cpu) / jobs,
        "server_cpu": server_cpu.to_json(),
        "server_cpu_us_per_job": server_cpu.us_per(jobs),
        "machine_busy_cores": cores,
        "profiles": [str(p) for p in profiles if p.exists()],
    }
