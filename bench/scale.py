"""The scale-out benchmark: no-op jobs/s of 1, 2, 4 worker hosts on one database.

``python -m bench.scale [options]`` (as root: it makes network namespaces) runs, on
this machine:

1. **The hosts.** One "database host" network namespace and a worker host namespace
   per worker host, each linked to the database host by its own veth pair on
   loopback-range addresses (:mod:`tests.netns`, as the network tests do), and a
   throwaway PostgreSQL server of its own (:mod:`tests.throwaway`: initdb, ``fsync``
   off) inside the database host, listening on the database end of every link. Its
   ``max_connections`` is the pool budget of the largest host count: each host's
   client opens at most ``tx_slots + ENGINE_RESERVE`` connections, ``tx_slots`` being
   its ``--slots``, plus a few for this driver. The driver reaches the server through
   its Unix socket; Cyclone's schema goes into a database ``bench``.
2. **The drains.** For each count of ``--hosts`` (interleaved, ``--repeats`` times):
   ``--jobs`` no-op runs are enqueued with ``enqueue_many`` into emptied tables, which
   are vacuumed, analyzed and checkpointed (:func:`bench.jobs.fill_backlog`); then one
   worker process per host (:func:`bench.workers.throughput_worker`: ``--slots``
   slots, ``--claim-batch`` steps per claim), each of which first enters its host's
   namespace (``setns(2)`` on ``/run/netns/<name>``, what ``ip netns exec`` does) and
   connects over its link, builds its client and meets the driver at a barrier. The
   time runs from the barrier until ``--jobs`` runs are completed on the database.
3. **The CPU.** At the barrier and at the last completion the driver reads
   ``/proc/<pid>/stat`` (:mod:`bench.procstat`) of the server's postmaster and its
   children (every backend and background process; exited ones through the
   postmaster's reaped-children time) and of each worker process, and the machine's
   busy ticks: the server's CPU-seconds per second (cores busy) and per job, the
   workers' the same way, the rest of the machine ("other"), and the load average.
4. **The report**: per host count the median of its repeats, the scaling against one
   host, and where throughput stopped growing, on stdout; every sample as JSON in
   ``bench/results/scale-<timestamp>.json``. Progress goes to stderr.

On one machine the hosts share its cores with the server, so once worker and server
CPU fill them, another host takes CPU from the database instead of adding throughput:
the server's CPU per job is the figure that carries over to separate machines (one
primary core sustains about ``1e6 / server_us_per_job`` jobs/s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import itertools
import os
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from tests import netns, throwaway
from tests.netns import Hosts, Link
from tests.throwaway import ThrowawayServer

import cyclone
from bench.db import execute, log, server_settings
from bench.fleet import started_together
from bench.jobs import RESULTS_DIR, db_span, fill_backlog, wait_completed
from bench.monitor import busy_cores, machine_cpu
from bench.procstat import own_ticks, read_stats, tick_seconds, tree_ticks
from bench.report import provenance, text_table, write_results
from bench.workers import throughput_worker
from cyclone.sizing import ENGINE_RESERVE

__all__ = [
    "Settings",
    "connection_budget",
    "drain",
    "enter_netns",
    "host_worker",
    "main",
    "measure",
    "median_figures",
    "run",
    "saturated_at",
]

DBNAME = "bench"
DRIVER_CONNECTIONS = 10
"""Server connections kept for the driver (backlog, counting) beside the hosts' budget."""
SATURATION_GAIN = 0.10
"""More hosts that add less than this share of jobs/s count as saturated."""
OTHER_WORK = 0.25
"""Cores of other work (the "other" column) above which the verdict warns."""
_CLONE_NEWNET = 0x40000000  # <sched.h>
_HBA = "host all all 127.42.0.0/16 trust"  # the worker ends of tests.netns' links


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a run is configured with (see ``--help``)."""

    hosts: tuple[int, ...]
    jobs: int
    slots: int
    claim_batch: int
    repeats: int
    poll_interval: float
    count_interval: float
    worker_timeout: float
    results_dir: Path

    def to_json(self) -> dict[str, Any]:
        """The settings as a JSON object (paths as strings)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: str(v) if isinstance(v, Path) else v for k, v in data.items()}


# -- pure figures ----------------------------------------------------------------------


def connection_budget(hosts: int, slots: int) -> int:
    """Server connections ``hosts`` worker hosts of ``slots`` slots may open, plus the
    driver's: each host's client opens at most ``tx_slots + ENGINE_RESERVE``, and its
    ``tx_slots`` defaults to its total of slots."""
    return hosts * (slots + ENGINE_RESERVE) + DRIVER_CONNECTIONS


def median_figures(samples: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The median of each figure over ``samples`` (the keys of the first sample).

    Raises:
        ValueError: no samples.
    """
    if not samples:
        raise ValueError("median_figures needs at least one sample")
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def saturated_at(rates: Mapping[int, float], gain: float = SATURATION_GAIN) -> int | None:
    """The smallest host count whose jobs/s is less than ``1 + gain`` times the jobs/s
    of the next smaller count measured; ``None`` while every step up still gains."""
    counts = sorted(rates)
    for smaller, larger in itertools.pairwise(counts):
        if rates[larger] < (1 + gain) * rates[smaller]:
            return larger
    return None


# -- the hosts -------------------------------------------------------------------------


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (``setns(2)``); threads
    it starts afterwards are born there too. Call it before the process opens sockets
    or starts threads.

    Raises:
        OSError: no such namespace, or ``setns`` refused (not root).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{name}") as handle:
        if libc.setns(handle.fileno(), _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, os.strerror(errno), name)


def host_worker(netns_name: str, dsn: str, **options: Any) -> None:
    """A worker host: enter ``netns_name``, then :func:`bench.workers.throughput_worker`."""
    enter_netns(netns_name)
    throughput_worker(dsn, **options)


@dataclass(frozen=True, slots=True)
class Lab:
    """The namespaces and the server of one run."""

    hosts: Hosts
    server: ThrowawayServer
    dsn: str
    """Database ``bench`` through the server's Unix socket (the driver's DSN)."""

    def host_dsn(self, link: Link) -> str:
        """Database ``bench`` over ``link``, from its worker host."""
        return make_conninfo(self.dsn, host=link.db_addr)

    def postmaster(self) -> int:
        """The pid of the server's postmaster."""
        return int((self.server.data / "postmaster.pid").read_text().split()[0])


@contextlib.contextmanager
def lab(settings: Settings) -> Iterator[Lab]:
    """The hosts and a migrated server for them; everything deleted on exit."""
    budget = connection_budget(max(settings.hosts), settings.slots)
    with netns.hosts(max(settings.hosts)) as made:
        server = ThrowawayServer(
            netns=made.db_netns,
            listen=made.db_addrs,
            hba=[_HBA],
            settings={"max_connections": str(budget)},
        )
        try:
            server.start()
            execute(server.dsn, f"CREATE DATABASE {DBNAME}")
            dsn = make_conninfo(server.dsn, dbname=DBNAME)
            cyclone.migrate(dsn)
            yield Lab(made, server, dsn)
        finally:
            server.stop()


# -- the measurements ------------------------------------------------------------------


def _cpu(lab_: Lab, pids: Sequence[int]) -> tuple[float, float]:
    """CPU seconds so far of the server's process tree and of the processes ``pids``."""
    stats = read_stats()
    tick = tick_seconds()
    return tree_ticks(stats, lab_.postmaster()) * tick, own_ticks(stats, pids) * tick


async def drain(lab_: Lab, settings: Settings, hosts: int) -> dict[str, float]:
    """Fill the backlog, start ``hosts`` worker hosts at a barrier, time the drain."""
    await fill_backlog(lab_.dsn, settings.jobs)
    options = {
        "slots": settings.slots,
        "claim_batch": settings.claim_batch,
        "poll_interval": settings.poll_interval,
    }
    links = lab_.hosts.links[:hosts]
    args = [(link.netns, lab_.host_dsn(link)) for link in links]
    async with started_together(host_worker, args, options, name="host") as fleet:
        began = time.perf_counter()
        server_before, hosts_before = _cpu(lab_, fleet.pids)
        machine_before = machine_cpu()
        async with await psycopg.AsyncConnection.connect(lab_.dsn, autocommit=True) as conn:
            await wait_completed(conn, settings, fleet, began)
            elapsed = time.perf_counter() - began
            server_after, hosts_after = _cpu(lab_, fleet.pids)
            machine = busy_cores(machine_before, machine_cpu())
            load = os.getloadavg()[0]
            span = await db_span(conn) or elapsed
    server_cpu = server_after - server_before
    hosts_cpu = hosts_after - hosts_before
    server_cores = server_cpu / elapsed
    hosts_cores = hosts_cpu / elapsed
    return {
        "hosts": hosts,
        "elapsed_s": elapsed,
        "jobs_per_s": settings.jobs / elapsed,
        "db_span_s": span,
        "server_cpu_s": server_cpu,
        "server_cores": server_cores,
        "server_us_per_job": 1e6 * server_cpu / settings.jobs,
        "hosts_cpu_s": hosts_cpu,
        "hosts_cores": hosts_cores,
        "hosts_us_per_job": 1e6 * hosts_cpu / settings.jobs,
        "machine_cores": -1.0 if machine is None else machine,
        "other_cores": -1.0 if machine is None else max(0.0, machine - server_cores - hosts_cores),
        "load_1min": load,
    }


async def measure(settings: Settings) -> tuple[dict[str, Any], list[dict[str, float]]]:
    """The server's settings and every drain, host counts interleaved per repeat."""
    samples: list[dict[str, float]] = []
    with lab(settings) as made:
        server = await asyncio.to_thread(server_settings, made.dsn)
        for repeat in range(settings.repeats):
            for hosts in settings.hosts:
                sample = await drain(made, settings, hosts)
                samples.append(sample)
                log(
                    f"  repeat {repeat + 1}, {hosts} host(s): {sample['jobs_per_s']:>8,.0f} jobs/s"
                    f"  server {sample['server_cores']:.2f} cores"
                    f" ({sample['server_us_per_job']:.0f} us/job)"
                    f"  hosts {sample['hosts_cores']:.2f} cores  load {sample['load_1min']:.2f}"
                )
    return server, samples


# -- the report ------------------------------------------------------------------------


def summarize(settings: Settings, samples: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """Per host count (in ``--hosts`` order), the median of its samples."""
    return [median_figures([s for s in samples if s["hosts"] == hosts]) for hosts in settings.hosts]


def _cores(value: float) -> str:
    return "?" if value < 0 else f"{value:.2f}"


def verdict(summary: Sequence[dict[str, float]], cpus: int) -> list[str]:
    """What the figures say about saturation, in sentences."""
    rates = {int(row["hosts"]): row["jobs_per_s"] for row in summary}
    by_hosts = {int(row["hosts"]): row for row in summary}
    lines = []
    at = saturated_at(rates)
    if at is None:
        lines.append(
            f"Throughput still grew by {SATURATION_GAIN:.0%} or more with each step up in "
            "hosts: nothing saturated yet within these host counts."
        )
    else:
        smaller = max(n for n in rates if n < at)
        row = by_hosts[at]
        lines.append(
            f"Saturated at {at} hosts: {rates[at]:,.0f} jobs/s against {rates[smaller]:,.0f} "
            f"with {smaller}, while the machine was busy {_cores(row['machine_cores'])} of "
            f"{cpus} cores (server {row['server_cores']:.2f}, hosts {row['hosts_cores']:.2f})."
        )
    last = by_hosts[max(by_hosts)]
    per_core = 1e6 / last["server_us_per_job"] if last["server_us_per_job"] > 0 else 0.0
    lines.append(
        f"The database spent {last['server_us_per_job']:.0f} us of CPU per job at "
        f"{int(last['hosts'])} hosts (its share of a claim statement, of a completion "
        "transaction that locks the run, CAS-updates the step and finishes the run row, "
        f"and of their commits): one server core carries about {per_core:,.0f} jobs/s at "
        "that cost."
    )
    busiest = max(row["other_cores"] for row in summary)
    if busiest > OTHER_WORK:
        lines.append(
            f"Other work on the machine took up to {busiest:.2f} cores during the drains: "
            "the figures are squeezed by it; rerun on a quiet machine before reading much "
            "into them."
        )
    lines.append(
        f"Here the hosts share this machine's {cpus} cores with the server: once server and "
        "worker CPU fill them, another host takes CPU from the database rather than adding "
        "jobs/s. On separate machines the ceiling of one primary is its cores times the "
        "jobs/s per server core above."
    )
    return lines


def print_report(
    settings: Settings, server: Mapping[str, Any], summary: Sequence[dict[str, float]]
) -> list[str]:
    """The table and the verdict on stdout; the verdict's lines."""
    cpus = os.cpu_count() or 1
    budget = connection_budget(max(settings.hosts), settings.slots)
    print()
    print(
        f"Cyclone {cyclone.__version__} scale-out: worker hosts (network namespaces, one "
        f"worker process each, {settings.slots} slots, claim_batch {settings.claim_batch}) "
        f"against one throwaway PostgreSQL {server.get('server_version')} (fsync="
        f"{server.get('fsync')}, max_connections {budget}) on {cpus} cores; "
        f"{settings.jobs:,} no-op jobs per drain, median of {settings.repeats}"
    )
    one = next((row["jobs_per_s"] for row in summary if row["hosts"] == 1), None)
    lines: list[tuple[str, ...]] = [
        (
            "hosts",
            "jobs/s",
            "vs 1 host",
            "server cores",
            "server us/job",
            "hosts cores",
            "hosts us/job",
            "other cores",
            "machine cores",
            "load 1m",
        )
    ]
    for row in summary:
        lines.append(
            (
                str(int(row["hosts"])),
                f"{row['jobs_per_s']:,.0f}",
                "" if not one else f"{row['jobs_per_s'] / one:.2f}x",
                f"{row['server_cores']:.2f}",
                f"{row['server_us_per_job']:,.0f}",
                f"{row['hosts_cores']:.2f}",
                f"{row['hosts_us_per_job']:,.0f}",
                _cores(row["other_cores"]),
                _cores(row["machine_cores"]),
                f"{row['load_1min']:.2f}",
            )
        )
    print()
    print(text_table(lines, right=range(10)))
    print()
    print(
        "jobs/s from the start barrier to the last completion seen. cores = CPU-seconds per "
        "second over that span:\nserver = the postmaster and all its children, hosts = the "
        "worker processes, other = the rest of\nthe machine's busy time (this driver, the "
        "kernel's packet work on the links, other sessions).\nus/job = CPU microseconds per "
        "job. load 1m = the 1-minute load average at the end of the drain."
    )
    said = verdict(summary, cpus)
    print()
    for sentence in said:
        print(sentence)
    return said


def run(settings: Settings) -> dict[str, Any]:
    """Measure, print the report, write the JSON; the results as a dict."""
    started = datetime.now(UTC)
    log(f"measuring {settings.hosts} host(s), {settings.repeats} repeat(s):")
    server, samples = asyncio.run(measure(settings))
    summary = summarize(settings, samples)
    said = print_report(settings, server, summary)
    results = {
        **provenance(started, server, settings.to_json()),
        "connection_budget": connection_budget(max(settings.hosts), settings.slots),
        "samples": samples,
        "summary": summary,
        "verdict": said,
    }
    write_results(settings.results_dir, "scale", started, results)
    return results


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """The command line as :class:`Settings`."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale",
        description="No-op jobs/s of worker hosts in network namespaces on one database.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add = parser.add_argument
    add("--hosts", type=int, nargs="+", default=[1, 2, 4], help="worker host counts")
    add("--jobs", type=int, default=20_000, help="no-op runs each drain works off")
    add("--slots", type=int, default=20, help="worker slots per host")
    add("--claim-batch", type=int, default=10, help="steps per claim statement")
    add("--repeats", type=int, default=3, help="drains per host count (the median is shown)")
    add("--poll-interval", type=float, default=1.0, help="workers' poll interval (s)")
    add("--count-interval", type=float, default=0.05, help="completed-count poll interval (s)")
    add("--worker-timeout", type=float, default=120.0, help="give up on a drain after (s)")
    add("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    if min(*args.hosts, args.jobs, args.slots, args.claim_batch, args.repeats) < 1:
        parser.error("--hosts, --jobs, --slots, --claim-batch and --repeats must be >= 1")
    if len(set(args.hosts)) != len(args.hosts):
        parser.error(f"--hosts names a count twice: {args.hosts}")
    if not (netns.available() and throwaway.available()):
        parser.error("needs root, `ip`, `sysctl` and initdb/pg_ctl (or pgserver)")
    return Settings(**{**vars(args), "hosts": tuple(args.hosts)})


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.scale``."""
    run(parse_args(argv))


if __name__ == "__main__":
    main()
