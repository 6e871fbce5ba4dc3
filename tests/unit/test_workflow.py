"""The workflow builder: validation, topological order, def_version (pure, no database)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import cyclone
from cyclone.config import ClientConfig
from tests.helpers import ROOT


@cyclone.step("u_a")
async def a(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("u_b")
def b(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def config(*handlers: cyclone.Handler) -> ClientConfig:
    return ClientConfig(handlers=handlers, schema="public", retention=None, notify=True)


def sample(name: str = "w") -> cyclone.Workflow:
    wf = cyclone.Workflow(name)
    x = wf.node("x", a)
    y = wf.node("y", b, input_from=x)
    z = wf.node("z", a, inputs=[x, y], assembly="array", on_dep_failure="cancel_branch")
    wf.node("w", "u_b", after=[z], priority=3, queue="other")
    wf.result(z)
    return wf


def test_definition_errors_name_the_problem() -> None:
    wf = cyclone.Workflow("w")
    x = wf.node("x", a)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"id": "x", "kind": a}, "duplicate node id 'x'"),
        ({"id": "s", "kind": a, "after": ["s"]}, "depends on itself"),
        ({"id": "s", "kind": a, "input_from": "s"}, "depends on itself"),
        ({"id": "s", "kind": a, "input_from": x, "inputs": [x]}, "not both"),
        ({"id": "s", "kind": a, "inputs": []}, "non-empty list"),
        ({"id": "s", "kind": a, "inputs": [x], "assembly": "dict"}, "assembly"),
        ({"id": "s", "kind": a, "input_from": x, "assembly": "array"}, "inputs=[...] only"),
        ({"id": "s", "kind": a, "on_dep_failure": "ignore"}, "on_dep_failure"),
        ({"id": "s", "kind": a, "priority": 2**40}, "priority"),
        ({"id": "s", "kind": a, "queue": "q" * 300}, "queue"),
        ({"id": "s", "kind": a, "max_attempts": 0}, "max_attempts"),
        ({"id": "s", "kind": a, "timeout": -1}, "timeout"),
        ({"id": "s", "kind": 42}, "kind must be a handler"),
        ({"id": "s[1]", "kind": a}, "'[' or ']'"),
        ({"id": "", "kind": a}, "must not be empty"),
        ({"id": "s", "kind": a, "input": float("nan")}, "not a JSON value"),
        ({"id": "s", "kind": a, "input_from": x, "input": 1}, "exclude each other"),
    ]
    for kwargs, message in cases:
        with pytest.raises(cyclone.WorkflowError, match=message.replace("[", r"\[")):
            wf.node(**kwargs)
    assert list(wf.nodes) == ["x"]  # nothing half declared
    with pytest.raises(cyclone.WorkflowError, match="result node 'nope'"):
        wf.result("nope")
    other = cyclone.Workflow("other")
    with pytest.raises(cyclone.WorkflowError, match="node of workflow 'w'"):
        other.node("o", a, after=[x])


def test_graph_errors_at_validation() -> None:
    cyc = cyclone.Workflow("cyc")
    cyc.node("p", a, after=["r"])
    cyc.node("q", a, after=["p"])
    cyc.node("r", a, after=["q"])
    with pytest.raises(cyclone.WorkflowError, match="cycle through nodes 'p' -> 'q' -> 'r' -> 'p'"):
        cyc.validate()
    missing = cyclone.Workflow("missing")
    missing.node("p", a, after=["ghost"])
    with pytest.raises(cyclone.WorkflowError, match="unknown node 'ghost'"):
        missing.validate()
    with pytest.raises(cyclone.WorkflowError, match="has no nodes"):
        cyclone.Workflow("empty").validate()
    unknown = cyclone.Workflow("unknown")
    unknown.node("p", "not_registered")
    with pytest.raises(cyclone.WorkflowError, match="unknown kind 'not_registered'"):
        config(a).compile(unknown)
    with pytest.raises(cyclone.WorkflowError):
        config().submit_request(cyc, None)


def test_topological_order_keeps_declaration_order() -> None:
    wf = cyclone.Workflow("order")
    wf.node("late", a, after=["early"])
    wf.node("early", a)
    wf.node("side", a)
    assert wf.validate() == ["early", "late", "side"]


def test_compiled_rows() -> None:
    compiled = config(b).compile(sample())
    assert '"root":true' in compiled.nodes and compiled.queues == {"default"}
    assert compiled.result_node == "z"
    assert '"dep_type":"data"' in compiled.deps and '"assembly_mode":"array"' in compiled.inputs


def test_def_version_stable_and_sensitive() -> None:
    base = sample().def_version
    assert base == sample().def_version and len(base) == 32
    changed_kind = cyclone.Workflow("w")
    x = changed_kind.node("x", b)  # another kind
    y = changed_kind.node("y", b, input_from=x)
    z = changed_kind.node("z", a, inputs=[x, y], assembly="array")
    changed_kind.node("w", "u_b", after=[z])
    changed_kind.result(z)
    extra_edge = sample()
    extra_edge.node("v", a, after=["x", "w"])
    swapped = cyclone.Workflow("w")
    x = swapped.node("x", a)
    y = swapped.node("y", b, input_from=x)
    z = swapped.node("z", a, inputs=[y, x], assembly="array")  # slot order differs
    swapped.node("w", "u_b", after=[z])
    swapped.result(z)
    versions = {base, changed_kind.def_version, extra_edge.def_version, swapped.def_version}
    assert len(versions) == 4
    # Options do not change the fingerprint.
    opts = cyclone.Workflow("w")
    x = opts.node("x", a, priority=9, max_attempts=2)
    y = opts.node("y", b, input_from=x, queue="elsewhere")
    z = opts.node("z", a, inputs=[x, y], assembly="array")
    opts.node("w", "u_b", after=[z])
    opts.result(z)
    assert opts.def_version == base


def test_def_version_equal_in_another_process() -> None:
    code = "from tests.unit.test_workflow import sample; print(sample().def_version)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert out.stdout.strip() == sample().def_version


def test_output_cache_bounds() -> None:
    from cyclone.inputs import OutputCache

    cache = OutputCache(max_entries=3, max_bytes=10)
    for i in range(4):
        cache.put((1, f"n{i}"), '"ab"')  # 4 bytes each
    assert len(cache) == 2 and cache.bytes == 8  # the byte budget evicted the oldest two
    assert cache.get((1, "n0")) == (False, None) and cache.get((1, "n3")) == (True, '"ab"')
    cache.put((1, "big"), '"' + "x" * 20 + '"')  # over the whole budget: never cached
    assert (1, "big") not in cache and len(cache) == 2
    cache.put((1, "none"), None)
    cache.put((1, "é"), '"é"')  # 4 bytes of UTF-8, 3 characters
    assert cache.bytes == 8 and (1, "n2") not in cache  # least recently used went first
    small = OutputCache(max_entries=2)
    for i in range(3):
        small.put((2, str(i)), "1")
    assert len(small) == 2 and (2, "0") not in small


def test_assemble_modes() -> None:
    from cyclone.inputs import InputError, assemble

    outputs = {(1, "a"): "[1, 2]", (1, "b"): "null", (1, "c"): '{"k": 1}'}
    assert assemble(1, "c", None, outputs) == {"k": 1}
    assert assemble(1, None, (("a", "tuple"), ("c", "tuple")), outputs) == [[1, 2], {"k": 1}]
    assert assemble(1, None, (("a", "array"), ("b", "array"), ("a", "array")), outputs) == [
        1,
        2,
        1,
        2,
    ]
    with pytest.raises(InputError, match="needs a list from node 'c'"):
        assemble(1, None, (("c", "array"),), outputs)
    with pytest.raises(InputError, match="'zz'"):
        assemble(1, "zz", None, outputs)
