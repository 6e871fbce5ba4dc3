"""What both clients' ``wait`` share: how long to pause before reading a run again."""

from __future__ import annotations

from cyclone.errors import WaitTimeout
from cyclone.records import Run

__all__ = ["WAIT_DOC", "Deadline", "wait_pause"]

WAIT_DOC = """Block until the run is terminal; the terminal :class:`Run`.

Wakes on ``cyclone_run_done`` when LISTEN is available (``Client``: its listener LISTENs
on that channel only while a wait is pending, and the run is read again once the LISTEN
is in place, so a run that ends meanwhile is not missed; ``SyncClient``: on a connection
of its own while it waits, unless ``notify=False``), and polls every ``poll_interval``
in any case; a database that goes away meanwhile (a restart) is waited for too.

Raises:
    NotFoundError: no run has that id.
    ValidationError: a bad run reference or timeout.
    WaitTimeout: not terminal within ``timeout`` seconds.
"""
"""The docstring of both clients' ``wait``."""

Deadline = tuple[float, float] | None
"""A wait's limit in seconds and the clock time it ends at, or ``None``: no limit."""


def wait_pause(
    run_id: int, current: Run | None, poll_interval: float, deadline: Deadline, now: float
) -> float:
    """Seconds a ``wait`` for a run not yet terminal (``current``, ``None`` when it could
    not be read) sleeps before it reads the run again: ``poll_interval``, cut to the
    time left before ``deadline`` (``(limit, clock time)``, or ``None``) at ``now``.

    Raises:
        WaitTimeout: the deadline has passed.
    """
    if deadline is None:
        return poll_interval
    limit, at = deadline
    remaining = at - now
    if remaining <= 0:
        state = current.state.value if current else "unknown"
        raise WaitTimeout(f"run {run_id} is still {state} after {limit} s")
    return min(poll_interval, remaining)
