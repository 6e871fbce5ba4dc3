"""Fan-out over a list: item tasks, max_parallel, collection in item order, max_bytes,
empty lists, item failures (issue: dynamic parts of a run)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from tests.helpers import apoll_until, scalar


@cyclone.step("fo_list")
async def make_list(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("fo_square")
async def square(ctx: cyclone.Context, inp: int) -> int:
    await asyncio.sleep(0.002)
    return inp * inp


@cyclone.action("fo_touch")
async def touch(ctx: cyclone.Context, inp: Any) -> None:
    return None


@cyclone.step("fo_picky", max_attempts=1)
async def picky(ctx: cyclone.Context, inp: int) -> int:
    if inp == 3:
        raise cyclone.Discard("three is bad")
    await asyncio.sleep(0.01)
    return inp


@cyclone.step("fo_sum")
async def total(ctx: cyclone.Context, inp: list[int]) -> int:
    return sum(inp)


ALL = [make_list, square, touch, picky, total]


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("poll_interval", 0.1)
    options.setdefault("lease_ttl", 5)
    return cyclone.Client(dsn, workflows=workflows, handlers=ALL, **options)


def squares(max_parallel: int, max_bytes: int = 0) -> cyclone.Workflow:
    wf = cyclone.Workflow(f"squares_{max_parallel}_{max_bytes}")
    source = wf.node("source", make_list)
    items = wf.fan_out("sq", square, over=source, max_parallel=max_parallel, max_bytes=max_bytes)
    wf.result(wf.node("sum", total, input_from=items))
    return wf


@pytest.mark.slow  # a thousand items through two clients: the full tier's
async def test_thousand_items_never_more_than_max_parallel_outputs_in_order(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = squares(10)
    values = list(range(1000))
    peak = 0
    async with (
        client(dsn, wf, queues={"default": 30}) as one,
        client(dsn, wf, queues={"default": 30}),
    ):
        sub = await one.submit(wf, values)
        waiting = asyncio.ensure_future(one.wait(sub, timeout=240))
        while not waiting.done():  # sample the database while the items run
            active = scalar(
                db,
                "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND item_of = 'sq'"
                " AND state IN ('available', 'running')",
                (sub.run_id,),
            )
            peak = max(peak, active)
            await asyncio.sleep(0.005)
        run = await waiting
        steps = {s.node: s for s in await one.list_steps(sub)}
    assert run.state == RunState.COMPLETED
    assert run.result == sum(v * v for v in values)
    assert steps["sq"].output == [v * v for v in values]  # collected in item order
    assert 1 <= peak <= 10
    items = db.execute(
        "SELECT node, item_of, item_index, input FROM cyclone_steps"
        " WHERE run_id = %s AND item_of IS NOT NULL ORDER BY item_index",
        (sub.run_id,),
    ).fetchall()
    assert len(items) == 1000
    assert items[7] == ("sq[7]", "sq", 7, 7)
    assert scalar(db, "SELECT has_fan_out FROM cyclone_runs WHERE id = %s", (sub.run_id,))


async def test_empty_list_completes_at_once_and_actions_collect_nothing(dsn: str) -> None:
    wf = squares(3)
    act = cyclone.Workflow("touches")
    src = act.node("source", make_list)
    act.result(act.fan_out("each", touch, over=src))
    async with client(dsn, wf, act) as c:
        empty = await c.wait(await c.submit(wf, []), timeout=30)
        touched = await c.submit(act, [1, 2, 3])
        run = await c.wait(touched, timeout=30)
        steps = await c.list_steps(touched)
    assert empty.state == RunState.COMPLETED and empty.result == 0
    assert run.state == RunState.COMPLETED and run.result is None
    assert sorted(s.node for s in steps) == ["each", "each[0]", "each[1]", "each[2]", "source"]


async def test_max_bytes_exceeded_fails_the_node(dsn: str) -> None:
    wf = squares(0, max_bytes=20)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, list(range(100)))
        run = await c.wait(sub, timeout=60)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED
    assert steps["sq"].state == StepState.DISCARDED
    assert steps["sq"].error_kind == "fan_out_too_large"
    assert "over its max_bytes of 20" in (run.error or "")


async def test_not_a_list_fails_the_node(dsn: str) -> None:
    wf = squares(2)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, {"not": "a list"})
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED and steps["sq"].error_kind == "fan_out_input"


@pytest.mark.parametrize("policy", ["fail_run", "cancel_branch"])
async def test_a_discarded_item_discards_the_node_and_cancels_the_rest(
    dsn: str, policy: str
) -> None:
    wf = cyclone.Workflow(f"picky_{policy}")
    source = wf.node("source", make_list)
    items = wf.fan_out("pick", picky, over=source, max_parallel=2)
    wf.node("after", total, input_from=items, on_dep_failure=policy)  # type: ignore[arg-type]
    wf.node("other", make_list)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, list(range(10)))
        run = await c.wait(sub, timeout=60)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert steps["pick[3]"].state == StepState.DISCARDED
    assert steps["pick"].state == StepState.DISCARDED
    assert steps["pick"].error_kind == "item_discarded"
    assert steps["pick[9]"].state == StepState.CANCELLED
    assert steps["after"].state == StepState.CANCELLED
    if policy == "fail_run":
        assert run.state == RunState.FAILED
        assert run.error == "item pick[3] discarded: Discard: three is bad"
    else:
        assert run.state == RunState.COMPLETED


def test_fan_out_definitions_are_validated() -> None:
    wf = cyclone.Workflow("bad_fan_outs")
    src = wf.node("src", make_list)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_parallel": -1}, "max_parallel"),
        ({"max_bytes": "big"}, "max_bytes"),
        ({"max_parallel": True}, "max_parallel"),
    ]
    for kwargs, message in cases:
        with pytest.raises(cyclone.WorkflowError, match=message):
            wf.fan_out("f", square, over=src, **kwargs)
    wf.fan_out("g", square, over="ghost")
    with pytest.raises(cyclone.WorkflowError, match="unknown node 'ghost'"):
        wf.validate()


async def test_pause_and_resume_keep_max_parallel(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = squares(2)
    peak = 0

    def sample(run_id: int) -> int:
        count: int = scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND item_of = 'sq'"
            " AND state IN ('available', 'running')",
            (run_id,),
        )
        return count

    async with client(dsn, wf, queues={"default": 20}) as c:
        sub = await c.submit(wf, list(range(40)))
        while not scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND item_of IS NOT NULL",
            (sub.run_id,),
        ):
            await asyncio.sleep(0.005)
        await c.pause(sub)
        assert sample(sub.run_id) <= 2
        await c.resume(sub)
        waiting = asyncio.ensure_future(c.wait(sub, timeout=60))
        while not waiting.done():
            peak = max(peak, sample(sub.run_id))
            await asyncio.sleep(0.003)
        run = await waiting
    assert run.state == RunState.COMPLETED and run.result == sum(v * v for v in range(40))
    assert peak <= 2


FIXED = [False]


@cyclone.step("fo_until_fixed", max_attempts=1)
async def until_fixed(ctx: cyclone.Context, inp: int) -> int:
    if inp == 2 and not FIXED[0]:
        raise cyclone.Discard("two fails until fixed")
    return inp


async def test_retry_of_a_failed_fan_out_completes_it(dsn: str) -> None:
    FIXED[0] = False
    wf = cyclone.Workflow("retry_fan_out")
    source = wf.node("source", make_list)
    wf.result(wf.fan_out("each", until_fixed, over=source, max_parallel=2))
    async with cyclone.Client(
        dsn, workflows=[wf], handlers=ALL, poll_interval=0.05, lease_ttl=5
    ) as c:
        sub = await c.submit(wf, list(range(6)))
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        FIXED[0] = True
        assert await c.retry(sub) >= 2
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.result == list(range(6))


async def test_retry_of_one_item_or_the_fan_out_node(dsn: str) -> None:
    FIXED[0] = False
    wf = cyclone.Workflow("retry_item")
    source = wf.node("source", make_list)
    wf.result(wf.fan_out("each", until_fixed, over=source, max_parallel=2))
    async with cyclone.Client(
        dsn, workflows=[wf], handlers=ALL, poll_interval=0.05, lease_ttl=5
    ) as c:
        first = await c.submit(wf, list(range(4)))
        second = await c.submit(wf, list(range(4)))
        assert (await c.wait(first, timeout=30)).state == RunState.FAILED
        assert (await c.wait(second, timeout=30)).state == RunState.FAILED
        FIXED[0] = True
        assert await c.retry(first, "each[2]") >= 2  # the item and its fan-out node
        assert await c.retry(second, "each") >= 2
        runs = [await c.wait(first, timeout=30), await c.wait(second, timeout=30)]
    assert [r.result for r in runs] == [list(range(4)), list(range(4))]


GATE: list[str] = [""]


@cyclone.step("fo_gated", max_attempts=1)
async def gated(ctx: cyclone.Context, inp: int) -> int:
    while True:
        async with await psycopg.AsyncConnection.connect(GATE[0], autocommit=True) as conn:
            row = await (await conn.execute("SELECT 1 FROM gate")).fetchone()
        if row:
            break
        await asyncio.sleep(0.02)
    if inp == 1:
        raise cyclone.Discard("one is bad")
    return inp


async def test_an_item_discarded_during_a_pause_discards_the_fan_out(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    db.execute("CREATE TABLE gate (open int)")
    GATE[0] = dsn
    wf = cyclone.Workflow("paused_items")
    source = wf.node("source", make_list)
    wf.result(wf.fan_out("each", gated, over=source))
    async with cyclone.Client(
        dsn, workflows=[wf], handlers=[*ALL, gated], poll_interval=0.05, lease_ttl=5
    ) as c:
        sub = await c.submit(wf, [0, 1, 2])
        while (
            scalar(
                db,
                "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND state = 'running'",
                (sub.run_id,),
            )
            < 3
        ):
            await asyncio.sleep(0.01)
        await c.pause(sub)
        db.execute("INSERT INTO gate VALUES (1)")
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED
    assert run.error == "item each[1] discarded: Discard: one is bad"
    assert steps["each"].state == StepState.DISCARDED
    assert steps["each"].error_kind == "item_discarded"


def capped(max_items: int) -> cyclone.Workflow:
    wf = cyclone.Workflow(f"capped_{max_items}")
    source = wf.node("source", make_list)
    items = wf.fan_out("sq", square, over=source, max_parallel=2, max_items=max_items)
    wf.result(wf.node("sum", total, input_from=items))
    return wf


async def test_max_items_over_the_cap_discards_the_node_with_no_items(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = capped(5)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, list(range(6)))
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.FAILED
    assert steps["sq"].state == StepState.DISCARDED
    assert steps["sq"].error_kind == "fan_out_too_large"
    assert steps["sq"].error == "fan-out 'sq' got a list of 6 items, over its max_items of 5"
    assert steps["sum"].state == StepState.CANCELLED
    assert sorted(steps) == ["source", "sq", "sum"]  # no item task was inserted
    stored = db.execute(
        "SELECT node, fan_out_max_items FROM cyclone_steps WHERE run_id = %s ORDER BY node",
        (sub.run_id,),
    ).fetchall()
    assert stored == [("source", None), ("sq", 5), ("sum", None)]


async def test_max_items_at_the_cap_runs_every_item(dsn: str) -> None:
    wf = capped(5)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, list(range(5)))
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED and run.result == sum(v * v for v in range(5))
    assert steps["sq"].output == [v * v for v in range(5)]
    assert [n for n in steps if n.startswith("sq[")] == [f"sq[{i}]" for i in range(5)]


@pytest.mark.parametrize("bad", [-1, "5", 2.0, True, None, 2**31])
def test_bad_max_items_is_refused_and_declares_nothing(bad: Any) -> None:
    wf = cyclone.Workflow("bad_max_items")
    src = wf.node("src", make_list)
    with pytest.raises(cyclone.WorkflowError, match="max_items") as caught:
        wf.fan_out("f", square, over=src, max_items=bad)
    assert repr(bad) in str(caught.value)
    assert sorted(wf.nodes) == ["src"]


async def test_an_item_kick_runs_the_fan_out_part_only(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Item completions kick the scanner's fan-out part: the fan-out runs to its end
    on those kicks alone (no interval pass comes within the hour), and a due timer
    waits for the next full pass, which a full kick runs."""
    wf = squares(2)
    timer = cyclone.Workflow("due_timer")
    timer.result(timer.sleep("nap", 0.001))
    async with client(dsn, wf, timer, poll_interval=3600) as c:
        scanner = c.wait_scanner
        assert scanner is not None

        async def first_pass() -> bool:
            return scanner.passes >= 1

        await apoll_until(first_pass, what="the scanner's first (full) pass")
        napping = await c.submit(timer, None)
        run = await c.wait(await c.submit(wf, list(range(6))), timeout=30)
        assert run.state == RunState.COMPLETED and run.result == sum(v * v for v in range(6))
        assert scanner.passes > 2  # the fan-out's passes
        nap = scalar(db, "SELECT state FROM cyclone_steps WHERE run_id = %s", (napping.run_id,))
        assert nap == "waiting_timer"
        scanner.kick()
        done = await c.wait(napping, timeout=30)
    assert done.state == RunState.COMPLETED
