"""What the run page draws, from what :meth:`Reader.run_view` read: the DAG's node cards
and the steps' timeline. Pure: no I/O, no markup (the template escapes every text).

A card is one step row of the run (item tasks of a fan-out are folded into their
node's card as a count and a progress bar); a wait says what it waits for and until
when; a child node links its child run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cyclone.dashboard.filters import when
from cyclone.dashboard.layout import NODE_W, Layout, layout
from cyclone.dashboard.queries import RunView

__all__ = ["TIMELINE_ROWS", "Bar", "Card", "cards", "timeline"]

LABEL_CHARS = 22
"""Characters of a node id shown in its card (all of it in the card's tooltip)."""
TIMELINE_ROWS = 400
"""Steps drawn in the timeline at most (the earliest started)."""
TIMELINE_W = 900
"""Width of the timeline's bar area."""
_TERMINAL = {"completed", "discarded", "cancelled"}


@dataclass(frozen=True, slots=True)
class Card:
    """One node of the drawing.

    Attributes:
        node, kind, state: the step's.
        x, y: the box's top-left corner.
        label: the node id, cut to :data:`LABEL_CHARS`.
        detail: one line under it (kind, attempt, what a wait waits for, items).
        tooltip: the full text of the SVG ``<title>``.
        progress: for a fan-out, the bar's filled width (0 to the box's inner width).
        child_run: for a child node, the child run's id once it exists.
    """

    node: str
    kind: str
    state: str
    x: int
    y: int
    label: str
    detail: str
    tooltip: str
    progress: int | None
    child_run: int | None


@dataclass(frozen=True, slots=True)
class Bar:
    """A step in the timeline: its row ``y``, bar ``x`` and ``width`` (units of the
    bar area), and what its tooltip says."""

    node: str
    state: str
    y: int
    x: int
    width: int
    tooltip: str


BAR_INNER = NODE_W - 20
"""Width of a fan-out card's progress bar when full."""


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _wait_detail(step: dict[str, Any], view: RunView) -> str:
    kind = step["kind"]
    waiting = step["state"] in ("waiting_signal", "waiting_timer")
    due = f" until {when(step['scheduled_at'])[5:16]}" if waiting else ""
    if kind == "@sleep":
        return f"timer{due}"
    names = step["signal_names"] or ([step["signal_name"]] if step["signal_name"] else [])
    received = sum(view.signals.get(name, (0, 0))[0] for name in names)
    count = f" {received}/{step['wait_count']}" if step["wait_count"] else ""
    shown = " | ".join(names) or "?"
    return f"signal {shown}{count}{due if step['wait_for'] is not None else ''}"


def _detail(step: dict[str, Any], view: RunView) -> tuple[str, int | None, int | None]:
    node, kind = step["node"], step["kind"]
    if step["fan_out"]:
        counts = view.items.get(node, {})
        total = sum(counts.values())
        done = counts.get("completed", 0)
        width = round(BAR_INNER * done / total) if total else 0
        return f"{done}/{total} items", width, None
    if kind == "@child":
        child = view.children.get(node)
        if child is None:
            return f"child {step['child_workflow'] or ''}".strip(), None, None
        return f"child run {child[0]} · {child[1]}", None, child[0]
    if kind in ("@signal", "@sleep"):
        return _wait_detail(step, view), None, None
    attempt = f" · try {step['attempt']}/{step['max_attempts']}" if step["attempt"] > 1 else ""
    return f"{kind}{attempt}", None, None


def cards(view: RunView) -> tuple[Layout, list[Card]]:
    """The DAG's geometry and one card per step of ``view`` (in step order)."""
    nodes = [step["node"] for step in view.steps]
    drawn = layout(nodes, [(n, d) for n, d, _ in view.deps])
    out = []
    for place, step in zip(drawn.nodes, view.steps, strict=True):
        detail, progress, child = _detail(step, view)
        tip = f"{step['node']} ({step['kind']}): {step['state']}"
        if step["error"]:
            tip += "\n" + step["error"]
        out.append(
            Card(
                node=step["node"],
                kind=step["kind"],
                state=step["state"],
                x=place.x,
                y=place.y,
                label=_short(step["node"], LABEL_CHARS),
                detail=_short(detail, 28),
                tooltip=tip,
                progress=progress,
                child_run=child,
            )
        )
    return drawn, out


def timeline(view: RunView, now: datetime) -> tuple[list[Bar], float]:
    """The bars of the steps that started, earliest first (at most
    :data:`TIMELINE_ROWS`), on a scale from the run's creation to its end (or
    ``now``); and that span in seconds."""
    start = view.run["created_at"]
    started = sorted(
        (s for s in view.steps if s["started_at"] is not None), key=lambda s: s["started_at"]
    )[:TIMELINE_ROWS]
    end = view.run["finished_at"] or now
    for step in started:
        if step["completed_at"] is not None and step["completed_at"] > end:
            end = step["completed_at"]
    span = max((end - start).total_seconds(), 0.001)
    bars = []
    for row, step in enumerate(started):
        finish = step["completed_at"] or (now if step["state"] not in _TERMINAL else end)
        x = (step["started_at"] - start).total_seconds() / span * TIMELINE_W
        width = max(2.0, (finish - step["started_at"]).total_seconds() / span * TIMELINE_W)
        x = min(max(0.0, x), TIMELINE_W - 2)
        took = (finish - step["started_at"]).total_seconds()
        bars.append(
            Bar(
                node=step["node"],
                state=step["state"],
                y=row * 18,
                x=round(x),
                width=round(min(width, TIMELINE_W - x)),
                tooltip=f"{step['node']}: {step['state']}, {took:.3f} s",
            )
        )
    return bars, span
