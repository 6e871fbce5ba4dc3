"""How ``cyclone run RUN`` shows one run: its fields, then its DAG as a tree of steps.

Pure functions from a :class:`cyclone.Run` and its :class:`cyclone.monitor.StepInfo`
rows to rich renderables; the values are shown as :mod:`cyclone.render` shows them
(local time, seconds, database text never parsed as markup).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from cyclone.records import Run, StepInfo
from cyclone.render import (
    cut_text,
    executions,
    first_line,
    local_time,
    seconds_text,
    state_text,
)

__all__ = ["ITEMS_SHOWN", "run_tree", "run_view"]

ITEMS_SHOWN = 3
"""Item tasks of a fan-out listed by name under it when it has too many to list all."""
_ITEMS_ALL = 8
"""A fan-out with at most this many items has every item listed."""


def _run_fields(run: Run) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    rows: list[tuple[str, Text | str]] = [
        ("run", str(run.id)),
        ("workflow", Text(run.workflow)),
        ("state", state_text(run.state.value)),
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
        rows.append(("result", Text(cut_text(json.dumps(run.result, ensure_ascii=False)))))
    for name, value in rows:
        grid.add_row(name, value)
    return grid


def _step_label(step: StepInfo, others: Sequence[str] = (), *, item: bool = False) -> Text:
    label = Text()
    label.append(step.node, style="" if item else "bold")
    if not item:
        label.append(f" ({step.kind})", style="dim")
    label.append("  ")
    label.append_text(state_text(step.state.value))
    if step.attempt:  # a failure so far: executions so far, of those allowed
        label.append(f"  attempt {executions(step)} of {step.max_attempts}")
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
        label.append(f"\n{kind}{first_line(step.error)}", style="red")
    return label


def _add_items(branch: Tree, items: Sequence[StepInfo]) -> None:
    """Hang a fan-out's items from one line under its node (``N items: ...`` with the
    count per state), so that they never sit beside the nodes downstream of it; list
    them all when few, else the first ones, the discarded ones, and how many more."""
    if not items:
        return
    ordered = sorted(items, key=lambda s: (s.item_index is None, s.item_index or 0, s.id))
    counts = Counter(s.state.value for s in ordered)
    summary = Text(f"{len(ordered)} items: ", style="bold")
    for i, (state, count) in enumerate(sorted(counts.items())):
        summary.append(", " if i else "")
        summary.append(f"{count} ")
        summary.append_text(state_text(state))
    shown = list(ordered)
    if len(ordered) > _ITEMS_ALL:
        failed = [s for s in ordered[ITEMS_SHOWN:] if s.state.value == "discarded"]
        shown = ordered[:ITEMS_SHOWN] + failed[:ITEMS_SHOWN]
    group = branch.add(summary)
    for item in shown:
        group.add(_step_label(item, item=True))
    if len(ordered) > len(shown):
        group.add(Text(f"… {len(ordered) - len(shown)} more items", style="dim"))


def run_tree(run: Run, steps: Sequence[StepInfo], deps: Iterable[tuple[str, str]]) -> Tree:
    """The run's DAG as a tree of its steps.

    A node is drawn under its first parent (in step order) and names its other
    parents ("also after: ..."); roots hang from the run. The item tasks of a fan-out
    hang from an ``N items`` line, the first branch under their fan-out node; the nodes
    downstream of it follow that line.
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
    title.append_text(state_text(run.state.value))
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
