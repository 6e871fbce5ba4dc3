"""Retry policy of a kind: exponential backoff with jitter and a cap.

A failed attempt with attempts left makes the step claimable again after
:meth:`RetryPolicy.delay` seconds, applied on the database clock (``scheduled_at =
now() + delay``). The delay stays finite and capped at any attempt count.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cyclone.errors import ValidationError
from cyclone.options import CENTURY, Duration, seconds

__all__ = ["DEFAULT_RETRY", "WRITE_RETRIES", "RetryPolicy", "error_backoff"]


@dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """Backoff between failed attempts (docs/design.md, Jobs: per-kind retry policy).

    The delay after the ``n``-th failed attempt is ``min(cap, base * factor ** (n - 1))``
    seconds, shortened by up to ``jitter`` of itself at random so that steps failing
    together do not retry together.

    Args:
        base: time before the first retry, a ``timedelta`` or seconds (> 0).
        factor: growth per attempt, a number (>= 1).
        cap: the longest delay, a ``timedelta`` or seconds (>= base).
        jitter: fraction of the delay taken off at random, a number in [0, 1].

    Attributes:
        base: seconds before the first retry (a float).
        factor: growth per attempt.
        cap: the longest delay in seconds (a float).
        jitter: fraction of the delay taken off at random.

    Raises:
        ValidationError: a value of the wrong type or out of the ranges above, named.
    """

    __module__ = "cyclone"

    base: float
    factor: float
    cap: float
    jitter: float

    def __init__(
        self,
        base: Duration = 1.0,
        factor: float = 2.0,
        cap: Duration = 600.0,
        jitter: float = 0.5,
    ) -> None:
        base_s = _duration(base, "base")
        cap_s = _duration(cap, "cap")
        if cap_s < base_s:
            raise ValidationError(f"RetryPolicy cap must be at least base ({base!r}), got {cap!r}")
        object.__setattr__(self, "base", base_s)
        object.__setattr__(self, "factor", _number(factor, "factor", 1.0, math.inf))
        object.__setattr__(self, "cap", cap_s)
        object.__setattr__(self, "jitter", _number(jitter, "jitter", 0.0, 1.0))

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after ``failures`` failed attempts (``failures >= 1``)."""
        exponent = max(0, failures - 1)
        # Past the exponent where base * factor**n reaches the cap, skip the power:
        # it could overflow a float for a large attempt count.
        if self.factor == 1 or exponent < math.log(self.cap / self.base, self.factor) + 1:
            raw = min(self.cap, self.base * self.factor**exponent)
        else:
            raw = self.cap
        return raw * (1 - self.jitter * rand())


def _duration(value: Any, name: str) -> float:
    """A positive duration (``timedelta`` or seconds) as float seconds."""
    if value is None:
        raise ValidationError(f"RetryPolicy {name} must be a timedelta or seconds, got None")
    result = seconds(value, f"RetryPolicy {name}", maximum=CENTURY)
    assert result is not None
    return result


def _number(value: object, name: str, low: float, high: float) -> float:
    """A real number (not a bool) in ``[low, high]``, finite, as a float."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValidationError(f"RetryPolicy {name} must be a number, got {value!r}")
    if not math.isfinite(value) or not low <= value <= high:
        raise ValidationError(f"RetryPolicy {name} out of range: {value!r}")
    return float(value)


DEFAULT_RETRY = RetryPolicy()
"""1 s, doubling, capped at 10 minutes, with up to 50 % jitter."""


WRITE_RETRIES = 5
"""Attempts to write an outcome before the engine leaves the step to the sweep."""
_ERROR_BACKOFF_CAP = 10.0  # seconds between attempts of a failing engine loop, at most


def error_backoff(failures: int) -> float:
    """Seconds an engine loop waits after ``failures`` consecutive errors.

    0.1 s doubling, capped at 10 s: finite at any count.
    """
    return min(_ERROR_BACKOFF_CAP, 0.1 * 2.0 ** min(failures, 16))
