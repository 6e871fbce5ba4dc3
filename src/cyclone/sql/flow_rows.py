"""Row types of the flow-control statements (``limits.sql``)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

__all__ = ["KindNameRow", "LimitedRow", "LimitsRow", "StoredLimitsRow"]


class KindNameRow(NamedTuple):
    """A kind name (a kind with limits stored)."""

    kind: str


class LimitedRow(NamedTuple):
    """What the first statement of a limited claim left for the admission: the steps
    it locked and the groups it locked for (array texts), whether the queue holds
    steps with a fairness key, and whether a limit held steps back."""

    ids: str
    groups: str
    fair: bool
    held: bool


class LimitsRow(NamedTuple):
    """A kind's stored limits that a client's start replaced, and who wrote them."""

    kind: str
    max_concurrency: int | None
    rate_count: int | None
    rate_per: float | None
    rate_burst: int
    max_snoozes: int
    written_by: str


class StoredLimitsRow(NamedTuple):
    """A kind's stored limits, who wrote them and when (``cyclone kinds``)."""

    kind: str
    max_concurrency: int | None
    rate_count: int | None
    rate_per: float | None
    rate_burst: int
    max_snoozes: int
    written_by: str
    written_at: datetime
