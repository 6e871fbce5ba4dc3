"""The worker processes of the Cyclone benchmark.

Each is a separate Python process (multiprocessing, spawn start method) that builds a
:class:`cyclone.Client` with handlers and runs it under ``asyncio.run`` until the driver
sets its ``stop`` event; leaving ``async with client`` then stops it gracefully, as
SIGTERM does for ``python -m cyclone worker``.

Every entry point takes ``slots`` and ``claim_batch`` as ``None`` too: the client is
then built without them (``queues=`` and ``claim_batch=`` left out), so it runs with
the client's own defaults; ``pooler`` is passed through to the client (``None``: the
client's default, the environment's ``CYCLONE_POOLER`` or ``"session"``).

* :func:`throughput_worker` runs the no-op kind. It imports and builds its client
  before it meets the driver at a barrier, so the timed span starts with every process
  ready and excludes interpreter start-up; at ``stop`` it reports the CPU seconds it
  used since the barrier (all threads, user + system).
* :func:`probe_worker` runs the probe kind, whose handler sends the run id and the
  monotonic clock (system-wide on Linux, so comparable across processes) through a pipe
  the moment it starts; it reports ``ready`` once its LISTEN connection is up.
"""

from __future__ import annotations

import asyncio
import resource
import time
from multiprocessing.connection import Connection
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import cyclone

__all__ = [
    "NOOP_KIND",
    "PROBE_KIND",
    "client_options",
    "monotonic_ns",
    "noop",
    "probe_worker",
    "throughput_worker",
]

NOOP_KIND = "bench_noop"
PROBE_KIND = "bench_probe"
QUEUE = "default"


def monotonic_ns() -> int:
    """CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@cyclone.action(NOOP_KIND)
async def noop(ctx: cyclone.Context, inp: Any) -> None:
    """The no-op job: all of its cost is the engine's."""


def cpu_seconds() -> float:
    """CPU time of this process so far, user + system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def client_options(
    *, slots: int | None, claim_batch: int | None, pooler: str | None = None
) -> dict[str, Any]:
    """The :class:`cyclone.Client` keyword arguments of a benchmark worker: only what is
    given, so that ``None`` leaves the client's default in place."""
    options: dict[str, Any] = {}
    if slots is not None:
        options["queues"] = {QUEUE: slots}
    if claim_batch is not None:
        options["claim_batch"] = claim_batch
    if pooler is not None:
        options["pooler"] = pooler
    return options


async def _serve(client: cyclone.Client, stop: Event) -> None:
    async with client:
        await asyncio.to_thread(stop.wait)


def throughput_worker(
    dsn: str,
    *,
    slots: int | None,
    claim_batch: int | None,
    poll_interval: float,
    start: Barrier,
    stop: Event,
    usage: SimpleQueue[float],
    purge_interval: float | None = 300.0,
    pooler: str | None = None,
    handler: cyclone.Handler = noop,
) -> None:
    """Run no-op jobs with ``slots`` slots from the barrier until ``stop`` is set.

    ``purge_interval``: seconds between the client's retention purges (``None``: none).
    ``handler``: the no-op kind's handler (a module-level one: it is pickled to the
    worker process), with the options a benchmark declares.
    """
    client = cyclone.Client(
        dsn,
        handlers=[handler],
        poll_interval=poll_interval,
        purge_interval=purge_interval,
        **client_options(slots=slots, claim_batch=claim_batch, pooler=pooler),
    )
    start.wait()
    began = cpu_seconds()
    asyncio.run(_serve(client, stop))
    usage.put(cpu_seconds() - began)


def _probe(report: Connection) -> cyclone.Handler:
    @cyclone.action(PROBE_KIND)
    async def probe(ctx: cyclone.Context, inp: Any) -> None:
        report.send(("started", ctx.run_id, monotonic_ns()))

    return probe


async def _serve_probe(client: cyclone.Client, report: Connection, stop: Event) -> None:
    async with client:
        # behind a transaction pooler there is no LISTEN: the worker polls
        while client.settings.can_listen and not client.listening:
            await asyncio.sleep(0.005)
        report.send(("ready", 0, monotonic_ns()))
        await asyncio.to_thread(stop.wait)


def probe_worker(
    dsn: str,
    *,
    slots: int | None,
    claim_batch: int | None,
    poll_interval: float,
    report: Connection,
    stop: Event,
    pooler: str | None = None,
) -> None:
    """Run probe jobs, reporting each handler start through ``report``; ``ready`` once
    its LISTEN connection is up (at once behind a transaction pooler, which polls)."""
    client = cyclone.Client(
        dsn,
        handlers=[_probe(report)],
        poll_interval=poll_interval,
        **client_options(slots=slots, claim_batch=claim_batch, pooler=pooler),
    )
    asyncio.run(_serve_probe(client, report, stop))
