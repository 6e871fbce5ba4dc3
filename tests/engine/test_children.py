"""Child workflows: the result flows to the parent, a failing child fails the parent per
policy, cancelling the parent cancels its children (issue: dynamic parts of a run)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from cyclone.submit import SubmitOptions
from tests.helpers import apoll_until, scalar


@cyclone.step("ch_double")
async def double(ctx: cyclone.Context, inp: int) -> int:
    return inp * 2


@cyclone.step("ch_fail", max_attempts=1)
async def fail(ctx: cyclone.Context, inp: Any) -> int:
    raise cyclone.Discard("child gives up")


def invoice() -> cyclone.Workflow:
    wf = cyclone.Workflow("invoice")
    wf.result(wf.node("total", double))
    return wf


def failing() -> cyclone.Workflow:
    wf = cyclone.Workflow("failing_child")
    wf.result(wf.node("boom", fail))
    return wf


def client(dsn: str, *workflows: cyclone.Workflow) -> cyclone.Client:
    return cyclone.Client(
        dsn, workflows=workflows, handlers=[double, fail], poll_interval=0.05, lease_ttl=5
    )


async def test_child_result_flows_into_the_parent(dsn: str, db: psycopg.Connection[Any]) -> None:
    parent = cyclone.Workflow("order")
    start = parent.node("start", double)
    inv = parent.child("invoice", invoice(), input_from=start)
    parent.result(parent.node("after", double, input_from=inv))
    async with client(dsn, parent) as c:
        sub = await c.submit(parent, 5)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED and run.result == 40  # ((5*2)*2)*2
    assert steps["invoice"].state == StepState.COMPLETED and steps["invoice"].output == 20
    child = db.execute(
        "SELECT id, workflow, state, input, parent_node_id FROM cyclone_runs"
        " WHERE parent_run_id = %s",
        (sub.run_id,),
    ).fetchall()
    assert len(child) == 1 and child[0][1:] == ("invoice", "completed", 10, "invoice")
    view = db.execute(
        "SELECT parent_run_id, parent_node_id FROM cyclone_v_runs WHERE id = %s", (child[0][0],)
    ).fetchone()
    assert view == (sub.run_id, "invoice")


@pytest.mark.parametrize("policy", ["fail_run", "cancel_branch"])
async def test_a_failing_child_fails_the_parent_per_policy(dsn: str, policy: str) -> None:
    parent = cyclone.Workflow(f"parent_{policy}")
    kid = parent.child("kid", failing())
    parent.node("after", double, input_from=kid, on_dep_failure=policy)  # type: ignore[arg-type]
    parent.node("side", double, input=1)
    async with client(dsn, parent) as c:
        sub = await c.submit(parent, 1)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert steps["kid"].state == StepState.DISCARDED
    assert steps["kid"].error_kind == "child_failed"
    assert "Discard: child gives up" in (steps["kid"].error or "")
    if policy == "fail_run":
        assert run.state == RunState.FAILED and "child run" in (run.error or "")
    else:
        assert run.state == RunState.COMPLETED


async def test_cancelling_the_parent_cancels_its_children(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    waiting = cyclone.Workflow("waits_forever")
    waiting.wait_signal("never")
    parent = cyclone.Workflow("parent_of_waiter")
    parent.child("kid", waiting, needs_result=False)
    async with client(dsn, parent) as c:
        sub = await c.submit(parent, None)
        await apoll_until(lambda: _child(db, sub.run_id), what="the child run to start")
        await c.cancel(sub)
        run = await c.wait(sub, timeout=30)
    child_id = _child_sync(db, sub.run_id)
    assert run.state == RunState.CANCELLED
    assert scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (child_id,)) == "cancelled"
    assert (
        scalar(db, "SELECT state FROM cyclone_steps WHERE run_id = %s", (child_id,)) == "cancelled"
    )


async def _child(db: psycopg.Connection[Any], run_id: int) -> bool:
    return _child_sync(db, run_id) is not None


def _child_sync(db: psycopg.Connection[Any], run_id: int) -> Any:
    return scalar(db, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", (run_id,))


def test_child_definitions_are_validated() -> None:
    no_result = cyclone.Workflow("no_result")
    no_result.node("x", double)
    parent = cyclone.Workflow("p")
    with pytest.raises(cyclone.WorkflowError, match="declares no result"):
        parent.child("c", no_result)
    with pytest.raises(cyclone.WorkflowError, match="its own child"):
        parent.child("c", parent, needs_result=False)
    with pytest.raises(cyclone.WorkflowError, match=r"expected a cyclone\.Workflow"):
        parent.child("c", "invoice")  # type: ignore[arg-type]
    parent.child("ok", no_result, needs_result=False)
    assert parent.children() == [no_result]


FIXED = [False]


@cyclone.step("ch_flaky", max_attempts=1)
async def flaky(ctx: cyclone.Context, inp: Any) -> str:
    if not FIXED[0]:
        raise cyclone.Discard("not yet")
    return "fixed"


async def test_retry_of_a_child_node_reopens_its_child_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    FIXED[0] = False
    kid = cyclone.Workflow("flaky_child")
    kid.result(kid.node("try", flaky))
    parent = cyclone.Workflow("retrying_parent")
    parent.result(parent.child("kid", kid))
    async with cyclone.Client(
        dsn, workflows=[parent], handlers=[flaky], poll_interval=0.05, lease_ttl=5
    ) as c:
        sub = await c.submit(parent, None)
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        child_id = _child_sync(db, sub.run_id)
        FIXED[0] = True
        assert await c.retry(sub) == 2  # the child node and the child run's step
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.result == "fixed"
    assert _child_sync(db, sub.run_id) == child_id  # the same child run, reopened


async def test_a_parent_that_fails_cancels_its_running_child(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    waiting = cyclone.Workflow("waits_too")
    waiting.wait_signal("never")
    parent = cyclone.Workflow("failing_parent")
    parent.child("kid", waiting, needs_result=False)
    parent.node("bad", fail, after=[parent.wait_signal("go")])
    async with client(dsn, parent) as c:
        sub = await c.submit(parent, None)
        await apoll_until(lambda: _child(db, sub.run_id), what="the child run to start")
        assert await c.signal(sub, "go")  # now the parent fails fast
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        await apoll_until(lambda: _child_state(db, sub.run_id, "cancelled"), what="the cascade")


async def _child_state(db: psycopg.Connection[Any], run_id: int, state: str) -> bool:
    return bool(
        scalar(db, "SELECT state FROM cyclone_runs WHERE parent_run_id = %s", (run_id,)) == state
    )


DEEP_FIXED = [False]


@cyclone.step("ch_deep_flaky", max_attempts=1)
async def deep_flaky(ctx: cyclone.Context, inp: Any) -> str:
    if not DEEP_FIXED[0]:
        raise cyclone.Discard("the grandchild gives up")
    return "deep"


def _tree_states(db: psycopg.Connection[Any], top: int) -> list[tuple[int, str]]:
    """(depth, state) of the run ``top`` and every run below it."""
    rows = db.execute(
        "WITH RECURSIVE t (id, depth) AS (SELECT %s::bigint, 0 UNION ALL "
        "SELECT r.id, t.depth + 1 FROM cyclone_runs r JOIN t ON r.parent_run_id = t.id) "
        "SELECT t.depth, r.state FROM t JOIN cyclone_runs r ON r.id = t.id ORDER BY t.depth",
        (top,),
    ).fetchall()
    return [(depth, state) for depth, state in rows]


async def test_retry_of_the_top_run_reopens_the_whole_failed_tree(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Three levels: top -> middle (child node) -> leaf (child node) -> a step that
    discards. The leaf's failure fails the middle and then the top; once the handler is
    fixed, a retry of the top run reopens the middle and the leaf (a grandchild left
    failed would fail its parent node again at once) and the whole tree completes."""
    DEEP_FIXED[0] = False
    leaf = cyclone.Workflow("deep_leaf")
    leaf.result(leaf.node("try", deep_flaky))
    middle = cyclone.Workflow("deep_middle")
    middle.result(middle.child("leaf", leaf))
    top = cyclone.Workflow("deep_top")
    top.result(top.child("middle", middle))
    async with cyclone.Client(
        dsn, workflows=[top], handlers=[deep_flaky], poll_interval=0.05, lease_ttl=5
    ) as c:
        sub = await c.submit(top, None)
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        assert _tree_states(db, sub.run_id) == [(0, "failed"), (1, "failed"), (2, "failed")]
        runs_before = scalar(db, "SELECT count(*) FROM cyclone_runs")
        DEEP_FIXED[0] = True
        assert await c.retry(sub) == 3  # the middle node, the leaf node, the leaf's step
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.result == "deep"
    assert _tree_states(db, sub.run_id) == [(0, "completed"), (1, "completed"), (2, "completed")]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == runs_before  # reopened, not new


def _ended_together(db: psycopg.Connection[Any], parent: int) -> tuple[Any, ...] | None:
    """The child run of ``parent``: (its state, whether it finished in the transaction
    that ended the parent, its steps' states, whether they were cancelled in it)."""
    return db.execute(
        "SELECT c.state, c.finished_at = p.finished_at, "
        "       array_agg(DISTINCT s.state), bool_and(s.completed_at = p.finished_at) "
        "FROM cyclone_runs p JOIN cyclone_runs c ON c.parent_run_id = p.id "
        "JOIN cyclone_steps s ON s.run_id = c.id WHERE p.id = %s GROUP BY c.id, p.id",
        (parent,),
    ).fetchone()


@pytest.mark.parametrize("how", ["discard", "deadline"])
async def test_a_parent_that_fails_cancels_its_running_child_in_the_same_transaction(
    dsn: str, db: psycopg.Connection[Any], how: str
) -> None:
    """The parent fails (a worker's discard, or its deadline in the wait scanner) while
    its child run waits: the child run and its steps are cancelled by the transaction
    that failed the parent (now() is the transaction's clock: the same timestamps), not
    later by the orphan scanner."""
    waiting = cyclone.Workflow(f"waits_{how}")
    waiting.wait_signal("never")
    parent = cyclone.Workflow(f"fails_{how}")
    parent.child("kid", waiting, needs_result=False)
    parent.node("bad", fail, after=[parent.wait_signal("go")])
    async with client(dsn, parent) as c:
        options: SubmitOptions = {"deadline": 3600} if how == "deadline" else {}
        sub = await c.submit(parent, None, **options)
        await apoll_until(lambda: _child(db, sub.run_id), what="the child run to start")
        if how == "discard":
            assert await c.signal(sub, "go")  # "bad" runs and discards: fail-fast
        else:
            db.execute("UPDATE cyclone_runs SET deadline_at = now() WHERE id = %s", (sub.run_id,))
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        assert _ended_together(db, sub.run_id) == ("cancelled", True, ["cancelled"], True)


async def test_the_orphan_scanner_cancels_a_child_whose_parent_run_is_gone(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Rows as a database written before parents cancelled their children holds them: a
    running child run (and its own running child) whose parent run was purged. The
    parent's node step went with it, so only the parent link is left to find it by."""
    db.execute(
        "INSERT INTO cyclone_runs (id, workflow, def_version, parent_run_id, parent_node_id) "
        "OVERRIDING SYSTEM VALUE VALUES (10, 'kid', 'v1', 9, 'kid'), "
        "(11, 'grandkid', 'v2', 10, 'inner')"
    )
    db.execute(
        "INSERT INTO cyclone_steps (run_id, node, kind, state) VALUES "
        "(10, 'inner', '@child', 'waiting_child'), (11, 'work', 'nobody.runs.this', 'available')"
    )
    async with cyclone.Client(dsn, handlers=[double], poll_interval=3600) as c:
        assert c.wait_scanner is not None
        await apoll_until(lambda: _scanned(c), what="the first scanner pass")
        await c.wait_scanner.scan_once()
    states = db.execute("SELECT id, state FROM cyclone_runs ORDER BY id").fetchall()
    assert states == [(10, "cancelled"), (11, "cancelled")]
    assert scalar(db, "SELECT array_agg(DISTINCT state) FROM cyclone_steps") == ["cancelled"]


async def _scanned(c: cyclone.Client) -> bool:
    return c.wait_scanner is not None and c.wait_scanner.passes > 0
