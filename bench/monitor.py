"""Foreign load on the database server while a figure is measured.

The benchmark machine may be shared (other sessions running tests on the same server),
and a figure bound by commit flushes moves a lot when someone else commits too. A
thread samples ``pg_stat_activity`` twice a second for client backends that are active
in databases other than the benchmark's own; :meth:`LoadMonitor.window` reports, for the
span of one measurement, the share of samples that saw any, so that a figure taken
beside foreign work can be told apart from a clean one, and the mean of the machine's
one-minute load average over those samples (``load_avg``). :meth:`LoadMonitor.own`
adds a database made later (a fresh one per drain) to the benchmark's own.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

__all__ = ["LoadMonitor", "busy_cores", "machine_cpu"]

_FOREIGN = """
SELECT datname, count(*)
FROM pg_stat_activity
WHERE backend_type = 'client backend'
  AND state = 'active'
  AND pid <> pg_backend_pid()
  AND datname <> ALL(%s::text[])
GROUP BY datname
"""


def machine_cpu() -> tuple[int, int] | None:
    """Busy and total CPU ticks of the machine since boot (Linux), else ``None``.

    Busy counts user, nice, system, irq, softirq and steal time; total adds idle and
    iowait. The busy share of a span, times the number of CPUs, is the cores it used.
    """
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def busy_cores(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Cores the whole machine kept busy between two :func:`machine_cpu` readings."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)


class LoadMonitor:
    """Samples foreign database activity from a thread while it is entered."""

    def __init__(self, admin_dsn: str, own: set[str], *, interval: float = 0.5) -> None:
        self._dsn = admin_dsn
        self._own = sorted(own)
        self._interval = interval
        self._lock = threading.Lock()
        self._samples: list[dict[str, int]] = []
        self._loads: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-monitor", daemon=True)
        self.error: str | None = None

    def __enter__(self) -> LoadMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            with psycopg.connect(self._dsn, autocommit=True) as conn:
                while not self._stop.wait(self._interval):
                    with self._lock:
                        own = list(self._own)
                    rows = conn.execute(_FOREIGN, [own]).fetchall()
                    load = os.getloadavg()[0]
                    with self._lock:
                        self._samples.append({str(db): int(n) for db, n in rows})
                        self._loads.append(load)
        except psycopg.Error as exc:  # the figures matter more than the monitor
            self.error = str(exc)

    def own(self, dbname: str) -> None:
        """Count database ``dbname`` as the benchmark's own from now on."""
        with self._lock:
            self._own = sorted({*self._own, dbname})

    def take(self) -> dict[str, Any]:
        """What the samples since the previous call saw; starts a new window."""
        with self._lock:
            samples, self._samples = self._samples, []
            loads, self._loads = self._loads, []
        busy = [s for s in samples if s]
        return {
            "samples": len(samples),
            "busy_share": len(busy) / len(samples) if samples else None,
            "load_avg": sum(loads) / len(loads) if loads else os.getloadavg()[0],
            "max_foreign_active": max((sum(s.values()) for s in busy), default=0),
            "databases": sorted({db for s in busy for db in s}),
        }

    @contextlib.contextmanager
    def window(self) -> Iterator[dict[str, Any]]:
        """A dict filled with :meth:`take` for the span of the ``with`` block."""
        self.take()
        seen: dict[str, Any] = {}
        yield seen
        seen.update(self.take())
