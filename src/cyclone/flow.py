"""Flow control declarations: a kind's limits, rate limits, and item keys.

A kind declares ``max_concurrency`` (at most that many of its steps with one
``concurrency_key`` run at once, on all workers), ``rate_limit`` (at most ``count +
burst`` of its steps with one ``rate_key`` start in any window of ``per`` seconds) and
``max_snoozes`` (how often a handler may raise :class:`cyclone.Snooze` for one step).
Every client that registers the kind writes these to ``cyclone_kind_limits`` when it
starts; every claim applies the stored values (docs/flow-control.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from cyclone.errors import ValidationError
from cyclone.options import INT32_MAX, Duration, check_int, check_text, seconds

__all__ = [
    "DEFAULT_MAX_SNOOZES",
    "MAX_RATE",
    "ItemKey",
    "KindLimits",
    "RateLimit",
    "check_flow_key",
    "rate_limit_of",
]

MAX_RATE = 10_000
"""Largest ``count + burst`` of a rate limit: a bucket keeps the time of every start in
its window, and a claim reads and rewrites them (about 8 bytes each)."""

DEFAULT_MAX_SNOOZES = 100
"""Snoozes allowed for one step before it is discarded (``error_kind = 'snooze_limit'``)."""

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"\s*([0-9]+)\s*/\s*([smh])\s*", re.ASCII)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count + burst`` starts in any window of ``per`` seconds.

    Over a long stretch the steps of one bucket start at ``count`` per ``per`` seconds
    on average; after a quiet spell up to ``burst`` more may start at once (a token
    bucket of ``count + burst`` tokens refilled at ``count / per`` a second), and
    never more than ``count + burst`` in any window of ``per`` seconds (a sliding log
    of start times). ``RateLimit.parse("100/s")``, ``"100/m"`` and ``"100/h"`` give
    ``count`` per second, minute or hour with ``burst = 0``.

    Attributes:
        count: starts per window (>= 1).
        per: the window, seconds (1 ms to one day).
        burst: extra starts allowed after a quiet spell (>= 0); ``count + burst`` is at
            most :data:`MAX_RATE` (10,000).

    Raises:
        ValidationError: a count, window or burst out of range.
    """

    __module__ = "cyclone"

    count: int
    per: float = 1.0
    burst: int = 0

    def __init__(self, count: int, per: Duration = 1.0, burst: int = 0) -> None:
        object.__setattr__(self, "count", check_int(count, "rate_limit count", 1, MAX_RATE))
        window = seconds(per, "rate_limit per", minimum=0.001, maximum=86_400.0)
        assert window is not None
        object.__setattr__(self, "per", window)
        object.__setattr__(self, "burst", check_int(burst, "rate_limit burst", 0, MAX_RATE))
        if self.count + self.burst > MAX_RATE:
            raise ValidationError(
                f"rate_limit count + burst must be at most {MAX_RATE:,} (each start in the "
                f"window is kept), got {self.count} + {self.burst}"
            )

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"100/s"``, ``"100/m"`` or ``"100/h"`` as a :class:`RateLimit`.

        Raises:
            ValidationError: any other text, naming it.
        """
        match = _RATE.fullmatch(text)
        if match is None:
            raise ValidationError(
                f"rate_limit must look like '100/s', '100/m' or '100/h', got {text!r}"
            )
        return cls(int(match.group(1)), per=_UNITS[match.group(2)])

    def __str__(self) -> str:
        per = f"{self.per:g}s"
        for unit, size in _UNITS.items():
            if self.per == size:
                per = unit
        burst = f" +{self.burst}" if self.burst else ""
        return f"{self.count}/{per}{burst}"


def rate_limit_of(value: Any) -> RateLimit | None:
    """A kind's ``rate_limit`` option: ``None``, a :class:`RateLimit` or its text form.

    Raises:
        ValidationError: anything else, naming it.
    """
    if value is None or isinstance(value, RateLimit):
        return value
    if isinstance(value, str):
        return RateLimit.parse(value)
    raise ValidationError(f"rate_limit must be a cyclone.RateLimit or '100/s', got {value!r}")


@dataclass(frozen=True, slots=True)
class KindLimits:
    """What a kind declares for flow control (stored in ``cyclone_kind_limits``).

    Attributes:
        max_concurrency: steps of one concurrency key running at once, or ``None``.
        rate_limit: starts of one rate key per window, or ``None``.
        max_snoozes: snoozes of one step before it is discarded (>= 0).
    """

    __module__ = "cyclone"

    max_concurrency: int | None = None
    rate_limit: RateLimit | None = None
    max_snoozes: int = DEFAULT_MAX_SNOOZES

    @classmethod
    def build(
        cls,
        *,
        max_concurrency: int | None = None,
        rate_limit: RateLimit | str | None = None,
        max_snoozes: int = DEFAULT_MAX_SNOOZES,
    ) -> KindLimits:
        """Validated limits; raises ``ValidationError`` naming the first bad one."""
        if max_concurrency is not None:
            check_int(max_concurrency, "max_concurrency", 1)
        return cls(
            max_concurrency=max_concurrency,
            rate_limit=rate_limit_of(rate_limit),
            max_snoozes=check_int(max_snoozes, "max_snoozes", 0, INT32_MAX),
        )

    @property
    def claims_limited(self) -> bool:
        """True when a claim of the kind must count its groups or buckets."""
        return self.max_concurrency is not None or self.rate_limit is not None

    def describe(self) -> str:
        """The limits in a few words, for a log line or ``cyclone kinds``."""
        parts = []
        if self.max_concurrency is not None:
            parts.append(f"max_concurrency={self.max_concurrency}")
        if self.rate_limit is not None:
            parts.append(f"rate_limit={self.rate_limit}")
        parts.append(f"max_snoozes={self.max_snoozes}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class ItemKey:
    """A fan-out item's key taken from a field of the item.

    ``wf.fan_out(..., concurrency_key=cyclone.ItemKey("tenant"))`` gives each item task
    the value of the item's ``"tenant"`` field as its key (as text: a string as it
    is, any other JSON value in its JSON form). An item without the field, or that is
    not an object, has no key. Stored in the node definition and part of its
    ``def_version``.

    Raises:
        ValidationError: an empty field name or one over 1,024 bytes.
    """

    __module__ = "cyclone"

    field: str

    def __init__(self, field: str) -> None:
        object.__setattr__(self, "field", check_text(field, "ItemKey field"))


def check_flow_key(value: Any, name: str) -> str | None:
    """A ``concurrency_key``, ``rate_key`` or ``fairness_key``: ``None`` or a non-empty
    string without NUL of at most 1,024 bytes.

    Raises:
        ValidationError: anything else, naming ``name`` and the value.
    """
    if value is None:
        return None
    return check_text(value, name)
