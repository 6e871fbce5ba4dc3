"""The workflows of the DAG benchmark, and the worker processes that run them.

A worker runs a workflow step only if it registers the run's workflow with the same
``def_version``, so the workflows are built here, at import, by code that the driver
(:mod:`bench.dag`) and every worker process share: the same definition gives the same
fingerprint in every process. Every node runs :data:`noop`, a ``@cyclone.step`` whose
output is ``None``; the standalone-job baseline enqueues that same kind, so DAG and
jobs are drained by identically configured workers.

* :data:`CHAIN`: ``n0 -> n1 -> ... -> n9``, each node after the one before it;
* :data:`WIDE`: ``root -> m0..m99 -> sink``: a hundred parallel nodes after the root, and
  a sink whose input is their hundred outputs (``inputs=[...]`` fan-in);
* :func:`chain` and :func:`wide` build other sizes (the 1,000-node submit probes).

:func:`dag_worker` is the worker process of the drains, started by :mod:`bench.dag`
exactly as :func:`bench.workers.throughput_worker` is by :mod:`bench.jobs`
(multiprocessing, spawn; start barrier; CPU time reported at stop). :func:`client`
builds the same worker client for the command line, configured from the environment::

    CYCLONE_DSN=postgresql:///db BENCH_SLOTS=20 \\
        cyclone worker bench.dag_app:client
"""

from __future__ import annotations

import asyncio
import os
from multiprocessing.queues import SimpleQueue
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import cyclone
from bench.workers import _serve, client_options, cpu_seconds

__all__ = [
    "CHAIN",
    "NOOP_STEP",
    "WIDE",
    "WORKFLOWS",
    "chain",
    "client",
    "dag_worker",
    "noop",
    "wide",
    "worker_client",
]

NOOP_STEP = "bench_dag_noop"


@cyclone.step(NOOP_STEP)
async def noop(ctx: cyclone.Context, inp: Any) -> None:
    """The no-op step: its output is ``None``; all of its cost is the engine's."""


def chain(length: int, name: str | None = None) -> cyclone.Workflow:
    """``n0 -> n1 -> ... -> n{length-1}`` (control edges); the last node is the result."""
    wf = cyclone.Workflow(name or f"bench_chain{length}")
    prev = wf.node("n0", noop)
    for i in range(1, length):
        prev = wf.node(f"n{i}", noop, after=[prev])
    wf.result(prev)
    return wf


def wide(width: int, name: str | None = None) -> cyclone.Workflow:
    """``root -> m0..m{width-1} -> sink``: the sink's input is the middle nodes' outputs."""
    wf = cyclone.Workflow(name or f"bench_wide{width}")
    root = wf.node("root", noop)
    middle = [wf.node(f"m{i}", noop, after=[root]) for i in range(width)]
    wf.result(wf.node("sink", noop, inputs=middle))
    return wf


CHAIN = chain(10)
WIDE = wide(100)
WORKFLOWS = {"chain": CHAIN, "wide": WIDE}
"""The drained workflows by workload name; every worker registers all of them."""


def worker_client(
    dsn: str, *, slots: int | None, claim_batch: int | None, poll_interval: float
) -> cyclone.Client:
    """A worker client for :data:`WORKFLOWS` and standalone :data:`noop` jobs
    (``slots``, ``claim_batch``: ``None`` for the client's default)."""
    return cyclone.Client(
        dsn,
        handlers=[noop],
        workflows=WORKFLOWS.values(),
        poll_interval=poll_interval,
        **client_options(slots=slots, claim_batch=claim_batch),
    )


def client() -> cyclone.Client:
    """``cyclone worker bench.dag_app:client``: the worker client, from the environment.

    ``CYCLONE_DSN`` (required), ``BENCH_SLOTS`` (20), ``BENCH_CLAIM_BATCH`` (unset: the
    free slots), ``BENCH_POLL_INTERVAL`` (1.0 s).
    """
    return worker_client(
        os.environ["CYCLONE_DSN"],
        slots=int(os.environ.get("BENCH_SLOTS", "20")),
        claim_batch=int(batch) if (batch := os.environ.get("BENCH_CLAIM_BATCH")) else None,
        poll_interval=float(os.environ.get("BENCH_POLL_INTERVAL", "1.0")),
    )


def dag_worker(
    dsn: str,
    *,
    slots: int | None,
    claim_batch: int | None,
    poll_interval: float,
    start: Barrier,
    stop: Event,
    usage: SimpleQueue[float],
) -> None:
    """Run the benchmark's workflows and jobs from the barrier until ``stop`` is set.

    The client is built (and the workflows compiled) before the barrier; the CPU time
    used after it, all threads, goes to ``usage`` at the end.
    """
    worker = worker_client(dsn, slots=slots, claim_batch=claim_batch, poll_interval=poll_interval)
    start.wait()
    began = cpu_seconds()
    asyncio.run(_serve(worker, stop))
    usage.put(cpu_seconds() - began)
