"""drain and advance_time: due steps run inline, one at a time, with a worker's
transitions (on a database with the transition guard), and time moves by rows.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.errors import StateError, ValidationError
from cyclone.states import RunState
from cyclone.testing import advance_time, drain
from tests.helpers import scalar

calls: list[str] = []
"""Handler calls of the current test, in order."""


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


@cyclone.step("t_split")
async def split(ctx: cyclone.Context, n: int) -> list[int]:
    calls.append("split")
    return list(range(1, n + 1))


@cyclone.step("t_square")
def square(ctx: cyclone.Context, x: int) -> int:
    calls.append(f"square {x}")
    return x * x


@cyclone.step("t_total")
async def total(ctx: cyclone.Context, xs: list[int]) -> int:
    calls.append("total")
    return sum(xs)


@cyclone.step("t_flaky", max_attempts=3, retry=cyclone.RetryPolicy(base=600, jitter=0))
async def flaky(ctx: cyclone.Context, inp: None) -> str:
    calls.append(f"flaky {ctx.attempt}")
    if ctx.attempt < 1:
        raise RuntimeError("first attempt fails")
    return "ok"


@cyclone.step("t_again")
async def again(ctx: cyclone.Context, n: int) -> None:
    calls.append(f"again {n}")
    await ctx.enqueue_completion(again, n + 1)


fan = cyclone.Workflow("t_fan")
_split = fan.node("split", split)
_squares = fan.fan_out("squares", square, over=_split)
fan.result(fan.node("total", total, input_from=_squares))

nap = cyclone.Workflow("t_nap")
_first = nap.node("first", split, input=1)
_sleep = nap.sleep("nap", 3600, after=[_first])
nap.result(nap.node("last", total, input=[2, 3], after=[_sleep]))

approval = cyclone.Workflow("t_approval")
_approve = approval.wait_signal("approve", timeout=3600)
approval.result(approval.node("after", total, input_from=_approve))

parent = cyclone.Workflow("t_parent")
parent.result(parent.child("sub", fan, input=2))


@pytest.fixture
async def client(dsn: str) -> AsyncIterator[cyclone.Client]:
    made = cyclone.Client(dsn, handlers=[flaky, again], workflows=[fan, nap, approval, parent])
    try:
        yield made
    finally:
        await made.stop()


def _steps(db: psycopg.Connection[Any], run_id: int) -> dict[str, tuple[str, int]]:
    rows = db.execute(
        "SELECT node, state, attempt FROM cyclone_steps WHERE run_id = %s", (run_id,)
    ).fetchall()
    return {node: (state, attempt) for node, state, attempt in rows}


async def test_a_fan_out_and_its_fan_in_run_to_the_end_one_step_at_a_time(
    client: cyclone.Client,
) -> None:
    sub = await client.submit(fan, 3)
    assert await drain(client) == 5  # split, three items, total
    run = await client.get_run(sub)
    assert run.state is RunState.COMPLETED
    assert run.result == 14
    assert calls == ["split", "square 1", "square 2", "square 3", "total"]
    assert await drain(client) == 0


async def test_a_child_run_starts_runs_and_completes_its_parent_node(
    client: cyclone.Client,
) -> None:
    sub = await client.submit(parent, None)
    assert await drain(client) == 4  # the child run's split, two items, total
    run = await client.get_run(sub)
    assert (run.state, run.result) == (RunState.COMPLETED, 5)


async def test_a_failed_step_waits_for_its_backoff_until_time_moves(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    job = await client.enqueue(flaky, None)
    assert await drain(client) == 1
    assert _steps(db, job.run_id) == {"t_flaky": ("available", 1)}
    assert await drain(client) == 0  # the retry is ten minutes away
    assert calls == ["flaky 0"]

    shifted = await advance_time(client, 300)
    assert shifted.steps == 1
    assert await drain(client) == 0  # still five minutes to go
    await advance_time(client, timedelta(seconds=301))
    assert await drain(client) == 1
    assert calls == ["flaky 0", "flaky 1"]
    run = await client.get_run(job)
    assert (run.state, run.result) == (RunState.COMPLETED, "ok")


@cyclone.action("t_limited", queue="t_limited", rate_limit="1/m")
async def limited(ctx: cyclone.Context, inp: int) -> None:
    calls.append(f"limited {inp}")


async def test_a_rate_limited_kind_gets_room_when_time_moves(dsn: str) -> None:
    client = cyclone.Client(dsn, handlers=[limited])
    try:
        await client.enqueue_many(limited, [1, 2])
        assert await drain(client) == 1  # one start a minute
        assert await drain(client) == 0
        shifted = await advance_time(client, 30)
        assert shifted.buckets == 1
        assert await drain(client) == 0  # half a minute: still no room
        await advance_time(client, 31)
        assert await drain(client) == 1
        assert calls == ["limited 1", "limited 2"]
    finally:
        await client.stop()


async def test_a_timer_completes_once_time_moves_past_it(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    sub = await client.submit(nap, None)
    assert await drain(client) == 1
    assert _steps(db, sub.run_id)["nap"] == ("waiting_timer", 0)
    await advance_time(client, 1800)
    assert await drain(client) == 0
    assert _steps(db, sub.run_id)["nap"] == ("waiting_timer", 0)
    await advance_time(client, 1801)
    assert await drain(client) == 1  # the timer completes in the scan, then "last" runs
    run = await client.get_run(sub)
    assert (run.state, run.result) == (RunState.COMPLETED, 5)
    assert calls == ["split", "total"]


async def test_a_run_deadline_passes_when_time_moves(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    sub = await client.submit(nap, None, deadline=60)
    assert await drain(client) == 1
    shifted = await advance_time(client, 61)
    assert shifted.runs == 1
    assert await drain(client) == 0
    run = await client.get_run(sub)
    assert run.state is RunState.FAILED
    assert _steps(db, sub.run_id)["nap"][0] == "cancelled"


async def test_drain_stops_at_max_steps_and_gives_the_next_step_back(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    await client.enqueue(again, 1)
    with pytest.raises(StateError, match="max_steps=3"):
        await drain(client, max_steps=3)
    assert calls == ["again 1", "again 2", "again 3"]
    row = db.execute(
        "SELECT state, attempt, lease_owner FROM cyclone_steps ORDER BY id DESC LIMIT 1"
    ).fetchone()
    assert row == ("available", 0, None)


async def test_drain_refuses_a_client_whose_engine_runs(dsn: str) -> None:
    async with cyclone.Client(dsn, handlers=[flaky]) as started:
        with pytest.raises(StateError, match="engine is running"):
            await drain(started)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", None])
async def test_drain_refuses_a_bad_max_steps(client: cyclone.Client, bad: Any) -> None:
    await client.enqueue(flaky, None)
    with pytest.raises(ValidationError, match="max_steps"):
        await drain(client, max_steps=bad)
    assert calls == []


async def test_drain_refuses_what_is_not_an_async_client(dsn: str) -> None:
    with cyclone.SyncClient(dsn) as sync, pytest.raises(ValidationError, match="SyncClient"):
        await drain(sync)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [0, -5, math.nan, math.inf, "10", True, None, timedelta(0), 1e-9, 1e12]
)
async def test_advance_time_refuses_a_bad_duration_and_moves_nothing(
    client: cyclone.Client, db: psycopg.Connection[Any], bad: Any
) -> None:
    await client.enqueue(flaky, None, scheduled_at=60)
    before = scalar(db, "SELECT scheduled_at FROM cyclone_steps")
    with pytest.raises(ValidationError, match="seconds"):
        await advance_time(client, bad)
    assert scalar(db, "SELECT scheduled_at FROM cyclone_steps") == before


async def test_advance_time_moves_a_scheduled_job_and_a_uniqueness_window_not_a_finished_step(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    done = await client.enqueue(flaky, None)
    db.execute("UPDATE cyclone_steps SET state = 'running', lease_owner = 'x', attempt = 1")
    db.execute(
        "UPDATE cyclone_steps SET state = 'completed', lease_owner = NULL, completed_at = now()"
    )
    later = await client.enqueue(flaky, None, scheduled_at=120)
    before = dict(db.execute("SELECT id, scheduled_at FROM cyclone_steps").fetchall())
    await advance_time(client, 100)
    after = dict(db.execute("SELECT id, scheduled_at FROM cyclone_steps").fetchall())
    assert after[done.step_id] == before[done.step_id]
    assert after[later.step_id] == before[later.step_id] - timedelta(seconds=100)
    assert await drain(client) == 0
    await advance_time(client, 21)
    assert await drain(client) == 1


async def test_a_client_without_kinds_still_passes_the_scanners(
    client: cyclone.Client, dsn: str
) -> None:
    sub = await client.submit(nap, None, deadline=60)
    await advance_time(client, 61)
    bare = cyclone.Client(dsn)
    try:
        assert await drain(bare) == 0
    finally:
        await bare.stop()
    assert (await client.get_run(sub)).state is RunState.FAILED


async def test_a_signal_wait_completes_with_its_signal_or_times_out_when_time_moves(
    client: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    signalled = await client.submit(approval, None)
    silent = await client.submit(approval, None)
    assert await drain(client) == 0
    assert await client.signal(signalled, "approve", [4, 5])
    assert await drain(client) == 1  # the wait completes in the scan, then "after" runs
    assert (await client.get_run(signalled)).result == 9
    assert _steps(db, silent.run_id)["approve"] == ("waiting_signal", 0)

    await advance_time(client, 3601)
    assert await drain(client) == 0
    assert (await client.get_run(silent)).state is RunState.FAILED
    assert _steps(db, silent.run_id)["approve"][0] == "discarded"
