"""Jinja2 filters of the dashboard's templates: times, ages, durations, numbers.

Each returns plain text; the templates' autoescaping escapes it like any other value.
Times are shown in UTC by the server (``2026-12-02 19:30:05``) inside ``<time
datetime=...>`` elements, which the page's script rewrites in the browser's zone.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jinja2

from cyclone.render import zone_time

__all__ = ["ago", "duration", "install_filters", "iso", "number", "when", "zoned"]


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def when(value: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in UTC; ``-`` for ``None``."""
    if value is None:
        return "-"
    return _utc(value).isoformat(" ", "seconds")[:19]


def iso(value: datetime | None) -> str:
    """ISO 8601 in UTC (for ``<time datetime>``); empty for ``None``."""
    if value is None:
        return ""
    return _utc(value).isoformat(timespec="seconds")


_UNITS = ((86400, "d", 3600, "h"), (3600, "h", 60, "min"))
"""A duration past an hour: its two largest units (seconds in one, in the next)."""


def duration(value: float | None) -> str:
    """A duration in seconds, short: ``850 ms``, ``4.2 s``, ``3 min 5 s``, ``2 h 10 min``,
    ``3 d 4 h``; ``-`` for ``None``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    whole = int(value)
    for size, unit, part, part_unit in _UNITS:
        if whole >= size:
            return f"{whole // size} {unit} {whole % size // part} {part_unit}"
    return f"{whole // 60} min {whole % 60} s"


def ago(value: float | None) -> str:
    """An age in seconds as :func:`duration`, or ``-``."""
    return duration(value)


def number(value: Any) -> str:
    """An integer with thousands separators (``1,234,567``)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return str(value)


def zoned(value: datetime, zone: str) -> str:
    """``YYYY-MM-DD HH:MM:SS TZ`` in the IANA zone ``zone`` (its abbreviation)."""
    return zone_time(value, zone)


def install_filters(env: jinja2.Environment) -> None:
    """Register the filters above on ``env``."""
    env.filters["zoned"] = zoned
    env.filters["when"] = when
    env.filters["iso"] = iso
    env.filters["duration"] = duration
    env.filters["ago"] = ago
    env.filters["number"] = number
