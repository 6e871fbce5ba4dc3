"""The DAG layout of the run page (pure): columns by longest-path depth, edges from
left to right, no two boxes overlapping."""

from __future__ import annotations

import itertools

from cyclone.dashboard.layout import NODE_H, NODE_W, layout


def test_nodes_sit_in_columns_by_longest_path_depth() -> None:
    drawn = layout(["a", "b", "c", "d"], [("b", "a"), ("c", "b"), ("d", "a"), ("d", "c")])
    depth = {p.node: p.depth for p in drawn.nodes}
    assert depth == {"a": 0, "b": 1, "c": 2, "d": 3}
    assert [p.node for p in drawn.nodes] == ["a", "b", "c", "d"]


def test_edges_point_right_and_boxes_never_overlap() -> None:
    nodes = [f"n{i}" for i in range(60)]
    edges = [(f"n{i}", f"n{i // 3}") for i in range(1, 60)]
    drawn = layout(nodes, edges)
    at = {p.node: p for p in drawn.nodes}
    for edge in drawn.edges:
        assert at[edge.source].x + NODE_W <= at[edge.target].x
    for a, b in itertools.combinations(drawn.nodes, 2):
        apart_x = a.x + NODE_W <= b.x or b.x + NODE_W <= a.x
        apart_y = a.y + NODE_H <= b.y or b.y + NODE_H <= a.y
        assert apart_x or apart_y, (a, b)
    assert all(p.x + NODE_W <= drawn.width and p.y + NODE_H <= drawn.height for p in drawn.nodes)


def test_unknown_edges_and_cycles_do_not_break_it() -> None:
    drawn = layout(["a", "b"], [("a", "b"), ("b", "a"), ("a", "zz")])
    assert {p.node for p in drawn.nodes} == {"a", "b"}
