"""``ctx.run_input``: every handler reads its run's input, whatever its own input is
(the run input, a data edge, a fan-in, a constant, a fan-out item, a child run); the
claim carries it only for a workflow step whose input is not the run input."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg

import cyclone
from cyclone import RunState
from cyclone.dbio import batch_sync, fetch_sync
from cyclone.transitions import claim_stmt, complete_stmts, parse_claimed


@cyclone.step("ri_seen")
async def seen(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    return {"inp": inp, "run_input": ctx.run_input}


@cyclone.step("ri_seen_sync")
def seen_sync(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    return {"inp": inp, "run_input": ctx.run_input}


@cyclone.step("ri_items")
async def items(ctx: cyclone.Context, inp: Any) -> list[int]:
    return [1, 2]


@dataclasses.dataclass
class Order:
    sku: str
    qty: int


@cyclone.step("ri_typed")
async def typed(ctx: cyclone.Context, inp: Order) -> dict[str, Any]:
    assert isinstance(inp, Order)
    return {"qty": inp.qty, "run_input": ctx.run_input}


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    return cyclone.Client(dsn, workflows=workflows, poll_interval=0.2, lease_ttl=3, **options)


async def test_every_kind_of_node_reads_the_run_input(dsn: str) -> None:
    inner = cyclone.Workflow("ri_inner")
    inner.result(inner.node("inside", seen, input_from=inner.node("first", seen)))
    wf = cyclone.Workflow("ri_all")
    root = wf.node("root", seen)
    edge = wf.node("edge", seen_sync, input_from=root)
    fan_in = wf.node("fan_in", seen, inputs=[root, edge])
    named = wf.node("named", seen_sync, inputs={"r": root})
    const = wf.node("const", seen, input={"k": 1})
    listed = wf.node("listed", items)
    each = wf.fan_out("each", seen, over=listed)
    child = wf.child("child", inner, input_from=const)
    wf.node("end", seen, after=[fan_in, named, each, child])
    run_input = {"order": 7, "lines": ["a", "b"]}
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, run_input)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s.output for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED
    for node in ("root", "edge", "fan_in", "named", "const", "end"):
        assert steps[node]["run_input"] == run_input, node
    assert steps["each"] == [{"inp": 1, "run_input": run_input}, {"inp": 2, "run_input": run_input}]
    assert steps["const"]["inp"] == {"k": 1}
    assert steps["named"]["inp"] == {"r": steps["root"]}
    # a child run's input is the child node's input (const's output), and is the run
    # input of the child run's steps, the one after a data edge included
    given = steps["const"]
    assert steps["child"] == {"inp": {"inp": given, "run_input": given}, "run_input": given}


async def test_a_standalone_run_reads_its_input_undecoded(dsn: str) -> None:
    async with client(dsn, handlers=[seen, typed]) as c:
        plain = await c.wait(await c.enqueue(seen, ["x", 1]), timeout=30)
        model = await c.wait(await c.enqueue(typed, Order("s", 2)), timeout=30)
        null = await c.wait(await c.enqueue(seen, None), timeout=30)
    assert plain.result == {"inp": ["x", 1], "run_input": ["x", 1]}
    assert model.result == {"qty": 2, "run_input": {"sku": "s", "qty": 2}}
    assert null.result == {"inp": None, "run_input": None}


async def test_a_null_run_input_reads_as_none_downstream(dsn: str) -> None:
    wf = cyclone.Workflow("ri_null")
    wf.result(wf.node("b", seen, input_from=wf.node("a", seen, input="const")))
    async with client(dsn, wf) as c:
        run = await c.wait(await c.submit(wf, None), timeout=30)
    assert run.result == {"inp": {"inp": "const", "run_input": None}, "run_input": None}


def test_the_claim_carries_the_run_input_only_where_it_is_not_the_input(dsn: str) -> None:
    """A job, and a workflow step that takes the run input, get no run_input column
    (their input is the run input); a constant-input step gets it as JSON text; a
    data-edge step gets no input (the worker assembles it) and the run input as text."""
    wf = cyclone.Workflow("ri_claim")
    root = wf.node("root", seen)
    wf.node("const", seen, input=[1])
    wf.node("edge", seen, input_from=root)
    with cyclone.SyncClient(dsn, workflows=[wf]) as producer:
        job = producer.enqueue(seen, {"job": True})
        sub = producer.submit(wf, {"wf": True})
    with psycopg.connect(dsn, autocommit=True) as conn:
        claim = claim_stmt(queue="default", kinds=["ri_seen"], owner="t/1", ttl=60, limit=5)
        rows = {row.node: row for row in fetch_sync(conn, claim)}
        assert set(rows) == {"ri_seen", "root", "const"}
        assert (rows["ri_seen"].input, rows["ri_seen"].run_input) == ({"job": True}, None)
        assert rows["ri_seen"].run_id == job.run_id
        assert (rows["root"].input, rows["root"].run_input) == ({"wf": True}, None)
        assert (rows["const"].input, rows["const"].run_input) == ([1], '{"wf": true}')
        (held_root,) = parse_claimed([rows["root"]], "default", "t/1")
        batch_sync(conn, complete_stmts([(held_root, "5")]), transaction=True)
        claim = claim_stmt(queue="default", kinds=["ri_seen"], owner="t/2", ttl=60, limit=5)
        (edge,) = fetch_sync(conn, claim)
    assert (edge.node, edge.run_id) == ("edge", sub.run_id)
    assert (edge.input, edge.run_input) == (None, '{"wf": true}')
