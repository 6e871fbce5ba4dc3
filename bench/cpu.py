"""Server CPU time of the backends that serve a benchmark's clients.

A backend is one server process per connection, so its CPU time is in
``/proc/<pid>/stat`` (fields 14 and 15, ``utime`` and ``stime``, in clock ticks of
``os.sysconf('SC_CLK_TCK')``), readable when the server runs on this machine.
:class:`BackendCpu` finds the backends of one database whose ``application_name``
starts with a prefix (``cyclone`` for Cyclone's connections, ``pgbench`` for the raw
limit's) in ``pg_stat_activity``, and samples their CPU time when it starts, every
``interval`` seconds in between, and when it stops:

* a backend seen at the start counts from its CPU time then;
* a backend that appears later counts from 0 (its connection started during the span,
  so all of its time belongs to it, its start-up included);
* a backend that exits before the end counts up to the last value seen (up to one
  ``interval`` of its time is lost: sample often for short spans).

The result, :class:`ServerCpu`, is the sum over backends in seconds. (:mod:`bench.scale`
charges the server's whole process tree instead, through :mod:`bench.procstat`: that
counts the WAL writer, the checkpointer and autovacuum too, and every database's
backends; here only the benchmark's own connections count, which a shared server
allows.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg

from bench.procstat import parse_stat

__all__ = ["CLOCK_TICKS", "BackendCpu", "ServerCpu", "cpu_used", "read_ticks", "stat_ticks"]

_Key = TypeVar("_Key", bound=Hashable)

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""Clock ticks per second, the unit of ``utime`` and ``stime``."""

_BACKENDS = """
SELECT pid, backend_start
FROM pg_stat_activity
WHERE datname = current_database()
  AND starts_with(application_name, %s)
  AND pid <> pg_backend_pid()
"""


def stat_ticks(stat: str) -> int:
    """``utime + stime`` (clock ticks, fields 14 and 15) of one ``/proc/<pid>/stat``
    line, parsed by :func:`bench.procstat.parse_stat`.

    Raises:
        ValueError: ``stat`` is not such a line.
    """
    parsed = parse_stat(stat)
    return parsed.utime + parsed.stime


def read_ticks(pid: int) -> int | None:
    """``utime + stime`` of process ``pid`` in clock ticks; ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat_ticks(stat.read())
    except (OSError, ValueError):
        return None


def cpu_used(first: Mapping[_Key, int], last: Mapping[_Key, int]) -> int:
    """Ticks used between two samplings: each backend's last value seen, less its value
    at the start (0 for a backend that was not there then)."""
    return sum(max(0, ticks - first.get(key, 0)) for key, ticks in last.items())


@dataclass(frozen=True, slots=True)
class ServerCpu:
    """What :class:`BackendCpu` measured: CPU seconds of ``backends`` backends."""

    seconds: float | None
    backends: int
    samples: int
    error: str | None = None

    def us_per(self, count: int) -> float | None:
        """Microseconds of server CPU per one of ``count`` (jobs, steps)."""
        if self.seconds is None or count <= 0:
            return None
        return 1e6 * self.seconds / count

    def to_json(self) -> dict[str, Any]:
        """The measure as a JSON object."""
        return {
            "seconds": self.seconds,
            "backends": self.backends,
            "samples": self.samples,
            "error": self.error,
        }


class BackendCpu:
    """Samples the CPU time of the backends of one database from :meth:`start` to
    :meth:`stop`.

    Args:
        dsn: a DSN of the database whose backends are measured (the sampler's own
            connection there is named ``bench-cpu``, which no prefix here matches).
        prefix: the start of the ``application_name`` of the backends to count.
        interval: seconds between samples while it runs.
    """

    def __init__(self, dsn: str, prefix: str, *, interval: float = 0.5) -> None:
        self._dsn = dsn
        self._prefix = prefix
        self._interval = interval
        self._first: dict[Hashable, int] = {}
        self._last: dict[Hashable, int] = {}
        self._samples = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._result: ServerCpu | None = None
        self.error: str | None = None

    def _sample(self) -> dict[Hashable, int]:
        assert self._conn is not None
        found: dict[Hashable, int] = {}
        for pid, started in self._conn.execute(_BACKENDS, [self._prefix]).fetchall():
            ticks = read_ticks(int(pid))
            if ticks is not None:
                found[(int(pid), started)] = ticks
        self._last.update(found)
        self._samples += 1
        return found

    def _run(self) -> None:
        try:
            while not self._stop.wait(self._interval):
                self._sample()
        except psycopg.Error as exc:  # the figures matter more than this measure
            self.error = str(exc)

    def start(self) -> BackendCpu:
        """Take the first sample and start sampling in a thread."""
        self._conn = psycopg.connect(self._dsn, autocommit=True, application_name="bench-cpu")
        row = self._conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        if read_ticks(int(row[0])) is None:
            self.error = "the server's processes are not in this machine's /proc"
        self._first = self._sample()
        self._thread = threading.Thread(target=self._run, name="bench-cpu", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ServerCpu:
        """Take the last sample, stop, and say what the backends used since the start
        (the same answer again when called again)."""
        if self._result is None:
            self._result = self._finish()
        return self._result

    def _finish(self) -> ServerCpu:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._conn is None:
            return ServerCpu(None, 0, 0, "never started")
        try:
            if self.error is None:
                self._sample()
        except psycopg.Error as exc:
            self.error = str(exc)
        finally:
            self._conn.close()
        if self.error is not None:
            return ServerCpu(None, len(self._last), self._samples, self.error)
        seconds = cpu_used(self._first, self._last) / CLOCK_TICKS
        return ServerCpu(seconds, len(self._last), self._samples)
