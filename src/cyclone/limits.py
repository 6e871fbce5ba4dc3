"""Where limits live: ``cyclone_kind_limits``, written at start, read by every claim.

A client that registers kinds writes each kind's :class:`cyclone.KindLimits` when its
engine starts (the newer start wins, and a warning names the values it replaced and
who wrote them); every claim applies the stored values, whichever client wrote them.
A worker learns which of its kinds are limited from the table (:class:`LimitedKinds`,
read again every few seconds), and claims those through the limited claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, fetch_async
from cyclone.flow import KindLimits, RateLimit
from cyclone.handlers import Handler
from cyclone.sql import Q
from cyclone.sql.flow_rows import LimitsRow, StoredLimitsRow

__all__ = ["LIMITS_REFRESH", "LimitedKinds", "limits_of", "store_limits", "write_stmt"]

log = logging.getLogger("cyclone.worker")

LIMITS_REFRESH = 2.0
"""Seconds between a worker's reads of which of its kinds are limited."""


def write_stmt(handlers: Mapping[str, Handler], owner: str) -> Stmt[LimitsRow]:
    """``limits_write`` for the kinds of ``handlers``, written by ``owner``."""
    kinds = sorted(handlers)
    limits = [handlers[k].limits for k in kinds]
    rates = [lim.rate_limit for lim in limits]
    return Stmt(
        Q.limits_write,
        {
            "kinds": kinds,
            "max_concurrency": [lim.max_concurrency for lim in limits],
            "rate_count": [r.count if r else None for r in rates],
            "rate_per": [r.per if r else None for r in rates],
            "rate_burst": [r.burst if r else 0 for r in rates],
            "max_snoozes": [lim.max_snoozes for lim in limits],
            "written_by": owner,
        },
    )


def limits_of(row: LimitsRow | StoredLimitsRow) -> KindLimits:
    """The :class:`cyclone.KindLimits` a stored row holds."""
    rate = None
    if row.rate_count is not None and row.rate_per is not None:
        rate = RateLimit(row.rate_count, per=row.rate_per, burst=row.rate_burst)
    return KindLimits(
        max_concurrency=row.max_concurrency, rate_limit=rate, max_snoozes=row.max_snoozes
    )


async def store_limits(
    pool: AsyncConnectionPool[Any], handlers: Mapping[str, Handler], owner: str
) -> None:
    """Write the limits of ``handlers``' kinds; warn for each kind whose stored limits
    another start wrote differently (this start's values win).

    Raises:
        psycopg.Error: the write failed.
    """
    if not handlers:
        return
    async with pool.connection() as conn:
        replaced = await fetch_async(conn, write_stmt(handlers, owner))
    for row in replaced:
        log.warning(
            "kind %r: its limits were %s (written by %s); this client (%s) starts with %s, "
            "which every claim applies from now on",
            row.kind,
            limits_of(row).describe(),
            row.written_by,
            owner,
            handlers[row.kind].limits.describe(),
        )


class LimitedKinds:
    """Which of a worker's kinds are limited, as last read from ``cyclone_kind_limits``
    (at most :data:`LIMITS_REFRESH` seconds ago)."""

    def __init__(self, kinds: Collection[str]) -> None:
        self._kinds = sorted(kinds)
        self._read_at: float | None = None
        self.limited: frozenset[str] = frozenset()
        """The limited kinds at the last read."""

    async def refresh(self, conn: psycopg.AsyncConnection[Any]) -> frozenset[str]:
        """The limited kinds, read again on ``conn`` if the last read is stale.

        Raises:
            psycopg.Error: the read failed.
        """
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= LIMITS_REFRESH:
            rows = await fetch_async(conn, Stmt(Q.limits_limited, {"kinds": self._kinds}))
            self.limited = frozenset(row.kind for row in rows)
            self._read_at = now
        return self.limited
