"""Static DAG workflows end to end: data flow, advance, failure propagation, submit-once,
transactional submit, run control, def_version, views."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from tests.helpers import apoll_until, scalar


@cyclone.step("wf_echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("wf_tag")
async def tag(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    return {"node": ctx.node, "in": inp}


@cyclone.step("wf_tag_sync")
def tag_sync(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    return {"node": ctx.node, "in": inp}


@cyclone.step("wf_list")
async def make_list(ctx: cyclone.Context, inp: Any) -> list[Any]:
    return [ctx.node, ctx.node]


@cyclone.action("wf_fail", max_attempts=1)
async def fail(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard(f"{ctx.node} gives up")


@cyclone.step("wf_block")
async def block(ctx: cyclone.Context, inp: Any) -> str:
    """Runs until the step is cancelled (its task is cancelled at the lost heartbeat)."""
    await asyncio.sleep(3600)
    return "late"


@cyclone.step("wf_block_sync")
def block_sync(ctx: cyclone.Context, inp: Any) -> str:
    """A plain def that polls ``ctx.cancelled``, then returns late anyway."""
    while not ctx.cancelled:
        time.sleep(0.02)
    return "late"


@cyclone.action("wf_ledger")
async def ledger(ctx: cyclone.Context, inp: Any) -> None:
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id, node) VALUES (%s, %s)", (ctx.run_id, ctx.node))


def diamond() -> cyclone.Workflow:
    wf = cyclone.Workflow("diamond")
    a = wf.node("a", tag)
    b = wf.node("b", tag, input_from=a)
    c = wf.node("c", tag_sync, input_from=a)
    d = wf.node("d", tag, inputs=[b, c])
    wf.result(d)
    return wf


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("poll_interval", 0.2)
    options.setdefault("lease_ttl", 3)
    return cyclone.Client(dsn, workflows=workflows, **options)


async def test_diamond_data_flow_result_and_graph(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = diamond()
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, {"x": 1})
        run = await c.wait(sub, timeout=30)
        steps = await c.list_steps(sub)
    a_out = {"node": "a", "in": {"x": 1}}
    b_out = {"node": "b", "in": a_out}
    c_out = {"node": "c", "in": a_out}
    assert run.state == RunState.COMPLETED and run.def_version == wf.def_version
    assert run.result == {"node": "d", "in": [b_out, c_out]}  # slot order: b, then c
    assert [s.node for s in steps] == ["a", "b", "c", "d"]
    assert all(s.state == StepState.COMPLETED for s in steps)
    deps = db.execute(
        "SELECT node, dep_node, dep_type FROM cyclone_deps WHERE run_id = %s ORDER BY 1, 2",
        (sub.run_id,),
    ).fetchall()
    assert deps == [("b", "a", "data"), ("c", "a", "data"), ("d", "b", "data"), ("d", "c", "data")]
    bindings = db.execute(
        "SELECT node, slot, dep_node, assembly_mode FROM cyclone_step_inputs"
        " WHERE run_id = %s ORDER BY node, slot",
        (sub.run_id,),
    ).fetchall()
    assert bindings == [("d", 0, "b", "tuple"), ("d", 1, "c", "tuple")]
    # Every step started after all its parents completed (database clock).
    order = dict(
        db.execute(
            "SELECT node, started_at FROM cyclone_steps WHERE run_id = %s", (sub.run_id,)
        ).fetchall()
    )
    done = dict(
        db.execute(
            "SELECT node, completed_at FROM cyclone_steps WHERE run_id = %s", (sub.run_id,)
        ).fetchall()
    )
    assert order["b"] >= done["a"] and order["c"] >= done["a"]
    assert order["d"] >= max(done["b"], done["c"])


async def test_input_kinds_constant_run_input_array_and_control_edge(dsn: str) -> None:
    wf = cyclone.Workflow("inputs")
    p = wf.node("p", make_list)
    q = wf.node("q", make_list, input={"constant": True})
    r = wf.node("r", echo, inputs=[p, q], assembly="array")
    s = wf.node("s", echo, after=[r])  # a control edge only: the run input
    t = wf.node("t", echo, after=[s], input={"k": 1})
    wf.result(t)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, "run-input")
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED and run.result == {"k": 1}
    assert steps["r"].output == ["p", "p", "q", "q"]
    assert steps["s"].output == "run-input"


async def test_run_without_result_node_has_none(dsn: str) -> None:
    wf = cyclone.Workflow("no_result")
    wf.node("only", echo)
    async with client(dsn, wf) as c:
        run = await c.wait(await c.submit(wf, 5), timeout=30)
    assert run.state == RunState.COMPLETED and run.result is None


async def test_fail_fast_fails_once_and_cancels_siblings(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = cyclone.Workflow("fail_fast")
    root = wf.node("root", echo)
    wf.node("bad", fail, after=[root])
    slow = wf.node("slow", block, after=[root])
    slow_sync = wf.node("slow_sync", block_sync, after=[root])
    wf.node("after_slow", echo, after=[slow, slow_sync])
    async with client(dsn, wf, lease_ttl=0.6) as c:
        sub = await c.submit(wf, None)
        run = await c.wait(sub, timeout=30)
        # the blocked siblings notice at their next heartbeat; their late output is ignored
        await apoll_until(lambda: _no_lease(db, sub.run_id), timeout=30, what="siblings to let go")
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED and run.error == "Discard: bad gives up"
    assert steps["root"].state == StepState.COMPLETED
    assert steps["bad"].state == StepState.DISCARDED
    for node in ("slow", "slow_sync", "after_slow"):
        assert steps[node].state == StepState.CANCELLED, node
        assert steps[node].error_kind == "run_failed"
    assert steps["slow_sync"].output is None  # the late completion changed nothing
    assert scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (sub.run_id,)) == "failed"


async def _no_lease(db: psycopg.Connection[Any], run_id: int) -> bool:
    return not scalar(
        db,
        "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND lease_owner IS NOT NULL",
        (run_id,),
    )


async def test_second_discard_does_not_fail_the_run_again(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = cyclone.Workflow("two_failures")
    wf.node("x", fail)
    wf.node("y", fail)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        run = await c.wait(sub, timeout=30)
        steps = await c.list_steps(sub)
    assert run.state == RunState.FAILED
    # The first discard failed the run and cancelled the other root (running or not):
    # the second discard's CAS found it cancelled and changed nothing.
    assert sorted(s.state.value for s in steps) == ["cancelled", "discarded"]
    assert scalar(db, "SELECT finished_at FROM cyclone_runs WHERE id = %s", (sub.run_id,))


async def test_cancel_branch_contains_the_failure(dsn: str) -> None:
    wf = cyclone.Workflow("contained")
    root = wf.node("root", echo)
    bad = wf.node("bad", fail, after=[root])
    below = wf.node("below", echo, input_from=bad, on_dep_failure="cancel_branch")
    wf.node("deeper", echo, input_from=below, on_dep_failure="cancel_branch")
    good = wf.node("good", tag, input_from=root)
    wf.result(good)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, "in")
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED and run.result == {"node": "good", "in": "in"}
    assert steps["bad"].state == StepState.DISCARDED
    assert steps["below"].state == steps["deeper"].state == StepState.CANCELLED
    assert steps["below"].error_kind == "dep_discarded"
    assert steps["good"].state == StepState.COMPLETED


async def test_cancel_branch_with_one_fail_run_node_below_is_fatal(dsn: str) -> None:
    wf = cyclone.Workflow("mixed_policies")
    bad = wf.node("bad", fail)
    below = wf.node("below", echo, after=[bad], on_dep_failure="cancel_branch")
    wf.node("strict", echo, after=[below])  # fail_run (the default), two levels down
    async with client(dsn, wf) as c:
        run = await c.wait(await c.submit(wf, None), timeout=30)
    assert run.state == RunState.FAILED and run.error == "Discard: bad gives up"


async def test_discarded_result_node_fails_the_run_even_if_contained(dsn: str) -> None:
    wf = cyclone.Workflow("discarded_result")
    root = wf.node("root", echo)
    res = wf.node("res", fail, after=[root])
    wf.node("below", echo, after=[res], on_dep_failure="cancel_branch")
    wf.result(res)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s.state for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED and run.error == "Discard: res gives up"
    assert steps == {
        "root": StepState.COMPLETED,
        "res": StepState.DISCARDED,
        "below": StepState.CANCELLED,
    }


async def test_cancelled_result_node_fails_the_run(dsn: str) -> None:
    wf = cyclone.Workflow("lost_result")
    bad = wf.node("bad", fail)
    res = wf.node("res", echo, after=[bad], on_dep_failure="cancel_branch")
    wf.node("other", echo)
    wf.result(res)
    async with client(dsn, wf) as c:
        run = await c.wait(await c.submit(wf, None), timeout=30)
    assert run.state == RunState.FAILED and run.error == "result node cancelled"


async def test_cancel_run_cancels_its_steps_and_ignores_late_completion(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = cyclone.Workflow("to_cancel")
    first = wf.node("first", block_sync)
    wf.node("second", echo, after=[first])
    async with client(dsn, wf, lease_ttl=0.6) as c:
        sub = await c.submit(wf, None)
        await apoll_until(lambda: _state(db, sub.run_id, "first", "running"), what="first to run")
        await c.cancel(sub)
        run = await c.wait(sub, timeout=30)
        await apoll_until(lambda: _no_lease(db, sub.run_id), what="the handler to let go")
        steps = {s.node: s for s in await c.list_steps(sub)}
        with pytest.raises(cyclone.StateError):
            await c.cancel(sub)
    assert run.state == RunState.CANCELLED
    assert steps["first"].state == steps["second"].state == StepState.CANCELLED
    assert steps["first"].output is None


async def _state(db: psycopg.Connection[Any], run_id: int, node: str, state: str) -> bool:
    return bool(
        scalar(
            db, "SELECT state FROM cyclone_steps WHERE run_id = %s AND node = %s", (run_id, node)
        )
        == state
    )


async def test_submit_once_under_20_concurrent_submits(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = diamond()
    clients = [client(dsn) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(clients[i % 4].submit(wf, {"i": i}, submit_key="order-42") for i in range(20))
        )
    finally:
        for c in clients:
            await c.stop()
    assert len({r.run_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 1
    assert scalar(db, "SELECT count(*) FROM cyclone_steps") == 4
    # Another workflow may use the same key; after the run is purged, the key is free.
    other = cyclone.Workflow("other")
    other.node("n", echo)
    async with client(dsn) as c:
        assert not (await c.submit(other, None, submit_key="order-42")).duplicate
        db.execute("DELETE FROM cyclone_runs WHERE id = %s", (results[0].run_id,))
        again = await c.submit(wf, None, submit_key="order-42")
    assert not again.duplicate and again.run_id != results[0].run_id


async def test_submit_tx_rolls_back_with_the_caller(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = diamond()
    async with client(dsn) as c, await psycopg.AsyncConnection.connect(dsn) as conn:
        sub = await c.submit_tx(conn, wf, {"x": 1})
        await conn.rollback()
        assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
        kept = await c.submit_tx(conn, wf, {"x": 2})
        await conn.commit()
    assert sub.run_id != kept.run_id
    for table in ("cyclone_steps", "cyclone_deps", "cyclone_step_inputs"):
        assert scalar(db, f"SELECT count(DISTINCT run_id) FROM {table}") == 1, table
    assert scalar(db, "SELECT id FROM cyclone_runs") == kept.run_id


@cyclone.action("wf_spawn")
async def spawn(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    sub = await ctx.submit_completion(CHILD, {"x": inp["x"]}, submit_key=f"spawned-{inp['x']}")
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id, node) VALUES (%s, %s)", (sub.run_id, "spawned"))
    if inp.get("fail"):
        raise cyclone.Discard("the submitted run must not exist")


CHILD = diamond()


async def test_submit_completion_commits_with_the_step(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint, node text)")
    async with client(dsn, CHILD, handlers=[spawn]) as c:
        ok = await c.wait(await c.enqueue(spawn, {"x": 1}), timeout=30)
        bad = await c.wait(await c.enqueue(spawn, {"x": 2, "fail": True}), timeout=30)
        child_id = scalar(db, "SELECT run_id FROM ledger")
        child = await c.wait(child_id, timeout=30)
    assert ok.state == RunState.COMPLETED and bad.state == RunState.FAILED
    assert child.workflow == "diamond" and child.state == RunState.COMPLETED
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE workflow = 'diamond'") == 1
    assert scalar(db, "SELECT count(*) FROM ledger") == 1


def test_sync_client_submit_and_submit_tx(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = diamond()
    with cyclone.SyncClient(dsn) as c:
        sub = c.submit(wf, {"x": 1}, submit_key="k", deadline=60)
        assert c.submit(wf, {"x": 1}, submit_key="k").duplicate
        with psycopg.connect(dsn) as conn:
            c.submit_tx(conn, wf, None)
            conn.rollback()
        run = c.get_run(sub)
    assert run.state == RunState.RUNNING and run.deadline_at is not None
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 1
    states = dict(
        db.execute("SELECT node, state FROM cyclone_steps WHERE run_id = %s", (sub.run_id,))
    )
    assert states == {"a": "available", "b": "pending", "c": "pending", "d": "pending"}


async def test_completion_tx_step_advances_the_dag(dsn: str, db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint, node text)")
    wf = cyclone.Workflow("ledgered")
    one = wf.node("one", ledger)
    two = wf.node("two", ledger, after=[one])
    wf.node("three", echo, after=[two])
    async with client(dsn, wf) as c:
        run = await c.wait(await c.submit(wf, None), timeout=30)
    assert run.state == RunState.COMPLETED
    assert [r[0] for r in db.execute("SELECT node FROM ledger ORDER BY node")] == ["one", "two"]


async def test_def_version_mismatch_gives_the_step_back(
    dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    old = cyclone.Workflow("rolling")
    old.node("start", tag)
    new = cyclone.Workflow("rolling")
    first = new.node("start", tag)
    new.node("extra", tag, input_from=first)
    assert old.def_version != new.def_version
    async with client(dsn) as producer:
        sub = await producer.submit(new, 1)
    async with client(dsn, old, poll_interval=0.05):
        await apoll_until(
            lambda: _error_kind(db, sub.run_id, "def_version_mismatch"),
            what="the old worker to give the step back",
        )
    row = db.execute(
        "SELECT state, attempt, reclaims, error FROM cyclone_steps WHERE run_id = %s"
        " AND node = 'start'",
        (sub.run_id,),
    ).fetchone()
    assert row is not None and row[:3] == ("available", 0, 0)
    assert old.def_version in row[3] and new.def_version in row[3]
    assert "def_version mismatch" in caplog.text
    view = db.execute(
        "SELECT error_kind FROM cyclone_v_steps WHERE run_id = %s AND node = 'start'",
        (sub.run_id,),
    ).fetchone()
    assert view == ("def_version_mismatch",)
    async with client(dsn, new, old) as c:  # a worker with both versions runs it
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED


async def test_mismatched_worker_skips_the_version_and_keeps_serving(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    old = cyclone.Workflow("rolling2")
    old.node("start", tag)
    new = cyclone.Workflow("rolling2")
    new.node("start", tag, after=[new.node("pre", tag)])
    async with client(dsn) as producer:
        subs = [await producer.submit(new, i) for i in range(5)]
    async with client(dsn, old, handlers=[echo], poll_interval=0.05) as c:
        await apoll_until(
            lambda: _error_kind(db, subs[-1].run_id, "def_version_mismatch"),
            what="the mismatch to be seen",
        )
        # due again at once: a worker that knows the version is foreign skips it
        db.execute("UPDATE cyclone_steps SET scheduled_at = now() - interval '1 hour'")
        job = await c.enqueue(echo, "still served", priority=-5)
        assert (await c.wait(job, timeout=30)).result == "still served"
    generations = db.execute(
        "SELECT lease_generation, attempt, reclaims FROM cyclone_steps s"
        " JOIN cyclone_runs r ON r.id = s.run_id WHERE r.workflow = 'rolling2' AND s.node = 'pre'"
    ).fetchall()
    assert generations == [(1, 0, 0)] * 5  # each claimed once, given back, never again


async def _error_kind(db: psycopg.Connection[Any], run_id: int, kind: str) -> bool:
    return bool(
        scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND error_kind = %s",
            (run_id, kind),
        )
    )


async def test_views_count_a_real_run(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("viewed")
    ok = wf.node("ok", echo)
    wf.node("bad", fail, after=[ok])
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        await c.wait(sub, timeout=30)
    row = db.execute(
        "SELECT workflow, state, steps_total, steps_completed, steps_discarded, steps_running"
        " FROM cyclone_v_runs WHERE id = %s",
        (sub.run_id,),
    ).fetchone()
    assert row == ("viewed", "failed", 2, 1, 1, 0)
    steps = db.execute(
        "SELECT node, kind, state, attempt, error_kind, started_at IS NOT NULL,"
        " completed_at IS NOT NULL, lease_expired FROM cyclone_v_steps"
        " WHERE run_id = %s ORDER BY id",
        (sub.run_id,),
    ).fetchall()
    assert steps == [
        ("ok", "wf_echo", "completed", 0, None, True, True, False),
        ("bad", "wf_fail", "discarded", 1, "discard", True, True, False),
    ]


def test_bad_argument_types_raise_named_errors(dsn: str) -> None:
    wf = cyclone.Workflow("types")
    x = wf.node("x", echo)
    for kwargs in ({"after": None}, {"after": 5}, {"inputs": 5}, {"inputs": x}):
        with pytest.raises(cyclone.WorkflowError):
            wf.node("y", echo, **kwargs)
    with pytest.raises(cyclone.ValidationError, match="workflows must be a list"):
        cyclone.Client(dsn, workflows=wf)  # type: ignore[arg-type]
    with pytest.raises(cyclone.ValidationError, match="workflows must be"):
        cyclone.SyncClient(dsn, workflows=[echo])  # type: ignore[list-item]


async def test_bad_array_input_discards_the_step(dsn: str) -> None:
    wf = cyclone.Workflow("bad_array")
    p = wf.node("p", tag)  # a dict, not a list
    wf.node("r", echo, inputs=[p], assembly="array")
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED
    assert steps["r"].state == StepState.DISCARDED
    assert "array assembly needs a list from node 'p'" in (steps["r"].error or "")


def _bad_workflows() -> dict[str, tuple[cyclone.Workflow | None, str]]:
    cycle = cyclone.Workflow("cycle")
    cycle.node("p", echo, after=["q"])
    cycle.node("q", echo, after=["p"])
    missing = cyclone.Workflow("missing")
    missing.node("p", echo, after=["ghost"])
    unknown = cyclone.Workflow("unknown")
    unknown.node("p", "no_such_kind")
    return {
        "cycle": (cycle, "cycle through nodes"),
        "missing dependency": (missing, "unknown node 'ghost'"),
        "unknown kind": (unknown, "unknown kind 'no_such_kind'"),
        "not a workflow": (None, "expected a cyclone.Workflow"),
    }


@pytest.mark.parametrize("case", sorted(_bad_workflows()))
async def test_bad_workflow_is_refused_and_writes_nothing(
    dsn: str, db: psycopg.Connection[Any], case: str
) -> None:
    wf, message = _bad_workflows()[case]
    async with client(dsn) as c:
        with pytest.raises(cyclone.WorkflowError, match=message):
            await c.submit(wf, None)  # type: ignore[arg-type]
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(cyclone.WorkflowError, match=message):
                await c.submit_tx(conn, wf, None)  # type: ignore[arg-type]
    with cyclone.SyncClient(dsn) as sync, pytest.raises(cyclone.WorkflowError, match=message):
        sync.submit(wf, None)  # type: ignore[arg-type]
    for table in ("cyclone_runs", "cyclone_steps", "cyclone_deps", "cyclone_step_inputs"):
        assert scalar(db, f"SELECT count(*) FROM {table}") == 0, table


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"submit_key": ""}, "submit_key must not be empty"),
        ({"submit_key": "k\x00"}, "NUL"),
        ({"deadline": -5}, "deadline"),
        ({"deadline": "soon"}, "deadline"),
        ({"priority": 3}, r"unknown option\(s\) \['priority'\]"),
    ],
)
async def test_bad_submit_options_are_refused(
    dsn: str, db: psycopg.Connection[Any], options: dict[str, Any], message: str
) -> None:
    async with client(dsn) as c:
        with pytest.raises(cyclone.ValidationError, match=message):
            await c.submit(diamond(), None, **options)
        with pytest.raises(cyclone.ValidationError, match="not a JSON value"):
            await c.submit(diamond(), {"x": float("inf")})
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0


async def test_thousand_node_dag_submits_in_one_statement(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    from cyclone.config import ClientConfig
    from cyclone.submit import SubmitRequest, submit_plan

    wf = cyclone.Workflow("wide")
    root = wf.node("root", echo)
    middle = [wf.node(f"m{i}", echo, input_from=root) for i in range(998)]
    wf.node("sink", echo, inputs=middle)
    compiled = ClientConfig(handlers=(), schema="public", retention=None, notify=True).compile(wf)
    plan = submit_plan(SubmitRequest.build(compiled, None))
    assert next(plan).sql.startswith("WITH run AS")  # the whole graph: one statement
    async with client(dsn) as c:
        sub = await c.submit(wf, None)
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE run_id = %s", (sub.run_id,)) == 1000
    assert scalar(db, "SELECT count(*) FROM cyclone_deps") == 1996
    assert scalar(db, "SELECT count(*) FROM cyclone_step_inputs") == 998
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'available'") == 1


async def test_worker_serves_the_queues_of_its_workflows_nodes(dsn: str) -> None:
    wf = cyclone.Workflow("queues")
    first = wf.node("first", echo, queue="ingest", priority=5)
    wf.node("second", echo, input_from=first, queue="publish")
    c = client(dsn, wf)
    assert set(c.queues) == {"default", "ingest", "publish"}
    async with c:
        sub = await c.submit(wf, "x")
        run = await c.wait(sub, timeout=30)
        steps = await c.list_steps(sub)
    assert run.state == RunState.COMPLETED
    assert [(s.queue, s.priority) for s in steps] == [("ingest", 5), ("publish", 0)]
