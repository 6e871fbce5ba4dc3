"""The no-op drain: a backlog of no-op runs, worker processes started at a barrier, and
the time until every run is completed.

:func:`fill_backlog` writes ``jobs`` available no-op runs with ``enqueue_many`` into
emptied tables and then vacuums, analyzes and checkpoints (as ``refill.sql`` does for
the raw table; with ``settle=False`` only the checkpoint, so that stale statistics stay
stale). :func:`noop_drain` starts the worker processes (:func:`bench.workers.
throughput_worker`, spawn), meets them at a barrier, and polls ``SELECT count(*) FROM
cyclone_runs WHERE state = 'completed'`` until it reaches the backlog. It records:

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
import multiprocessing
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import psycopg

import cyclone
from bench.cpu import BackendCpu
from bench.db import execute, log
from bench.monitor import busy_cores, machine_cpu
from bench.workers import NOOP_KIND, throughput_worker

__all__ = [
    "WorkerConfig",
    "count_completed",
    "fill_backlog",
    "join_all",
    "meet",
    "noop_drain",
    "reset_tables",
]

BACKLOG_CHUNK = 1_000
"""Runs per ``enqueue_many`` call when filling the backlog."""
START_TIMEOUT = 60.0
"""Seconds for worker processes to start."""
STOP_TIMEOUT = 30.0
"""Seconds for a worker process to stop gracefully."""


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


async def count_completed(conn: psycopg.AsyncConnection[Any]) -> int:
    """Runs in state ``completed``."""
    cur = await conn.execute("SELECT count(*) FROM cyclone_runs WHERE state = 'completed'")
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


async def meet(start: Barrier, workers: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Pass the start barrier with every worker; fail at once if one dies first."""
    deadline = time.perf_counter() + START_TIMEOUT
    while start.n_waiting < len(workers):
        if not all(worker.is_alive() for worker in workers):
            start.abort()
            raise RuntimeError("a worker process died before the start; see its output above")
        if time.perf_counter() > deadline:
            start.abort()
            raise TimeoutError(f"worker processes not ready within {START_TIMEOUT} s")
        await asyncio.sleep(0.01)
    await asyncio.to_thread(start.wait, START_TIMEOUT)


def join_all(workers: Sequence[multiprocessing.process.BaseProcess]) -> None:
    """Wait for each worker to stop; terminate one that does not within the timeout."""
    for worker in workers:
        worker.join(STOP_TIMEOUT)
        if worker.is_alive():
            log(f"  {worker.name} did not stop within {STOP_TIMEOUT} s; terminating it")
            worker.terminate()
            worker.join()


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
) -> dict[str, Any]:
    """Drain the backlog of ``jobs`` runs in ``dsn`` with ``processes`` worker processes.

    ``worker_dsn``: where the workers connect (a pooler in front of ``dsn``); the
    driver's own connections and the server CPU sampler use ``dsn``.

    Raises:
        RuntimeError: a worker process died.
        TimeoutError: the backlog was not drained within ``worker_timeout`` seconds.
    """
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(processes + 1)
    stop = ctx.Event()
    usage: SimpleQueue[float] = ctx.SimpleQueue()
    options = {**config.options(), "start": start, "stop": stop, "usage": usage}
    workers = [
        ctx.Process(
            target=throughput_worker,
            args=(worker_dsn or dsn,),
            kwargs=options,
            name=f"worker-{i}",
        )
        for i in range(processes)
    ]
    spies: list[subprocess.Popen[bytes]] = []
    profiles: list[Path] = []
    for worker in workers:
        worker.start()
    server: BackendCpu | None = None
    try:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            # steps started before this moment (retained runs) stay out of the span
            cur = await conn.execute("SELECT clock_timestamp()")
            row = await cur.fetchone()
            assert row is not None
            t0 = row[0]
            done_before = await count_completed(conn)  # retained runs
            await meet(start, workers)
            server = await asyncio.to_thread(BackendCpu(dsn, "cyclone").start)
            began = time.perf_counter()
            cpu_before = machine_cpu()
            if py_spy is not None:
                await asyncio.to_thread(py_spy.mkdir, parents=True, exist_ok=True)
                for worker in workers:
                    assert worker.pid is not None
                    profiles.append(py_spy / f"worker-p{processes}-{worker.pid}.txt")
                    spies.append(start_py_spy(worker.pid, profiles[-1]))
            while (completed := await count_completed(conn) - done_before) < jobs:
                if not all(worker.is_alive() for worker in workers):
                    raise RuntimeError("a worker process died; see its output above")
                if time.perf_counter() - began > worker_timeout:
                    raise TimeoutError(
                        f"{completed} of {jobs} runs completed in {worker_timeout} s"
                    )
                await asyncio.sleep(count_interval)
            elapsed = time.perf_counter() - began
            cores = busy_cores(cpu_before, machine_cpu())
            server_cpu = await asyncio.to_thread(server.stop)
            cur = await conn.execute(
                "SELECT extract(epoch FROM max(completed_at) - min(started_at))::float8 "
                "FROM cyclone_steps WHERE started_at >= %s",
                [t0],
            )
            span_row = await cur.fetchone()
    finally:
        if server is not None:
            server.stop()
        stop.set()
        await asyncio.to_thread(join_all, workers)
        for spy in spies:
            await asyncio.to_thread(spy.wait, STOP_TIMEOUT)
    span = float(span_row[0]) if span_row and span_row[0] else elapsed
    worker_cpu = [usage.get() for worker in workers if worker.exitcode == 0]
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
