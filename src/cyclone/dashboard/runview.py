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
from urllib.parse import quote

from cyclone.dashboard.filters import duration, iso, when
from cyclone.dashboard.layout import Layout, layout
from cyclone.dashboard.queries import RunView

__all__ = ["ROWS_SHOWN", "TIMELINE_ROWS", "Bar", "Card", "Row", "cards", "rows", "timeline"]

LABEL_CHARS = 22
"""Characters of a node id shown in its card (all of it in the card's tooltip)."""
TIMELINE_ROWS = 200
"""Steps drawn in the timeline at most (the earliest started)."""
TIMELINE_W = 900
"""Width of the timeline's bar area."""
ROWS_SHOWN = 250
"""Steps listed in the steps table unless all are asked for (``?steps=all``)."""
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
        progress: for a fan-out, the bar's filled width (0 to :data:`BAR_INNER`).
        child_run: for a child node, the child run's id once it exists.
        href: where the card leads (the child run, else the step's page).
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
    href: str

    @property
    def state_label(self) -> str:
        """The state as shown (``waiting signal``)."""
        return self.state.replace("_", " ")

    @property
    def transform(self) -> str:
        """The SVG ``transform`` that puts the card at ``(x, y)``."""
        return f"translate({self.x},{self.y})"


@dataclass(frozen=True, slots=True)
class Row:
    """A line of the steps table, every cell already text (a 1,000-step run renders
    in a few milliseconds): ISO times for ``<time datetime>``, and times, durations
    and counts as shown."""

    node: str
    href: str
    items: str
    kind: str
    state: str
    state_label: str
    attempt: str
    reclaims: int
    queue: str
    lease_owner: str
    lease_iso: str
    lease: str
    started_iso: str
    started: str
    completed_iso: str
    completed: str
    duration: str
    error: str


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


BAR_INNER = 76
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


def step_href(root: str, run_id: int, node: str) -> str:
    """The URL of a step's page."""
    return f"{root}/runs/{run_id}/step?node={quote(node, safe='')}"


def rows(view: RunView, root: str, limit: int | None = ROWS_SHOWN) -> list[Row]:
    """The steps table of ``view``: one :class:`Row` per step (item tasks left out), the
    first ``limit`` (``None``: all)."""
    run_id = view.run["id"]
    out = []
    for s in view.steps[:limit]:
        items = sum(view.items.get(s["node"], {}).values()) if s["fan_out"] else None
        out.append(
            Row(
                node=s["node"],
                href=step_href(root, run_id, s["node"]),
                items="" if items is None else f"{items:,} items",
                kind=s["kind"],
                state=s["state"],
                state_label=s["state"].replace("_", " "),
                attempt=f"{s['attempt']}/{s['max_attempts']}",
                reclaims=s["reclaims"],
                queue=s["queue"],
                lease_owner=s["lease_owner"] or "",
                lease_iso=iso(s["lease_expiry"]),
                lease=when(s["lease_expiry"]) if s["lease_expiry"] else "",
                started_iso=iso(s["started_at"]),
                started=when(s["started_at"]),
                completed_iso=iso(s["completed_at"]),
                completed=when(s["completed_at"]),
                duration=duration(s["duration"]),
                error=s["error"] or "",
            )
        )
    return out


def cards(view: RunView, root: str = "") -> tuple[Layout, list[Card]]:
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
                href=f"{root}/runs/{child}"
                if child is not None
                else step_href(root, view.run["id"], step["node"]),
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
