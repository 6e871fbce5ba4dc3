"""Worker processes started together at a barrier, the moment the benchmarks time from.

``async with started_together(target, args, options) as fleet:`` starts one process
per tuple of ``args`` (multiprocessing, spawn start method), each running
``target(*args, **options, start=..., stop=..., usage=...)``:
:func:`bench.workers.throughput_worker`, or another function with those three keywords
(a barrier to meet after building its client, an event to stop at, a queue for the CPU
seconds it used). It waits until every process is ready at the barrier, failing at
once if one dies first, and passes the barrier with them: the body starts with every
worker running. Leaving the body sets ``stop`` and joins the processes, terminating any
that has not stopped within :data:`STOP_TIMEOUT`; after a body that raised nothing,
:attr:`Fleet.cpu_s` holds what each process that exited cleanly reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier
from typing import Any

from bench.db import log

__all__ = ["START_TIMEOUT", "STOP_TIMEOUT", "Fleet", "join_all", "meet", "started_together"]

START_TIMEOUT = 60.0
"""Seconds worker processes get to reach the barrier."""
STOP_TIMEOUT = 30.0
"""Seconds a worker process gets to stop gracefully."""


@dataclass
class Fleet:
    """The processes of :func:`started_together`."""

    processes: list[BaseProcess]
    cpu_s: list[float] = field(default_factory=list)
    """CPU seconds (user + system) each process used from the barrier to its stop;
    filled once the ``async with`` body is left without an exception."""

    @property
    def pids(self) -> list[int]:
        """The processes' ids."""
        return [p.pid for p in self.processes if p.pid is not None]

    def alive(self) -> bool:
        """Whether every process still runs."""
        return all(p.is_alive() for p in self.processes)


async def meet(start: Barrier, workers: Sequence[BaseProcess]) -> None:
    """Pass the start barrier with every worker; fail at once if one dies first.

    Raises:
        RuntimeError: a worker process died before the barrier.
        TimeoutError: not every worker was ready within :data:`START_TIMEOUT`.
    """
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


def join_all(workers: Sequence[BaseProcess]) -> None:
    """Wait for each worker to exit; terminate one that takes over :data:`STOP_TIMEOUT`."""
    for worker in workers:
        worker.join(STOP_TIMEOUT)
        if worker.is_alive():
            log(f"  {worker.name} did not stop within {STOP_TIMEOUT} s; terminating it")
            worker.terminate()
            worker.join()


@contextlib.asynccontextmanager
async def started_together(
    target: Callable[..., None],
    args: Sequence[tuple[Any, ...]],
    options: Mapping[str, Any],
    *,
    name: str = "worker",
) -> AsyncIterator[Fleet]:
    """One process per tuple of ``args``, past the barrier together; see the module."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(args) + 1)
    stop = ctx.Event()
    usage: SimpleQueue[float] = ctx.SimpleQueue()
    kwargs = {**options, "start": start, "stop": stop, "usage": usage}
    fleet = Fleet(
        [
            ctx.Process(target=target, args=one, kwargs=kwargs, name=f"{name}-{i}")
            for i, one in enumerate(args)
        ]
    )
    for process in fleet.processes:
        process.start()
    try:
        await meet(start, fleet.processes)
        yield fleet
    finally:
        stop.set()
        await asyncio.to_thread(join_all, fleet.processes)
    fleet.cpu_s = [usage.get() for p in fleet.processes if p.exitcode == 0]
