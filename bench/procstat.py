"""CPU time of a process and its children, read from ``/proc`` (Linux).

The scale-out benchmark charges the database server with the CPU of its whole process
tree: the postmaster and every process it started (client backends, the WAL writer,
the checkpointer, autovacuum workers, ...). A child that exits between two readings
would take its time with it, but the postmaster waits for each child it starts, and
the kernel then adds the child's time to the postmaster's ``cutime`` and ``cstime``:
so :func:`tree_ticks` (the root's own and reaped children's time plus the live
children's own) only grows, whatever comes and goes between two readings.

:func:`own_ticks` counts other processes alone (the benchmark's worker hosts).
:func:`parse_stat`, :func:`tree_ticks` and :func:`own_ticks` are pure; :func:`read_stats`
reads ``/proc``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcStat", "own_ticks", "parse_stat", "read_stats", "tick_seconds", "tree_ticks"]


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the CPU accounting needs, in clock ticks."""

    pid: int
    ppid: int
    utime: int
    """User time of the process itself (every thread)."""
    stime: int
    """System time of the process itself."""
    cutime: int
    """User time of its children that exited and were waited for."""
    cstime: int
    """System time of those children."""


def parse_stat(text: str) -> ProcStat:
    """One ``/proc/<pid>/stat`` line as a :class:`ProcStat`.

    The command name (field 2) stands in parentheses and may hold spaces and
    parentheses itself, so the fields are counted from its last ``)``.

    Raises:
        ValueError: ``text`` is not a stat line (no ``(``/``)`` or too few fields).
    """
    head, close, tail = text.rpartition(")")
    pid_text, open_, _ = head.partition(" (")
    fields = tail.split()
    if not close or not open_ or len(fields) < 15:
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:80]!r}")
    # fields[0] is field 3 (state); ppid is field 4, utime..cstime fields 14-17
    return ProcStat(
        pid=int(pid_text),
        ppid=int(fields[1]),
        utime=int(fields[11]),
        stime=int(fields[12]),
        cutime=int(fields[13]),
        cstime=int(fields[14]),
    )


def tree_ticks(stats: Iterable[ProcStat], root: int) -> int:
    """CPU ticks of process ``root``, its reaped children and its live children.

    The root counts its own time and its waited-for children's (``cutime + cstime``);
    each live direct child counts its own (its reaped children reach the root's count
    once it exits; PostgreSQL's backends start none). 0 when ``root`` is not among
    ``stats``.
    """
    total = 0
    for stat in stats:
        if stat.pid == root:
            total += stat.utime + stat.stime + stat.cutime + stat.cstime
        elif stat.ppid == root:
            total += stat.utime + stat.stime
    return total


def own_ticks(stats: Iterable[ProcStat], pids: Iterable[int]) -> int:
    """CPU ticks of the processes ``pids`` themselves (those among ``stats``)."""
    wanted = set(pids)
    return sum(stat.utime + stat.stime for stat in stats if stat.pid in wanted)


def read_stats(proc: Path = Path("/proc")) -> list[ProcStat]:
    """Every process's stat right now; processes gone while reading are left out."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            found.append(parse_stat((entry / "stat").read_text()))
        except (OSError, ValueError):
            continue
    return found


def tick_seconds() -> float:
    """Seconds per clock tick of the ``/proc`` CPU fields."""
    return 1.0 / os.sysconf("SC_CLK_TCK")
