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

from cyclone.errors import ValidationError

__all__ = ["DEFAULT_RETRY", "WRITE_RETRIES", "RetryPolicy", "error_backoff"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff between failed attempts (decisions.md, Jobs: per-kind retry policy).

    The delay after the ``n``-th failed attempt is ``min(cap, base * factor ** (n - 1))``
    seconds, shortened by up to ``jitter`` of itself at random so that steps failing
    together do not retry together.

    Attributes:
        base: seconds before the first retry (> 0).
        factor: growth per attempt (>= 1).
        cap: the longest delay in seconds (>= base).
        jitter: fraction of the delay taken off at random, in [0, 1].

    Raises:
        ValidationError: a value out of the ranges above.
    """

    __module__ = "cyclone"

    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        checks = {
            "base": self.base > 0,
            "factor": self.factor >= 1,
            "cap": self.cap >= self.base,
            "jitter": 0 <= self.jitter <= 1,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValidationError(f"RetryPolicy {name} out of range: {value!r}")

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
