"""Read-only inspection for operators: queue and kind statistics, steps, a run's graph.

The statements are the ``monitor_*`` blocks of ``cyclone/sql/monitor.sql``, mostly over
the monitoring views of the first migration. Each query has a pure part (validated
parameters, row to record) and thin sync or async shells that run it on a connection
the caller owns (with Cyclone's ``search_path``). The ``cyclone`` command uses the sync
shells; ages and durations are seconds, timestamps aware datetimes from the database
(in UTC, so that durations hold across a daylight-saving change of the session's zone).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from cyclone.dbio import Stmt, fetch_async, fetch_sync
from cyclone.errors import ValidationError
from cyclone.options import check_int, check_text
from cyclone.records import KindStats, QueueStats, StepInfo
from cyclone.sql import Q
from cyclone.sql.flow_rows import StoredLimitsRow
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
) -> Stmt[StepInfo]:
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
    return fetch_sync(conn, Stmt(Q.monitor_queues))


async def queue_stats_async(conn: psycopg.AsyncConnection[Any]) -> list[QueueStats]:
    """The asyncio twin of :func:`queue_stats_sync`."""
    return await fetch_async(conn, Stmt(Q.monitor_queues))


def kind_stats_sync(conn: psycopg.Connection[Any]) -> list[KindStats]:
    """Every (kind, state) pair with steps, by kind then state."""
    return fetch_sync(conn, Stmt(Q.monitor_kinds))


def kind_limits_sync(conn: psycopg.Connection[Any]) -> list[StoredLimitsRow]:
    """Every kind's stored flow control (``cyclone_kind_limits``), by kind."""
    return fetch_sync(conn, Stmt(Q.limits_list))


def find_steps_sync(conn: psycopg.Connection[Any], stmt: Stmt[StepInfo]) -> list[StepInfo]:
    """The steps a :func:`steps_stmt` selects, newest first."""
    return fetch_sync(conn, stmt)


def database_now_sync(conn: psycopg.Connection[Any]) -> datetime:
    """The database clock, in UTC (listings judge ages and lateness by it, not by this
    host)."""
    (row,) = fetch_sync(conn, Stmt(Q.schedules_now))
    return row.now.astimezone(UTC)


def run_steps_sync(conn: psycopg.Connection[Any], run_id: int) -> list[StepInfo]:
    """Every step of one run in insertion order (empty for an unknown run)."""
    params = {"run_id": run_id, "state": None, "kind": None, "queue": None, "limit": MAX_LIMIT}
    rows = fetch_sync(conn, Stmt(Q.monitor_steps, params))
    return rows[::-1]  # newest first -> oldest first


def run_deps_sync(conn: psycopg.Connection[Any], run_id: int) -> list[tuple[str, str]]:
    """The ``(node, dep_node)`` edges of one run's DAG: ``node`` runs after ``dep_node``."""
    rows = fetch_sync(conn, Stmt(Q.monitor_run_deps, {"run_id": run_id}))
    return [(row.node, row.dep_node) for row in rows]
