"""Every database read of the dashboard, in one place.

Each function runs named statements of ``cyclone/sql/dashboard.sql`` (and, for the
JSON API, the CLI's own ``runs_*``, ``monitor_*`` and ``schedules_list`` blocks, so
that the API answers in the CLI's ``--json`` shapes) through :mod:`cyclone.dbio`, on
a connection of the dashboard's :class:`Reader` pool. Parameters are validated before
anything is sent (:class:`cyclone.ValidationError` naming the bad value); no text of
a request reaches a statement's SQL.

Timestamps are aware datetimes in UTC, ages and durations seconds (float).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.config import list_runs_params
from cyclone.connections import ConnectionSettings, borrow_async
from cyclone.dbio import Stmt, fetch_async
from cyclone.errors import NotFoundError, ValidationError
from cyclone.monitor import MAX_LIMIT
from cyclone.options import check_int, check_text
from cyclone.records import QueueStats, Run, Schedule, StepInfo, utc_times
from cyclone.sql import Q
from cyclone.states import RunState

__all__ = [
    "ERROR_CHARS",
    "MAX_PAGE",
    "RUN_NODES_SHOWN",
    "VALUE_CHARS",
    "VALUE_FIELDS",
    "Overview",
    "Reader",
    "RunFilters",
    "RunPage",
    "RunView",
    "parse_time",
]

MAX_PAGE = 200
"""The most rows one page of a listing shows (``limit`` above it is a 422)."""
ERROR_CHARS = 300
"""Characters of an error shown in a listing or a table cell."""
VALUE_CHARS = 20_000
"""Characters of a step's value shown on its page; the full value has its own URL."""
RUN_NODES_SHOWN = 5_000
"""Steps of one run drawn and listed at most (item tasks are counted, not listed)."""
VALUE_FIELDS = ("input", "output", "error", "panic_stack")
"""The values of a step that open in full."""
THROUGHPUT_MINUTES = 60
"""Minutes the overview's chart covers."""
RANGE_WINDOWS = (timedelta(hours=1), timedelta(days=1), timedelta(days=7))
"""The windows before ``until`` a time range of runs is read in first."""
UNSERVED_GRACE = 60.0
"""Seconds a step stays claimable, with nothing of its kind running, before its kind
is listed as served by no running worker."""


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The filters of ``/runs`` (each ``None``: any), validated.

    Attributes:
        before: keyset paging: runs with a smaller id.
        limit: rows on the page, 1 to :data:`MAX_PAGE`.
        state: a run state.
        workflow: a workflow name (or the kind of a job).
        since, until: creation time range, ``since <= created_at < until`` (aware);
            with ``until``, the page is in creation order (``dashboard_runs_between``).
        submit_key: runs with exactly this submit key.
    """

    before: int | None = None
    limit: int = 50
    state: str | None = None
    workflow: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    submit_key: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in {s.value for s in RunState}:
            raise ValidationError(
                f"state must be one of {[s.value for s in RunState]}, got {self.state!r}"
            )
        if self.workflow is not None:
            check_text(self.workflow, "workflow")
        if self.submit_key is not None:
            check_text(self.submit_key, "submit key")
        if self.before is not None:
            check_int(self.before, "before", 1, 2**63 - 1)
        check_int(self.limit, "limit", 1, MAX_PAGE)
        for name in ("since", "until"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValidationError(f"{name} must carry a time zone, got {value!r}")


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of runs: ``rows`` (dicts of ``dashboard_runs``) and ``next_before``,
    the ``before`` of the next page (``None`` on the last one)."""

    rows: list[dict[str, Any]]
    next_before: int | None


@dataclass(frozen=True, slots=True)
class Overview:
    """What ``/`` shows.

    Attributes:
        now: the database clock (UTC).
        queues: :class:`QueueStats` per queue with unfinished work.
        running, paused: how many runs are running and paused.
        minutes: the chart: ``(minute start as epoch seconds, completed, failed)`` for
            each of the last :data:`THROUGHPUT_MINUTES` minutes, oldest first.
        unserved: kinds with work claimable for a minute and nothing of them running
            (dicts: ``kind``, ``available``, ``oldest_available_age``).
        failures: the latest failed runs (``id``, ``workflow``, ``finished_at``,
            ``error``).
    """

    now: datetime
    queues: list[QueueStats]
    running: int
    paused: int
    minutes: list[tuple[float, int, int]]
    unserved: list[dict[str, Any]]
    failures: list[dict[str, Any]]


@dataclass(slots=True)
class RunView:
    """What ``/runs/{id}`` shows: the run (a dict of ``dashboard_run``), its non-item
    steps in insertion order, its edges ``(node, dep_node, dep_type)``, item counts per
    fan-out node (``{node: {state: count}}``), child runs per node (``{node: (id,
    state)}``), and its mailbox (``{name: (received, unread)}``)."""

    run: dict[str, Any]
    steps: list[dict[str, Any]]
    deps: list[tuple[str, str, str]]
    items: dict[str, dict[str, int]] = field(default_factory=dict)
    children: dict[str, tuple[int, str]] = field(default_factory=dict)
    signals: dict[str, tuple[int, int]] = field(default_factory=dict)


def _run_id(value: int) -> int:
    return check_int(value, "run id", 1, 2**63 - 1)


def _utc(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """Rows of a :mod:`cyclone.sql.dashboard_rows` type as dicts, times in UTC."""
    return [utc_times(row._asdict()) for row in rows]


class Reader:
    """The dashboard's reads, on a small pool of its own (or one passed in).

    Args:
        pool: the pool to read through.
        settings: how its connections reach Cyclone's schema (search path, pooler).
    """

    def __init__(self, pool: AsyncConnectionPool[Any], settings: ConnectionSettings) -> None:
        self.pool = pool
        self.settings = settings

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        async with borrow_async(self.pool, self.settings) as conn:
            yield conn

    async def _rows(self, sql: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        async with self._conn() as conn:
            return _utc(await fetch_async(conn, Stmt(sql, params)))

    # -- pages ------------------------------------------------------------------------

    async def overview(self) -> Overview:
        """The overview's figures (six statements on one connection)."""
        async with self._conn() as conn:

            async def rows(sql: Any, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
                return _utc(await fetch_async(conn, Stmt(sql, params)))

            now = (await rows(Q.dashboard_now))[0]["now"]
            queues = await fetch_async(conn, Stmt(Q.dashboard_queue_stats))
            active = (await rows(Q.dashboard_active_runs))[0]
            counts = await rows(Q.dashboard_throughput, {"minutes": THROUGHPUT_MINUTES})
            unserved = await rows(Q.dashboard_unserved_kinds, {"grace_s": UNSERVED_GRACE})
            failures = await rows(Q.dashboard_recent_failures, {"chars": ERROR_CHARS, "limit": 8})
        by_minute = {row["minute"]: (row["completed"], row["failed"]) for row in counts}
        last = now.replace(second=0, microsecond=0).timestamp()
        minutes = []
        for back in range(THROUGHPUT_MINUTES - 1, -1, -1):
            start = last - 60.0 * back
            done, failed = by_minute.get(start, (0, 0))
            minutes.append((start, done, failed))
        return Overview(
            now=now,
            queues=queues,
            running=active["running"],
            paused=active["paused"],
            minutes=minutes,
            unserved=unserved,
            failures=failures,
        )

    async def runs_page(self, filters: RunFilters) -> RunPage:
        """One page of runs, newest first (see :class:`RunFilters`).

        With ``until``, runs are read in creation order from the block range index,
        which cannot stop at the first rows found: it is asked for the last hour
        before ``until`` (or before the page's ``before`` run), then the last day,
        then the last week, then the whole range, until one of these holds a page.
        Every run outside a window is older than every run in it, so the page is the
        same as the whole range's; a range holding runs at all usually takes one step.
        """
        params: dict[str, Any] = {
            "state": filters.state,
            "workflow": filters.workflow,
            "since": filters.since,
            "until": filters.until,
            "submit_key": filters.submit_key,
            "before_id": filters.before,
            "limit": filters.limit + 1,
            "chars": ERROR_CHARS,
        }
        async with self._conn() as conn:
            if filters.until is None:
                rows = await fetch_async(conn, Stmt(Q.dashboard_runs, params))
            else:
                top = filters.until
                if filters.before is not None:
                    found = await fetch_async(
                        conn, Stmt(Q.dashboard_run_created, {"run_id": filters.before})
                    )
                    if found:
                        top = min(top, found[0].created_at)
                for window in (*RANGE_WINDOWS, None):
                    since = filters.since
                    if window is not None:
                        since = max(since or top - window, top - window)
                    rows = await fetch_async(
                        conn, Stmt(Q.dashboard_runs_between, {**params, "since": since})
                    )
                    if len(rows) > filters.limit or since == filters.since:
                        break
        lines = _utc(rows)
        more = len(lines) > filters.limit
        lines = lines[: filters.limit]
        return RunPage(lines, lines[-1]["id"] if more and lines else None)

    async def run_exists(self, run_id: int) -> bool:
        """Whether run ``run_id`` exists.

        Raises:
            ValidationError: not a run id.
        """
        found = await self._rows(Q.dashboard_run_states, {"run_id": _run_id(run_id)})
        return bool(found)

    async def run_view(self, run_id: int) -> RunView:
        """A run, its steps (at most :data:`RUN_NODES_SHOWN`), edges, fan-out item
        counts, child runs and mailbox, read on one connection.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id.
        """
        params = {"run_id": _run_id(run_id), "chars": ERROR_CHARS}
        async with self._conn() as conn:

            async def rows(sql: Any, extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
                return _utc(await fetch_async(conn, Stmt(sql, {**params, **(extra or {})})))

            found = await rows(Q.dashboard_run)
            if not found:
                raise NotFoundError(f"run {run_id} does not exist")
            steps = await rows(Q.dashboard_run_steps, {"limit": RUN_NODES_SHOWN})
            deps = await rows(Q.dashboard_run_deps)
            items = await rows(Q.dashboard_run_items)
            children = await rows(Q.dashboard_run_children)
            signals = await rows(Q.dashboard_run_signals)
        view = RunView(
            run=found[0],
            steps=steps,
            deps=[(d["node"], d["dep_node"], d["dep_type"]) for d in deps],
        )
        for row in items:
            view.items.setdefault(row["item_of"], {})[row["state"]] = row["steps"]
        view.children = {c["node"]: (c["id"], c["state"]) for c in children}
        view.signals = {g["name"]: (g["received"], g["unread"]) for g in signals}
        return view

    async def run_states(self, run_id: int) -> dict[str, Any] | None:
        """What a run page refreshes: ``{"run_state", "nodes": {node: state}, "items":
        {node: "done/total"}}``; ``None`` for an unknown run.

        Raises:
            ValidationError: not a run id.
        """
        found = await self._rows(Q.dashboard_run_states, {"run_id": _run_id(run_id)})
        return found[0] if found else None

    async def step(self, run_id: int, node: str) -> dict[str, Any]:
        """One step with its values cut to :data:`VALUE_CHARS` characters and their
        full lengths (``input_chars`` and so on).

        Raises:
            NotFoundError: the run has no step ``node``.
            ValidationError: a bad run id or node.
        """
        check_text(node, "node")
        found = await self._rows(
            Q.dashboard_step, {"run_id": _run_id(run_id), "node": node, "chars": VALUE_CHARS}
        )
        if not found:
            raise NotFoundError(f"run {run_id} has no step {node!r}")
        return found[0]

    async def step_value(self, run_id: int, node: str, name: str) -> str | None:
        """One value of a step in full (JSON values pretty printed); ``None`` when the
        step has none.

        Raises:
            NotFoundError: the run has no step ``node``.
            ValidationError: a bad run id or node, or ``name`` not in
                :data:`VALUE_FIELDS`.
        """
        check_text(node, "node")
        if name not in VALUE_FIELDS:
            raise ValidationError(f"value must be one of {list(VALUE_FIELDS)}, got {name!r}")
        found = await self._rows(
            Q.dashboard_step_value, {"run_id": _run_id(run_id), "node": node, "field": name}
        )
        if not found:
            raise NotFoundError(f"run {run_id} has no step {node!r}")
        value: str | None = found[0]["value"]
        return value

    async def items_page(
        self, run_id: int, node: str, from_index: int, limit: int
    ) -> list[dict[str, Any]]:
        """Item tasks of fan-out ``node`` from item ``from_index`` on, in item order.

        Raises:
            ValidationError: a bad run id, node, index or limit.
        """
        check_text(node, "node")
        check_int(from_index, "from", 0, 2**31 - 1)
        check_int(limit, "limit", 1, MAX_PAGE)
        return await self._rows(
            Q.dashboard_run_items_page,
            {
                "run_id": _run_id(run_id),
                "item_of": node,
                "from_index": from_index,
                "limit": limit,
                "chars": ERROR_CHARS,
            },
        )

    async def queues(self) -> list[QueueStats]:
        """Every queue with unfinished work, by name."""
        async with self._conn() as conn:
            return await fetch_async(conn, Stmt(Q.dashboard_queue_stats))

    async def kinds(self) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], set[str]]:
        """Unfinished steps per kind and state; per kind, completed and failed over the
        last hour; and the kinds no running worker serves."""
        async with self._conn() as conn:
            active = _utc(await fetch_async(conn, Stmt(Q.dashboard_kinds)))
            finished = await fetch_async(
                conn, Stmt(Q.dashboard_kinds_finished, {"minutes": THROUGHPUT_MINUTES})
            )
            unserved = await fetch_async(
                conn, Stmt(Q.dashboard_unserved_kinds, {"grace_s": UNSERVED_GRACE})
            )
        return active, {r.kind: r._asdict() for r in finished}, {r.kind for r in unserved}

    async def workers(self) -> list[dict[str, Any]]:
        """Workers as their leases show them: ``owner``, ``queues``, ``held``,
        ``last_heartbeat``, ``next_expiry``, ``expired``."""
        return await self._rows(Q.dashboard_workers)

    async def schedules(self) -> tuple[datetime, list[dict[str, Any]]]:
        """The database clock and every schedule (at most :data:`MAX_LIMIT`) with the
        state of its last run."""
        async with self._conn() as conn:
            now = (await fetch_async(conn, Stmt(Q.dashboard_now)))[0].now
            rows = _utc(await fetch_async(conn, Stmt(Q.dashboard_schedules, {"limit": MAX_LIMIT})))
        return now.astimezone(UTC), rows

    # -- the JSON API: the CLI's statements and records --------------------------------

    async def api_runs(
        self, state: str | None, workflow: str | None, limit: int, before: int | None
    ) -> list[Run]:
        """Runs as ``cyclone runs --json`` lists them (``runs_list``).

        Raises:
            ValidationError: a bad state, workflow, limit (above :data:`MAX_PAGE`) or
                before.
        """
        check_int(limit, "limit", 1, MAX_PAGE)
        params = list_runs_params(state, workflow, limit, before)
        async with self._conn() as conn:
            return await fetch_async(conn, Stmt(Q.runs_list, params))

    async def api_run(self, run_id: int) -> tuple[Run, list[StepInfo], list[tuple[str, str]]]:
        """A run, its steps and edges as ``cyclone run --json`` reads them.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id.
        """
        params = {"run_id": _run_id(run_id)}
        async with self._conn() as conn:
            found = await fetch_async(conn, Stmt(Q.runs_get, params))
            if not found:
                raise NotFoundError(f"run {run_id} does not exist")
            steps = await fetch_async(
                conn,
                Stmt(
                    Q.monitor_steps,
                    {**params, "state": None, "kind": None, "queue": None, "limit": MAX_LIMIT},
                ),
            )
            deps = await fetch_async(conn, Stmt(Q.monitor_run_deps, params))
        return found[0], list(reversed(steps)), [(d.node, d.dep_node) for d in deps]

    async def api_schedules(self) -> list[Schedule]:
        """Every schedule as ``cyclone schedules --json`` lists them."""
        async with self._conn() as conn:
            return await fetch_async(conn, Stmt(Q.schedules_list, {"id": None}))

    async def api_run_record(self, run_id: int) -> Run:
        """The run as ``get_run`` returns it.

        Raises:
            NotFoundError: no run has that id.
        """
        async with self._conn() as conn:
            found = await fetch_async(conn, Stmt(Q.runs_get, {"run_id": _run_id(run_id)}))
        if not found:
            raise NotFoundError(f"run {run_id} does not exist")
        return found[0]


def parse_time(value: str, name: str) -> datetime:
    """An ISO 8601 date or time from a query parameter; a naive one is UTC.

    Raises:
        ValidationError: not a date or time (the message names ``name`` and the value).
    """
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise ValidationError(f"{name} must be an ISO 8601 date or time, got {value!r}") from None
    parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    if not _EARLIEST <= parsed <= _LATEST:
        raise ValidationError(
            f"{name} must be between {_EARLIEST.year} and {_LATEST.year}, got {value!r}"
        )
    return parsed


_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)
"""The times a filter may name: a window of a year below the earliest stays a date."""
