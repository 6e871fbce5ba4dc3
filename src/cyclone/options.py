"""Validation of the scalar options of kinds, jobs and clients.

Every check raises :class:`cyclone.ValidationError` naming the bad value, before any
statement runs. Durations accept ``timedelta`` or seconds as a
number (docs/design.md, Jobs); datetimes must be timezone-aware.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from cyclone.errors import ValidationError

__all__ = [
    "INT32_MAX",
    "MAX_KEY_BYTES",
    "MAX_QUEUE_BYTES",
    "Duration",
    "JobOptions",
    "check_aware",
    "check_int",
    "check_kind",
    "check_queue",
    "check_text",
    "micros",
    "seconds",
]

INT32_MAX = 2**31 - 1
MAX_QUEUE_BYTES = 256
"""The queue cap of the schema (cyclone_steps_queue_check)."""
MAX_KEY_BYTES = 1024
"""Longest kind, unique_key or sequence_key accepted; keys live in btree indexes."""

Duration = timedelta | float | int
"""A length of time: a ``timedelta``, or seconds as a number."""


CENTURY = 100 * 365.25 * 24 * 3600.0
"""The longest duration accepted by default (100 years): it fits PostgreSQL intervals."""
DAY = 24 * 3600.0
HOUR = 3600.0


def seconds(
    value: Duration | None,
    name: str,
    *,
    allow_zero: bool = False,
    minimum: float = 0.0,
    maximum: float = CENTURY,
) -> float | None:
    """``value`` as seconds (``None`` passes through).

    Raises:
        ValidationError: not a duration, not finite, negative, zero when ``allow_zero``
            is false, or outside ``[minimum, maximum]`` seconds.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ValidationError(f"{name} must be a timedelta or seconds, got {value!r}")
    if not math.isfinite(result) or result < 0 or (result == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "positive"
        raise ValidationError(f"{name} must be {bound}, got {value!r}")
    if result > maximum or (result and result < minimum):
        raise ValidationError(
            f"{name} must be between {minimum:g} and {maximum:g} seconds, got {value!r}"
        )
    return result


def micros(value: float | None) -> int | None:
    """Seconds as whole microseconds, the unit durations travel to SQL in."""
    return None if value is None else round(value * 1_000_000)


def check_text(value: Any, name: str, *, max_bytes: int = MAX_KEY_BYTES) -> str:
    """A non-empty string without NUL of at most ``max_bytes`` UTF-8 bytes."""
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {value!r}")
    if not value:
        raise ValidationError(f"{name} must not be empty")
    if "\x00" in value:
        raise ValidationError(f"{name} must not contain NUL, got {value!r}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValidationError(f"{name} holds a lone surrogate, not UTF-8: {value!a}") from None
    if size > max_bytes:
        shown = value if len(value) <= 80 else f"{value[:80]}..."
        raise ValidationError(f"{name} is {size} bytes, over the {max_bytes}-byte cap: {shown!r}")
    return value


def check_queue(value: Any) -> str:
    """A queue name: non-empty, no NUL, at most 256 UTF-8 bytes."""
    return check_text(value, "queue", max_bytes=MAX_QUEUE_BYTES)


def check_kind(value: Any) -> str:
    """A kind name: non-empty, no NUL, at most 1,024 UTF-8 bytes."""
    return check_text(value, "kind")


def check_int(value: Any, name: str, low: int, high: int = INT32_MAX) -> int:
    """An ``int`` (not a bool) within ``[low, high]``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValidationError(f"{name} must be between {low} and {high}, got {value!r}")
    return value


def check_aware(value: Any, name: str) -> datetime:
    """A timezone-aware ``datetime`` (a naive one is ambiguous)."""
    if not isinstance(value, datetime):
        raise ValidationError(f"{name} must be a datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"{name} must be timezone-aware, got naive {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The per-step options a kind declares and an enqueue may override.

    Attributes:
        queue: queue name (at most 256 bytes).
        priority: higher claims first (int32).
        max_attempts: failed executions allowed before the step is discarded (>= 1).
        timeout: seconds one execution may take, or ``None``.
        retention: seconds to keep the finished run, or ``None`` for the client default.
    """

    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    timeout: float | None = None
    retention: float | None = None

    @classmethod
    def build(
        cls,
        *,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: Duration | None = None,
        retention: Duration | None = None,
    ) -> JobOptions:
        """Validated options; raises ``ValidationError`` naming the first bad one."""
        return cls(
            queue=check_queue(queue),
            priority=check_int(priority, "priority", -INT32_MAX - 1),
            max_attempts=check_int(max_attempts, "max_attempts", 1),
            timeout=seconds(timeout, "timeout", minimum=0.001),
            retention=seconds(retention, "retention", allow_zero=True),
        )

    def override(self, **changes: Any) -> JobOptions:
        """A validated copy with the given options replaced (``None`` keeps a value)."""
        given = {key: value for key, value in changes.items() if value is not None}
        if not given:
            return self
        current = {field.name: getattr(self, field.name) for field in fields(self)}
        return JobOptions.build(**(current | given))
