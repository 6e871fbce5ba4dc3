"""Read-only inspection for operators: queue and kind statistics, steps, a run's graph.

The statements are the ``monitor_*`` blocks of ``cyclone/sql/monitor.sql``, mostly over
the monitoring views of the first migration. Each query has a pure part (validated
parameters, row to record) and thin sync or async shells that run it on a connection
the caller owns (with Cyclone's ``search_path``). The ``cyclone`` command uses the sync
shells; ages and durations are seconds, timestamps aware datetimes from the database
(in UTC, so that durations hold across a daylight-saving change of the session's zone).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from cyclone.dbio import Stmt, fetch_async, fetch_dicts_sync, fetch_sync
from cyclone.errors import ValidationError
from cyclone.options import check_int, check_text
from cyclone.records import utc_times
from cyclone.sql import Q
from cyclone.states import StepState

__all__ = [
    "KindStats",
    "QueueStats",
    "StepInfo",
    "database_now_sync",
    "find_steps_sync",
    "kind_stats_sync",
    "queue_stats_async",
    "queue_stats_sync",
    "run_deps_sync",
    "run_steps_sync",
    "step_state",
    "steps_stmt",
]

MAX_LIMIT = 100_000
"""The most rows one listing returns."""


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The unfinished work of one queue (``cyclone_v_queues``).

    Attributes:
        queue: the queue name.
        available: steps waiting to be claimed (scheduled ones included).
        running: steps held under a lease.
        waiting: steps waiting for a signal, a timer or a child run.
        oldest_available_age: seconds since the oldest claimable step became due;
            ``None`` when nothing is claimable now.
        expired_leases: running steps whose lease has expired (the sweep reclaims them).
    """

    __module__ = "cyclone"

    queue: str
    available: int
    running: int
    waiting: int
    oldest_available_age: float | None
    expired_leases: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> QueueStats:
        """Build from a ``monitor_queues`` row."""
        queue, available, running, waiting, age, expired = row
        return cls(queue, available, running, waiting, age, expired)


@dataclass(frozen=True, slots=True)
class KindStats:
    """The steps of one kind in one state (``cyclone_v_kinds``).

    Attributes:
        kind: the kind name.
        state: a :class:`StepState`.
        count: how many steps of the kind are in that state.
        oldest_available_age: for ``available``, seconds since the oldest claimable
            step became due; otherwise ``None``.
        expired_leases: for ``running``, steps whose lease has expired.
    """

    kind: str
    state: StepState
    count: int
    oldest_available_age: float | None
    expired_leases: int

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> KindStats:
        """Build from a ``monitor_kinds`` row."""
        kind, state, count, age, expired = row
        return cls(kind, StepState(state), count, age, expired)


@dataclass(frozen=True, slots=True)
class StepInfo:
    """A step as the monitoring view ``cyclone_v_steps`` shows it.

    Attributes:
        id, run_id, node, kind, state, queue, priority: what the step is and where.
        attempt, max_attempts, reclaims: attempts used, allowed, and crash reclaims.
        error, error_kind, panic_stack: the last failure, if any.
        lease_owner, lease_expiry, lease_expired, heartbeat_at: the lease of a
            running step; ``lease_expired`` is true once a running step's lease ran out.
        signal_name: the signal a wait node waits for.
        item_of, item_index: for an item task of a fan-out, its fan-out node and place.
        scheduled_at, created_at, started_at, completed_at: timestamps.
        child_run_id: for a child node, the child run once started.
    """

    id: int
    run_id: int
    node: str
    kind: str
    state: StepState
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    error: str | None
    error_kind: str | None
    panic_stack: str | None
    lease_owner: str | None
    lease_expiry: datetime | None
    lease_expired: bool
    heartbeat_at: datetime | None
    reclaims: int
    signal_name: str | None
    item_of: str | None
    item_index: int | None
    scheduled_at: datetime
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    child_run_id: int | None

    @property
    def duration(self) -> float | None:
        """Seconds from start to completion, once both are known."""
        if self.started_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.started_at).total_seconds()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepInfo:
        """Build from a ``monitor_steps`` row."""
        return cls(**{**utc_times(row), "state": StepState(row["state"])})


def step_state(value: str) -> StepState:
    """The :class:`StepState` named ``value``.

    Raises:
        ValidationError: no step state has that name.
    """
    try:
        return StepState(value)
    except ValueError:
        raise ValidationError(
            f"state must be one of {[s.value for s in StepState]}, got {value!r}"
        ) from None


def steps_stmt(
    *,
    run_id: int | None = None,
    state: StepState | str | None = None,
    kind: str | None = None,
    queue: str | None = None,
    limit: int = 100,
) -> Stmt:
    """The ``monitor_steps`` statement for these filters (``None``: any).

    Raises:
        ValidationError: a bad run id, state, kind, queue or limit.
    """
    if run_id is not None:
        check_int(run_id, "run id", 1, 2**63 - 1)
    if kind is not None:
        check_text(kind, "kind")
    if queue is not None:
        check_text(queue, "queue")
    check_int(limit, "limit", 1, MAX_LIMIT)
    return Stmt(
        Q.monitor_steps,
        {
            "run_id": run_id,
            "state": None if state is None else step_state(state).value,
            "kind": kind,
            "queue": queue,
            "limit": limit,
        },
    )


def queue_stats_sync(conn: psycopg.Connection[Any]) -> list[QueueStats]:
    """Every queue with unfinished steps, in name order."""
    return [QueueStats.from_row(row) for row in fetch_sync(conn, Stmt(Q.monitor_queues))]


async def queue_stats_async(conn: psycopg.AsyncConnection[Any]) -> list[QueueStats]:
    """The asyncio twin of :func:`queue_stats_sync`."""
    return [QueueStats.from_row(row) for row in await fetch_async(conn, Stmt(Q.monitor_queues))]


def kind_stats_sync(conn: psycopg.Connection[Any]) -> list[KindStats]:
    """Every (kind, state) pair with steps, by kind then state."""
    return [KindStats.from_row(row) for row in fetch_sync(conn, Stmt(Q.monitor_kinds))]


def find_steps_sync(conn: psycopg.Connection[Any], stmt: Stmt) -> list[StepInfo]:
    """The steps a :func:`steps_stmt` selects, newest first."""
    return [StepInfo.from_row(row) for row in fetch_dicts_sync(conn, stmt)]


def database_now_sync(conn: psycopg.Connection[Any]) -> datetime:
    """The database clock, in UTC (listings judge ages and lateness by it, not by this
    host)."""
    now: datetime = fetch_sync(conn, Stmt(Q.schedules_now))[0][0]
    return now.astimezone(UTC)


def run_steps_sync(conn: psycopg.Connection[Any], run_id: int) -> list[StepInfo]:
    """Every step of one run in insertion order (empty for an unknown run)."""
    params = {"run_id": run_id, "state": None, "kind": None, "queue": None, "limit": MAX_LIMIT}
    rows = fetch_dicts_sync(conn, Stmt(Q.monitor_steps, params))
    return [StepInfo.from_row(row) for row in reversed(rows)]  # newest first -> oldest first


def run_deps_sync(conn: psycopg.Connection[Any], run_id: int) -> list[tuple[str, str]]:
    """The ``(node, dep_node)`` edges of one run's DAG: ``node`` runs after ``dep_node``."""
    rows = fetch_sync(conn, Stmt(Q.monitor_run_deps, {"run_id": run_id}))
    return [(node, dep) for node, dep in rows]
