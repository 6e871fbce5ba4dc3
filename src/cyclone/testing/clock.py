"""Moving time forward for tests: :func:`advance_time`.

The database clock is the only clock Cyclone reads (every due time, lease and deadline
is computed with ``now()``), so a test never sleeps: it moves rows. ``advance_time``
moves every due time and deadline earlier by the given seconds, which is, for what is
due, the same as that much time passing.
"""

from __future__ import annotations

from dataclasses import dataclass

from cyclone.client import Client
from cyclone.dbio import Stmt, batch_async
from cyclone.errors import ValidationError
from cyclone.options import CENTURY, Duration, micros
from cyclone.options import seconds as as_seconds
from cyclone.sql import Q
from cyclone.testing.inline import check_client

__all__ = ["Shifted", "advance_time"]


@dataclass(frozen=True, slots=True)
class Shifted:
    """What :func:`advance_time` moved.

    Attributes:
        steps: steps whose due time (or uniqueness window) moved.
        runs: runs whose deadline moved.
        buckets: rate-limit buckets whose window (and token refill) moved.
    """

    __module__ = "cyclone.testing"

    steps: int
    runs: int
    buckets: int = 0


async def advance_time(client: Client, seconds: Duration) -> Shifted:
    """Act as if ``seconds`` had passed, without waiting: in one transaction, move
    earlier by that much the ``scheduled_at`` of every step not yet run or waiting
    (retry and snooze backoffs, jobs scheduled for later, timers, signal-wait timeouts),
    the end of every uniqueness window (``unique_until``), the ``deadline_at`` of
    every unfinished run, and the starts and token refill of every rate-limit bucket
    (so a rate-limited kind gets the room that much time gives). Running steps, their
    leases and finished rows keep their times; schedules are not moved.

    Nothing runs here: the next :func:`drain` finds what became due (a timer completes,
    a retry runs, a deadline fails its run).

    Args:
        client: the :class:`cyclone.Client` whose database (and schema) to change.
        seconds: how far to move, in seconds (from a microsecond to a century) or
            a ``timedelta``.

    Returns:
        How many steps and runs moved.

    Raises:
        ValidationError: ``client`` is not a ``cyclone.Client``, or ``seconds`` is not
            a positive, finite duration (nothing is written then).
    """
    checked = check_client(client, "advance_time")
    if seconds is None:
        raise ValidationError("seconds must be a timedelta or seconds, got None")
    by = as_seconds(seconds, "seconds", minimum=1e-6, maximum=CENTURY)
    assert by is not None
    params = {"by_us": micros(by)}
    async with checked._engine_connection() as conn:
        results = await batch_async(
            conn,
            [
                Stmt(Q.testing_shift_steps, params),
                Stmt(Q.testing_shift_runs, params),
                Stmt(Q.testing_shift_buckets, params),
            ],
            transaction=True,
        )
    (steps,) = results.of(Q.testing_shift_steps)
    (runs,) = results.of(Q.testing_shift_runs)
    (buckets,) = results.of(Q.testing_shift_buckets)
    return Shifted(steps=steps.total, runs=runs.total, buckets=buckets.total)
