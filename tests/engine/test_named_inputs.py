"""Named fan-in: ``inputs={"name": node, ...}`` gives the handler a dict keyed by the
names, stored as ``cyclone_step_inputs.input_name``; the positional list stays a list;
bad names are refused at definition; the names take part in the def_version."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from cyclone.inputs import InputError, assemble

NAMES = ["", 5, None, "a\x00b", "x" * 1025]


@cyclone.step("named_lines")
async def lines(ctx: cyclone.Context, inp: Any) -> list[str]:
    return ["l1", "l2"]


@cyclone.step("named_approval")
def approval(ctx: cyclone.Context, inp: Any) -> dict[str, bool]:
    return {"ok": True}


@cyclone.step("named_join")
async def join(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("named_unpack")
async def unpack(ctx: cyclone.Context, inp: dict[str, Any]) -> str:
    return f"{len(inp['lines'])} lines, approved: {inp['approval']['ok']}"


def approvals() -> cyclone.Workflow:
    wf = cyclone.Workflow("named_fan_in")
    v = wf.node("lines", lines)
    w = wf.node("approval", approval)
    wf.node("positional", join, inputs=[v, w])
    wf.node("named", join, inputs={"lines": v, "approval": w})
    summary = wf.node("summary", unpack, inputs={"approval": w, "lines": v})
    wf.node("same_twice", join, inputs={"first": v, "again": v})
    wf.result(summary)
    return wf


def client(dsn: str, *workflows: cyclone.Workflow) -> cyclone.Client:
    return cyclone.Client(dsn, workflows=workflows, poll_interval=0.2, lease_ttl=3)


async def test_named_inputs_deliver_a_dict_and_the_list_stays(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = approvals()
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, {"doc": 1})
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED
    assert run.result == "2 lines, approved: True"
    assert steps["named"].output == {"lines": ["l1", "l2"], "approval": {"ok": True}}
    assert steps["positional"].output == [["l1", "l2"], {"ok": True}]
    assert steps["same_twice"].output == {"first": ["l1", "l2"], "again": ["l1", "l2"]}
    assert all(s.state == StepState.COMPLETED for s in steps.values())
    bindings = db.execute(
        "SELECT node, slot, dep_node, assembly_mode, input_name FROM cyclone_step_inputs"
        " WHERE run_id = %s ORDER BY node, slot",
        (sub.run_id,),
    ).fetchall()
    assert bindings == [
        ("named", 0, "lines", "tuple", "lines"),
        ("named", 1, "approval", "tuple", "approval"),
        ("positional", 0, "lines", "tuple", None),
        ("positional", 1, "approval", "tuple", None),
        ("same_twice", 0, "lines", "tuple", "first"),
        ("same_twice", 1, "lines", "tuple", "again"),
        ("summary", 0, "approval", "tuple", "approval"),
        ("summary", 1, "lines", "tuple", "lines"),
    ]


@cyclone.step("named_child_echo")
async def child_echo(ctx: cyclone.Context, inp: Any) -> Any:
    return {"got": inp, "run_input": ctx.run_input}


async def test_a_child_node_with_named_inputs_starts_its_run_with_the_dict(dsn: str) -> None:
    inner = cyclone.Workflow("named_inner")
    inner.result(inner.node("echo", child_echo))
    outer = cyclone.Workflow("named_outer")
    v = outer.node("lines", lines)
    w = outer.node("approval", approval)
    outer.result(outer.child("sub", inner, inputs={"lines": v, "approval": w}))
    expected = {"lines": ["l1", "l2"], "approval": {"ok": True}}
    async with client(dsn, outer) as c:
        run = await c.wait(await c.submit(outer, "outer input"), timeout=30)
    assert run.state == RunState.COMPLETED
    assert run.result == {"got": expected, "run_input": expected}


@pytest.mark.parametrize("name", NAMES)
def test_a_bad_input_name_is_refused_naming_it(name: Any) -> None:
    wf = cyclone.Workflow("bad_names")
    v = wf.node("v", lines)
    with pytest.raises(cyclone.WorkflowError, match=r"input name of node 'j'") as caught:
        wf.node("j", join, inputs={"ok": v, name: v})
    shown = "must not be empty" if name == "" else repr(name)[:40]
    assert shown in str(caught.value)
    assert list(wf.nodes) == ["v"]  # nothing declared


def test_empty_names_mapping_and_array_assembly_are_refused() -> None:
    wf = cyclone.Workflow("bad_named")
    v = wf.node("v", lines)
    with pytest.raises(cyclone.WorkflowError, match=r"node 'e'.*inputs must name at least one"):
        wf.node("e", join, inputs={})
    with pytest.raises(cyclone.WorkflowError, match=r"node 'a'.*assembly applies to inputs="):
        wf.node("a", join, inputs={"x": v}, assembly="array")
    with pytest.raises(cyclone.WorkflowError, match=r"input 'x' of node 'o'.*workflow 'other'"):
        wf.node("o", join, inputs={"x": cyclone.Workflow("other").node("q", lines)})
    with pytest.raises(cyclone.WorkflowError, match=r"node 'c'.*input_from or inputs"):
        wf.node("c", join, input_from=v, inputs={"x": v})
    with pytest.raises(cyclone.WorkflowError, match=r"input name of node 'k'.*must not be empty"):
        wf.child("k", cyclone.Workflow("inner_k"), needs_result=False, inputs={"": v})
    assert list(wf.nodes) == ["v"]


def test_a_repeated_name_from_a_mapping_is_refused() -> None:
    class Twice(dict[str, Any]):
        """A mapping whose keys repeat (a dict cannot): the check still holds."""

        def __iter__(self) -> Any:
            return iter(["dup", "dup"])

        def values(self) -> Any:
            return ["v", "v"]

        def __len__(self) -> int:
            return 2

    wf = cyclone.Workflow("twice")
    wf.node("v", lines)
    with pytest.raises(cyclone.WorkflowError, match=r"input name 'dup' is given twice"):
        wf.node("j", join, inputs=Twice())


def _version(build: Any) -> str:
    wf = cyclone.Workflow("versions")
    v = wf.node("v", lines)
    w = wf.node("w", approval)
    wf.node("j", join, inputs=build(v, w))
    return wf.def_version


def test_names_take_part_in_the_def_version() -> None:
    named = _version(lambda v, w: {"lines": v, "approval": w})
    assert named == _version(lambda v, w: {"lines": v, "approval": w})
    assert named != _version(lambda v, w: {"text": v, "approval": w})  # a name changed
    assert named != _version(lambda v, w: {"approval": w, "lines": v})  # slot order
    assert named != _version(lambda v, w: [v, w])  # the positional form
    # the positional form keeps the fingerprint it had before names existed
    assert _version(lambda v, w: [v, w]) == "10847d875c874cf94ea346fc87a96566"


def test_assemble_with_names() -> None:
    outputs = {(1, "a"): "[1]", (1, "b"): None}
    bindings = (("a", "tuple"), ("b", "tuple"))
    assert assemble(1, None, bindings, outputs, ("x", "y")) == {"x": [1], "y": None}
    assert assemble(1, None, bindings, outputs) == [[1], None]
    with pytest.raises(InputError, match=r"1 input names for 2 input bindings"):
        assemble(1, None, bindings, outputs, ("x",))
