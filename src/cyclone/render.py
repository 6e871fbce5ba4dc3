"""How the ``cyclone`` command shows what it read: rich tables, a run's DAG, JSON.

Pure functions from records (:class:`cyclone.Run`, :mod:`cyclone.monitor`) to rich
renderables or JSON text; the command prints them. Timestamps are shown in the local
time zone, durations and ages in seconds. Text that comes from the database (names,
errors) is always wrapped in ``rich.text.Text``, never parsed as markup.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import Enum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from cyclone.limits import limits_of
from cyclone.records import KindStats, QueueStats, Run, Schedule, Step, StepInfo
from cyclone.sql.flow_rows import StoredLimitsRow
from cyclone.states import StepState

__all__ = [
    "ITEMS_SHOWN",
    "as_dict",
    "executions",
    "kinds_table",
    "local_time",
    "queues_table",
    "run_tree",
    "run_view",
    "runs_table",
    "schedules_table",
    "seconds_text",
    "step_view",
    "steps_table",
    "to_json",
]

ITEMS_SHOWN = 3
"""Item tasks of a fan-out listed by name under it when it has too many to list all."""
_ITEMS_ALL = 8
"""A fan-out with at most this many items has every item listed."""
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


def _cut(text: str) -> str:
    """``text`` up to :data:`_RESULT_CHARS` characters, ``…`` marking a cut."""
    return text if len(text) <= _RESULT_CHARS else text[:_RESULT_CHARS] + " …"


def _first_line(text: str | None) -> str:
    if not text:
        return ""
    lines = text.strip().splitlines()
    return lines[0] + (" …" if len(lines) > 1 else "") if lines else ""


def _state(state: str) -> Text:
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
            Text(_first_line(s.last_error)),
        )
    return table


def runs_table(runs: Sequence[Run]) -> Table:
    """Runs: id, workflow, state, created, finished, error (its first line)."""
    table = _table("id", "workflow", "state", "created", "finished", "error", right=["id"])
    for run in runs:
        table.add_row(
            str(run.id),
            Text(run.workflow),
            _state(run.state.value),
            local_time(run.created_at),
            local_time(run.finished_at),
            Text(_first_line(run.error), style="red"),
        )
    return table


def steps_table(steps: Sequence[StepInfo]) -> Table:
    """Steps: id, run, node, kind, state, queue, attempt, lease expired, error."""
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
            _state(step.state.value),
            Text(step.queue),
            f"{step.attempt}/{step.max_attempts}",
            Text("yes", style="bold red") if step.lease_expired else "",
            Text(step.error_kind or ""),
            Text(_first_line(step.error), style="red"),
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
            _state(row.state.value),
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


# -- one run --------------------------------------------------------------------------


def _run_fields(run: Run) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, Text | str]] = [
        ("run", str(run.id)),
        ("workflow", Text(run.workflow)),
        ("state", _state(run.state.value)),
        ("def_version", Text(run.def_version)),
        ("created", local_time(run.created_at)),
        ("updated", local_time(run.updated_at)),
        ("finished", local_time(run.finished_at)),
    ]
    if run.finished_at is not None:
        rows.append(("took", seconds_text((run.finished_at - run.created_at).total_seconds())))
    if run.deadline_at is not None:
        rows.append(("deadline", local_time(run.deadline_at)))
    if run.paused_at is not None:
        rows.append(("paused", local_time(run.paused_at)))
    if run.submit_key is not None:
        rows.append(("submit_key", Text(run.submit_key)))
    if run.parent_run_id is not None:
        rows.append(("parent", f"run {run.parent_run_id}, node {run.parent_node_id}"))
    if run.error is not None:
        rows.append(("error", Text(run.error, style="red")))
    if run.result is not None:
        rows.append(("result", Text(_cut(json.dumps(run.result, ensure_ascii=False)))))
    for name, value in rows:
        grid.add_row(name, value)
    return grid


def _step_label(step: StepInfo, others: Sequence[str] = (), *, item: bool = False) -> Text:
    label = Text()
    label.append(step.node, style="" if item else "bold")
    if not item:
        label.append(f" ({step.kind})", style="dim")
    label.append("  ")
    label.append_text(_state(step.state.value))
    if step.attempt:
        label.append(f"  attempt {step.attempt}/{step.max_attempts}")
    if step.reclaims:
        label.append(f"  reclaimed {step.reclaims}x", style="yellow")
    if step.started_at is not None:
        label.append(f"  started {local_time(step.started_at)}")
        if step.duration is not None:
            label.append(f", took {seconds_text(step.duration)}")
    elif step.completed_at is not None:
        label.append(f"  ended {local_time(step.completed_at)}")
    if step.signal_name is not None:
        label.append(f"  signal {step.signal_name!r}")
    if step.child_run_id is not None:
        label.append(f"  child run {step.child_run_id}", style="cyan")
    if step.lease_expired:
        label.append("  lease expired", style="bold red")
    if others:
        label.append(f"  also after: {', '.join(others)}", style="dim")
    if step.error:
        kind = f"{step.error_kind}: " if step.error_kind else ""
        label.append(f"\n{kind}{_first_line(step.error)}", style="red")
    return label


def _add_items(branch: Tree, items: Sequence[StepInfo]) -> None:
    """List a fan-out's items under it, or a summary and the telling ones when many."""
    ordered = sorted(items, key=lambda s: (s.item_index is None, s.item_index or 0, s.id))
    if len(ordered) <= _ITEMS_ALL:
        for item in ordered:
            branch.add(_step_label(item, item=True))
        return
    counts = Counter(s.state.value for s in ordered)
    summary = Text(f"{len(ordered)} items: ", style="bold")
    for i, (state, count) in enumerate(sorted(counts.items())):
        summary.append(", " if i else "")
        summary.append(f"{count} ")
        summary.append_text(_state(state))
    shown = ordered[:ITEMS_SHOWN]
    failed = [s for s in ordered[ITEMS_SHOWN:] if s.state.value == "discarded"]
    shown += failed[:ITEMS_SHOWN]
    group = branch.add(summary)
    for item in shown:
        group.add(_step_label(item, item=True))
    if len(ordered) > len(shown):
        group.add(Text(f"… {len(ordered) - len(shown)} more items", style="dim"))


def run_tree(run: Run, steps: Sequence[StepInfo], deps: Iterable[tuple[str, str]]) -> Tree:
    """The run's DAG as a tree of its steps.

    A node is drawn under its first parent (in step order) and names its other
    parents ("also after: ..."); roots hang from the run. Item tasks of a fan-out are
    listed under their fan-out node.
    """
    order = {s.node: i for i, s in enumerate(steps)}
    nodes = [s for s in steps if s.item_of is None]
    items: dict[str, list[StepInfo]] = {}
    for step in steps:
        if step.item_of is not None:
            items.setdefault(step.item_of, []).append(step)
    parents: dict[str, list[str]] = {}
    for node, dep in deps:
        if dep in order:
            parents.setdefault(node, []).append(dep)
    for names in parents.values():
        names.sort(key=order.__getitem__)
    below: dict[str | None, list[StepInfo]] = {}
    for step in nodes:
        first = parents.get(step.node, [None])[0]
        below.setdefault(first, []).append(step)

    title = Text(f"run {run.id} ")
    title.append(run.workflow, style="bold")
    title.append("  ")
    title.append_text(_state(run.state.value))
    tree = Tree(title)
    drawn: set[str] = set()
    # Depth first with an explicit stack (a long chain would exceed Python's recursion).
    stack: list[tuple[Tree, StepInfo]] = [(tree, s) for s in reversed(below.get(None, []))]
    while stack:
        branch, step = stack.pop()
        drawn.add(step.node)
        sub = branch.add(_step_label(step, parents.get(step.node, [])[1:]))
        _add_items(sub, items.get(step.node, []))
        stack.extend((sub, child) for child in reversed(below.get(step.node, [])))
    for step in nodes:  # unreachable only if the edges are broken; show them anyway
        if step.node not in drawn:
            tree.add(_step_label(step, parents.get(step.node, [])))
    return tree


def run_view(run: Run, steps: Sequence[StepInfo], deps: Iterable[tuple[str, str]]) -> Group:
    """The run's fields, then its DAG (:func:`run_tree`)."""
    parts: list[RenderableType] = [_run_fields(run), Text("")]
    parts.append(run_tree(run, steps, deps) if steps else Text("no steps", style="dim"))
    return Group(*parts)


# -- one step -------------------------------------------------------------------------


def executions(step: Step) -> int:
    """The attempts of ``step`` so far: its failed executions (``attempt``), plus the
    one that is running or that completed it (as the ``attempt`` of the engine's log
    lines counts them). A reclaim or a step given back is not an attempt; a node that
    completes without a handler (a wait, a child run) counts none."""
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
        ("state", _state(step.state.value)),
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
        rows.append(("error", Text(_cut(step.error), style="red")))
    if step.panic_stack:
        lines = step.panic_stack.rstrip().splitlines()
        shown = "\n".join(lines[-_TRACEBACK_LINES:])
        if len(lines) > _TRACEBACK_LINES:
            shown = f"… {len(lines) - _TRACEBACK_LINES} lines above\n{shown}"
        rows.append(("traceback", Text(shown, style="dim")))
    rows.append(("input", Text(_cut(json.dumps(step.input, ensure_ascii=False)))))
    if step.state is StepState.COMPLETED:
        rows.append(("output", Text(_cut(json.dumps(step.output, ensure_ascii=False)))))
    for name, value in rows:
        grid.add_row(name, value)
    return grid
