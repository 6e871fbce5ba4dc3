"""How the ``cyclone`` command shows what it read: rich tables, one step, JSON (one
run and its DAG: :mod:`cyclone.render_run`).

Pure functions from records (:class:`cyclone.Run`, :mod:`cyclone.monitor`) to rich
renderables or JSON text; the command prints them. Timestamps are shown in the local
time zone, durations and ages in seconds. Text that comes from the database (names,
errors) is always wrapped in ``rich.text.Text``, never parsed as markup.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rich.table import Table
from rich.text import Text

from cyclone.limits import limits_of
from cyclone.records import KindStats, QueueStats, Run, Schedule, Step, StepInfo
from cyclone.sql.flow_rows import StoredLimitsRow
from cyclone.states import StepState

__all__ = [
    "as_dict",
    "cut_text",
    "executions",
    "first_line",
    "kinds_table",
    "limits_table",
    "local_time",
    "queues_table",
    "runs_table",
    "schedules_table",
    "seconds_text",
    "state_text",
    "step_view",
    "steps_table",
    "to_json",
    "zone_time",
]

_RESULT_CHARS = 500
"""A run's result, and a step's input, output and error, are shown up to this many
characters (``--json`` has all of them)."""
_TRACEBACK_LINES = 12
"""The last lines of a step's traceback shown (``--json`` has all of it)."""

_STATE_STYLES = {
    "completed": "green",
    "running": "cyan",
    "available": "blue",
    "pending": "dim",
    "waiting_signal": "magenta",
    "waiting_timer": "magenta",
    "waiting_child": "magenta",
    "paused": "yellow",
    "failed": "bold red",
    "discarded": "bold red",
    "cancelled": "yellow",
}


# -- values ---------------------------------------------------------------------------


def local_time(value: datetime | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in the local time zone; ``-`` for ``None``."""
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def seconds_text(value: float | None) -> str:
    """A duration or an age in seconds (milliseconds shown below 10 s, tenths below
    100 s); ``-`` for ``None``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.3f} s"
    if value < 100:
        return f"{value:.1f} s"
    return f"{value:,.0f} s"


def cut_text(text: str) -> str:
    """``text`` up to :data:`_RESULT_CHARS` characters, ``…`` marking a cut."""
    return text if len(text) <= _RESULT_CHARS else text[:_RESULT_CHARS] + " …"


def first_line(text: str | None) -> str:
    """The first line of ``text`` (`` …`` marking more lines); ``""`` for none."""
    if not text:
        return ""
    lines = text.strip().splitlines()
    return lines[0] + (" …" if len(lines) > 1 else "") if lines else ""


def state_text(state: str) -> Text:
    """A state's name, coloured by what it means (green completed, red failed, ...)."""
    return Text(state, style=_STATE_STYLES.get(state, ""))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone().isoformat()
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def as_dict(record: Any) -> dict[str, Any]:
    """A record (a dataclass instance) as a dict of its fields, for :func:`to_json`."""
    return dataclasses.asdict(record)


def to_json(value: Any) -> str:
    """``value`` (dataclasses, lists, dicts, datetimes, enums) as indented JSON text."""
    return json.dumps(value, default=_json_default, indent=2, ensure_ascii=False)


# -- listings -------------------------------------------------------------------------


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    aligned = set(right)
    table = Table(show_edge=False, header_style="bold", pad_edge=False)
    for name in columns:
        table.add_column(name, justify="right" if name in aligned else "left")
    return table


def zone_time(value: datetime, zone: str) -> str:
    """``YYYY-MM-DD HH:MM TZ`` in the IANA zone ``zone`` (the zone's abbreviation)."""
    try:
        local = value.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return local_time(value)
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def schedules_table(schedules: Sequence[Schedule], now: datetime) -> Table:
    """Schedules: id, target, cron, zone, next fire (in the schedule's zone, marked
    ``overdue`` when a minute late by ``now``, the database's clock), enabled, last run,
    failures and last error."""
    table = _table(
        "id",
        "target",
        "cron",
        "zone",
        "next fire",
        "enabled",
        "last run",
        "failures",
        "error",
        right=["last run", "failures"],
    )
    for s in schedules:
        target = s.target if s.def_version is None else f"{s.target} (workflow {s.def_version[:8]})"
        upcoming = Text(zone_time(s.next_run_at, s.location))
        if s.enabled and (now - s.next_run_at).total_seconds() > 60:
            upcoming.append("  overdue", style="bold red")
        table.add_row(
            Text(s.id),
            Text(target),
            Text(s.cron),
            Text(s.location),
            upcoming,
            Text("yes" if s.enabled else "no", style="" if s.enabled else "yellow"),
            "-" if s.last_run_id is None else str(s.last_run_id),
            Text(str(s.consecutive_failures), style="bold red" if s.consecutive_failures else ""),
            Text(first_line(s.last_error)),
        )
    return table


def runs_table(runs: Sequence[Run]) -> Table:
    """Runs: id, workflow, state, created, finished, error (its first line)."""
    table = _table("id", "workflow", "state", "created", "finished", "error", right=["id"])
    for run in runs:
        table.add_row(
            str(run.id),
            Text(run.workflow),
            state_text(run.state.value),
            local_time(run.created_at),
            local_time(run.finished_at),
            Text(first_line(run.error), style="red"),
        )
    return table


def steps_table(steps: Sequence[StepInfo]) -> Table:
    """Steps: id, run, node, kind, state, queue, attempt (``N of M``: :func:`executions`
    of ``max_attempts``), lease expired, error kind, error."""
    table = _table(
        "id",
        "run",
        "node",
        "kind",
        "state",
        "queue",
        "attempt",
        "lease expired",
        "error kind",
        "error",
        right=["id", "run", "attempt"],
    )
    for step in steps:
        table.add_row(
            str(step.id),
            str(step.run_id),
            Text(step.node),
            Text(step.kind),
            state_text(step.state.value),
            Text(step.queue),
            f"{executions(step)} of {step.max_attempts}",
            Text("yes", style="bold red") if step.lease_expired else "",
            Text(step.error_kind or ""),
            Text(first_line(step.error), style="red"),
        )
    return table


def queues_table(stats: Sequence[QueueStats]) -> Table:
    """Queues: available, running and waiting counts, oldest available age, expired
    leases, and ``paused`` for a paused queue."""
    columns = ("available", "running", "waiting", "oldest available", "expired leases")
    table = _table("queue", *columns, "paused", right=columns)
    for row in stats:
        table.add_row(
            Text(row.queue),
            str(row.available),
            str(row.running),
            str(row.waiting),
            seconds_text(row.oldest_available_age),
            _expired(row.expired_leases),
            Text("paused", style="bold yellow") if row.paused else "",
        )
    return table


def kinds_table(stats: Sequence[KindStats]) -> Table:
    """Kinds: count per (kind, state), oldest available age, expired leases."""
    columns = ("count", "oldest available", "expired leases")
    table = _table("kind", "state", *columns, right=columns)
    for row in stats:
        table.add_row(
            Text(row.kind),
            state_text(row.state.value),
            str(row.count),
            seconds_text(row.oldest_available_age),
            _expired(row.expired_leases),
        )
    return table


def limits_table(rows: Sequence[StoredLimitsRow]) -> Table:
    """Each kind's stored flow control, who wrote it and when."""
    columns = ("max_concurrency", "rate_limit", "max_snoozes")
    table = _table("kind", *columns, "written by", "written at", right=columns)
    for row in rows:
        limits = limits_of(row)
        table.add_row(
            Text(row.kind),
            "" if limits.max_concurrency is None else str(limits.max_concurrency),
            "" if limits.rate_limit is None else str(limits.rate_limit),
            str(limits.max_snoozes),
            Text(row.written_by),
            local_time(row.written_at),
        )
    return table


def _expired(count: int) -> Text:
    return Text(str(count), style="bold red" if count else "")


# -- one step -------------------------------------------------------------------------


def executions(step: Step | StepInfo) -> int:
    """The attempts of ``step`` so far, the N of "attempt N of M": its failed executions
    (``attempt``, a discard's included), plus the one that is running or that completed
    it. So a step never run (available, pending, waiting) counts 0, one available again
    after a failure counts its failures, a running or completed one ``attempt + 1``. A
    reclaim, a snooze or a step given back is not an attempt; a node that completes
    without a handler (a wait, a child run, a fan-out node) counts none."""
    current = step.state in (StepState.RUNNING, StepState.COMPLETED)
    return step.attempt + (1 if current and step.started_at is not None else 0)


def step_view(step: Step) -> Table:
    """One step's fields: what and where it is, its state, ``attempt N of M``
    (:func:`executions`), reclaims, snoozes (if any), lease, timestamps (local time),
    error and the last lines of its traceback, input and output (JSON, cut at 500
    characters)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, Text | str]] = [
        ("step", str(step.id)),
        ("run", str(step.run_id)),
        ("node", Text(step.node)),
        ("kind", Text(step.kind)),
        ("queue", Text(step.queue)),
        ("priority", str(step.priority)),
        ("state", state_text(step.state.value)),
        ("attempt", f"{executions(step)} of {step.max_attempts}"),
        ("reclaims", Text(str(step.reclaims), style="yellow" if step.reclaims else "")),
    ]
    if step.snoozes:  # times its handler raised Snooze (no attempt used)
        rows.append(("snoozes", str(step.snoozes)))
    if step.lease_owner is not None:
        rows.append(("lease", Text(f"{step.lease_owner}, until {local_time(step.lease_expiry)}")))
        rows.append(("heartbeat", local_time(step.heartbeat_at)))
    rows += [
        ("scheduled", local_time(step.scheduled_at)),
        ("created", local_time(step.created_at)),
        ("started", local_time(step.started_at)),
        ("completed", local_time(step.completed_at)),
    ]
    if step.started_at is not None and step.completed_at is not None:
        rows.append(("took", seconds_text((step.completed_at - step.started_at).total_seconds())))
    for name, key in (("unique_key", step.unique_key), ("sequence_key", step.sequence_key)):
        if key is not None:
            rows.append((name, Text(key)))
    if step.timeout is not None:
        rows.append(("timeout", seconds_text(step.timeout)))
    if step.error_kind is not None:
        rows.append(("error_kind", Text(step.error_kind, style="red")))
    if step.error is not None:
        rows.append(("error", Text(cut_text(step.error), style="red")))
    if step.panic_stack:
        lines = step.panic_stack.rstrip().splitlines()
        shown = "\n".join(lines[-_TRACEBACK_LINES:])
        if len(lines) > _TRACEBACK_LINES:
            shown = f"… {len(lines) - _TRACEBACK_LINES} lines above\n{shown}"
        rows.append(("traceback", Text(shown, style="dim")))
    rows.append(("input", Text(cut_text(json.dumps(step.input, ensure_ascii=False)))))
    if step.state is StepState.COMPLETED:
        rows.append(("output", Text(cut_text(json.dumps(step.output, ensure_ascii=False)))))
    for name, value in rows:
        grid.add_row(name, value)
    return grid
