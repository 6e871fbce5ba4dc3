"""Where a run's DAG is drawn: nodes in columns by dependency depth, edges as curves.

Pure functions, no I/O and no markup: the template draws what :func:`layout` returns.
A node's depth is the length of the longest path from a root to it (a root is at 0),
so every edge points from a column to one on its right. Within a column, nodes are
ordered by the mean row of their parents (one barycentre pass, which removes most
crossings of the usual fan-out and fan-in shapes), then by insertion order. Units are
SVG user units (pixels at 100% zoom).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["NODE_H", "NODE_W", "Edge", "Layout", "Placed", "layout"]


@dataclass(frozen=True, slots=True)
class Placed:
    """A node's box: top-left corner ``(x, y)``, its column ``depth`` and ``row``."""

    node: str
    x: int
    y: int
    depth: int
    row: int


@dataclass(frozen=True, slots=True)
class Edge:
    """An edge from ``source`` (upstream) to ``target``, drawn as the cubic curve
    ``path`` (an SVG path: numbers only)."""

    source: str
    target: str
    path: str


@dataclass(frozen=True, slots=True)
class Layout:
    """The drawing: each node's box (in the order given), the edges, and the total
    ``width`` and ``height``."""

    nodes: tuple[Placed, ...]
    edges: tuple[Edge, ...]
    width: int
    height: int


NODE_W = 168
"""Width of a node box."""
NODE_H = 58
"""Height of a node box."""
GAP_X = 56
"""Horizontal space between two columns."""
GAP_Y = 14
"""Vertical space between two nodes of a column."""
PAD = 12
"""Margin around the drawing."""


def _depths(nodes: Sequence[str], parents: dict[str, list[str]]) -> dict[str, int]:
    """Longest-path depth of every node; a node on a cycle (never in a valid DAG) or
    with an unknown parent is placed as if that edge were absent."""
    depth: dict[str, int] = {}
    known = set(nodes)
    for start in nodes:
        if start in depth:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        visiting: set[str] = set()
        while stack:
            node, state = stack.pop()
            if state == 0:
                if node in depth:
                    continue
                visiting.add(node)
                stack.append((node, 1))
                for parent in parents.get(node, ()):
                    if parent in known and parent not in depth and parent not in visiting:
                        stack.append((parent, 0))
            else:
                visiting.discard(node)
                ups = [depth[p] for p in parents.get(node, ()) if p in depth]
                depth[node] = 1 + max(ups) if ups else 0
    return depth


def layout(nodes: Sequence[str], edges: Iterable[tuple[str, str]]) -> Layout:
    """Place ``nodes`` (ids in insertion order) joined by ``edges`` (``(node,
    dep_node)`` pairs: ``node`` runs after ``dep_node``).

    Edges that name a node not in ``nodes`` are left out. The drawings of the last
    :data:`CACHED` graphs are kept (a run page redrawn while its run runs, or runs of
    one definition, lay out the same graph).
    """
    return _layout(tuple(nodes), tuple(edges))


CACHED = 64
"""Graphs whose drawing is kept."""


@functools.lru_cache(maxsize=CACHED)
def _layout(nodes: tuple[str, ...], edges: tuple[tuple[str, str], ...]) -> Layout:
    known = set(nodes)
    pairs = [(n, d) for n, d in edges if n in known and d in known and n != d]
    parents: dict[str, list[str]] = {}
    for node, dep in pairs:
        parents.setdefault(node, []).append(dep)
    depth = _depths(nodes, parents)
    order = {node: i for i, node in enumerate(nodes)}
    columns: dict[int, list[str]] = {}
    for node in nodes:
        columns.setdefault(depth[node], []).append(node)
    row: dict[str, int] = {}
    for d in sorted(columns):

        def key(node: str) -> tuple[float, int]:
            ups = [row[p] for p in parents.get(node, ()) if p in row]
            return (sum(ups) / len(ups) if ups else -1.0, order[node])

        column = sorted(columns[d], key=key)
        columns[d] = column
        for i, node in enumerate(column):
            row[node] = i
    placed = {
        node: Placed(
            node,
            PAD + depth[node] * (NODE_W + GAP_X),
            PAD + row[node] * (NODE_H + GAP_Y),
            depth[node],
            row[node],
        )
        for node in nodes
    }
    drawn = []
    for node, dep in pairs:
        a, b = placed[dep], placed[node]
        x1, y1 = a.x + NODE_W, a.y + NODE_H // 2
        x2, y2 = b.x, b.y + NODE_H // 2
        bend = max(24, (x2 - x1) // 2)
        drawn.append(Edge(dep, node, f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"))
    width = PAD * 2 + (max(depth.values(), default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    tallest = max((len(c) for c in columns.values()), default=1)
    height = PAD * 2 + tallest * (NODE_H + GAP_Y) - GAP_Y
    return Layout(tuple(placed[n] for n in nodes), tuple(drawn), width, height)
