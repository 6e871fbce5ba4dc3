"""Timers, signals and run deadlines (issue: dynamic parts of a run).

Time passes by the database clock: tests move ``scheduled_at`` / ``deadline_at`` into
the past instead of sleeping.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from tests.helpers import apoll_until, scalar


@cyclone.step("w_echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("poll_interval", 0.1)
    options.setdefault("lease_ttl", 3)
    options.setdefault("handlers", [echo])
    return cyclone.Client(dsn, workflows=workflows, **options)


def _state(db: psycopg.Connection[Any], run_id: int, node: str) -> str:
    state: str = scalar(
        db, "SELECT state FROM cyclone_steps WHERE run_id = %s AND node = %s", (run_id, node)
    )
    return state


async def test_timer_completes_by_the_database_clock_also_after_a_restart(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = cyclone.Workflow("timed")
    first = wf.node("first", echo)
    nap = wf.sleep("nap", timedelta(hours=1), after=[first])
    last = wf.node("last", echo, after=[nap])
    wf.result(last)
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, "in")
        await apoll_until(
            lambda: _is(db, sub.run_id, "nap", "waiting_timer"), what="the timer to start"
        )
        due = scalar(
            db,
            "SELECT scheduled_at - now() FROM cyclone_steps WHERE run_id = %s AND node = 'nap'",
            (sub.run_id,),
        )
        assert timedelta(minutes=59) < due <= timedelta(hours=1)
    # the client stopped (a restart); an hour passes on the database clock
    db.execute(
        "UPDATE cyclone_steps SET scheduled_at = now() - interval '1 second'"
        " WHERE run_id = %s AND node = 'nap'",
        (sub.run_id,),
    )
    async with client(dsn, wf) as c:
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert run.state == RunState.COMPLETED and run.result == "in"
    assert steps["nap"].state == StepState.COMPLETED and steps["nap"].output is None


async def _is(db: psycopg.Connection[Any], run_id: int, node: str, state: str) -> bool:
    return _state(db, run_id, node) == state


def signal_workflow() -> cyclone.Workflow:
    wf = cyclone.Workflow("signals")
    start = wf.node("start", echo)
    approve = wf.wait_signal("approve", after=[start])
    votes = wf.wait_n("votes", "vote", 2, after=[start])
    choice = wf.wait_any("choice", ["left", "right"], after=[start])
    done = wf.node("done", echo, inputs=[approve, votes, choice])
    wf.result(done)
    return wf


async def test_signals_before_and_after_the_wait_capacity_and_outputs(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = signal_workflow()
    with cyclone.SyncClient(dsn) as producer:
        sub = producer.submit(wf, None)
        # before any wait is reached (no worker yet): kept in the mailbox
        assert producer.signal(sub, "approve", {"by": "ann"})
        assert not producer.signal(sub, "approve", {"by": "bob"})  # capacity 1
        assert producer.signal(sub, "vote", 1)
        with pytest.raises(cyclone.ValidationError, match="no wait for signal 'nope'"):
            producer.signal(sub, "nope", 0)
        with pytest.raises(cyclone.NotFoundError):
            producer.signal(10**9, "approve", 0)
    async with client(dsn, wf) as c:
        await apoll_until(
            lambda: _is(db, sub.run_id, "approve", "completed"),
            what="the early signal to be consumed when the wait is reached",
        )
        await apoll_until(lambda: _is(db, sub.run_id, "choice", "waiting_signal"), what="choice")
        assert await c.signal(sub, "vote", 2)  # after the wait was reached: completes it
        assert not await c.signal(sub, "vote", 3)  # a third vote: the wait is complete
        assert await c.signal(sub, "right", "R")
        assert not await c.signal(sub, "left", "L")  # wait_any took the first
        run = await c.wait(sub, timeout=30)
        assert not await c.signal(sub, "approve", "late")  # a finished run stores nothing
    assert run.state == RunState.COMPLETED
    assert run.result == [{"by": "ann"}, [1, 2], {"name": "right", "payload": "R"}]
    rows = db.execute(
        "SELECT name, payload, consumed_by IS NOT NULL, consumed_at IS NOT NULL"
        " FROM cyclone_signals WHERE run_id = %s ORDER BY id",
        (sub.run_id,),
    ).fetchall()
    assert rows == [
        ("approve", {"by": "ann"}, True, True),
        ("vote", 1, True, True),
        ("vote", 2, True, True),
        ("right", "R", True, True),
    ]
    consumed_by = [
        r[0]
        for r in db.execute(
            "SELECT consumed_by FROM cyclone_signals WHERE run_id = %s ORDER BY id", (sub.run_id,)
        )
    ]
    assert consumed_by == ["approve", "votes", "votes", "choice"]


async def test_signal_timeout_fails_the_wait(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("impatient")
    wf.wait_signal("approve", timeout=timedelta(days=2))
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        await apoll_until(lambda: _is(db, sub.run_id, "approve", "waiting_signal"), what="wait")
        db.execute(
            "UPDATE cyclone_steps SET scheduled_at = now() - interval '1 second' WHERE run_id = %s",
            (sub.run_id,),
        )
        run = await c.wait(sub, timeout=30)
        (step,) = await c.list_steps(sub)
        assert not await c.signal(sub, "approve", 1)
    assert run.state == RunState.FAILED
    assert step.state == StepState.DISCARDED and step.error_kind == "signal_timeout"
    assert run.error == "signal wait 'approve' timed out after 172800 s"


async def test_run_past_its_deadline_fails(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("deadlined")
    wf.wait_signal("never")
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None, deadline=timedelta(hours=1))
        await apoll_until(lambda: _is(db, sub.run_id, "never", "waiting_signal"), what="wait")
        db.execute(
            "UPDATE cyclone_runs SET deadline_at = now() - interval '1 second' WHERE id = %s",
            (sub.run_id,),
        )
        run = await c.wait(sub, timeout=30)
        (step,) = await c.list_steps(sub)
    assert run.state == RunState.FAILED and run.error == "run deadline passed"
    assert step.state == StepState.CANCELLED and step.error_kind == "deadline"


def test_wait_definitions_are_validated() -> None:
    wf = cyclone.Workflow("bad_waits")
    wf.wait_signal("a")
    cases: list[tuple[Any, str]] = [
        (lambda: wf.wait_signal("b", "a"), "signal name 'a' is already waited for"),
        (lambda: wf.wait_any("c", ["x", "a"]), "signal name 'a' is already waited for"),
        (lambda: wf.wait_any("c", []), "non-empty list"),
        (lambda: wf.wait_any("c", ["x", "x"]), "repeat a name"),
        (lambda: wf.wait_n("c", "v", 0), "n must be an int"),
        (lambda: wf.sleep("c", -1), "duration"),
        (lambda: wf.sleep("c", None), "required"),  # type: ignore[arg-type]
        (lambda: wf.wait_signal("c", timeout="soon"), "timeout"),  # type: ignore[arg-type]
        (lambda: wf.node("c", "@sleep"), "engine's"),
    ]
    for make, message in cases:
        with pytest.raises(cyclone.WorkflowError, match=message):
            make()
    with pytest.raises(cyclone.ValidationError, match="engine's"):
        cyclone.step("@mine")(echo.fn)


@cyclone.action("w_ledger")
async def ledger(ctx: cyclone.Context, inp: Any) -> None:
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id) VALUES (%s)", (ctx.run_id,))


async def test_two_clients_scan_the_same_timers_and_each_fires_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint PRIMARY KEY)")  # a second run fails loudly
    wf = cyclone.Workflow("raced")
    nap = wf.sleep("nap", timedelta(hours=1))
    wf.node("after", ledger, after=[nap])
    with cyclone.SyncClient(dsn) as producer:
        subs = [producer.submit(wf, None) for _ in range(40)]
    db.execute("UPDATE cyclone_steps SET scheduled_at = now() WHERE node = 'nap'")
    first = client(dsn, wf, handlers=[echo, ledger], poll_interval=0.05)
    second = client(dsn, wf, handlers=[echo, ledger], poll_interval=0.05)
    async with first, second:
        for sub in subs:
            assert (await first.wait(sub, timeout=60)).state == RunState.COMPLETED
    assert scalar(db, "SELECT count(*) FROM ledger") == 40
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE attempt > 0") == 0


@cyclone.step("w_gate")
async def gate(ctx: cyclone.Context, inp: Any) -> str:
    """Blocks until the test opens the gate (a row in ``gate``)."""
    while True:
        async with await psycopg.AsyncConnection.connect(GATE_DSN[0], autocommit=True) as conn:
            row = await (await conn.execute("SELECT 1 FROM gate")).fetchone()
        if row:
            return "through"
        await asyncio.sleep(0.02)


GATE_DSN: list[str] = [""]


async def test_pause_holds_new_work_and_resume_moves_the_deadline(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    db.execute("CREATE TABLE gate (open int)")
    GATE_DSN[0] = dsn
    wf = cyclone.Workflow("pausable")
    first = wf.node("first", gate)
    second = wf.node("second", echo, after=[first])
    wf.wait_signal("go", timeout=timedelta(hours=2), after=[first])
    wf.result(second)
    async with client(dsn, wf, handlers=[echo, gate]) as c:
        sub = await c.submit(wf, "x", deadline=timedelta(hours=1))
        await apoll_until(lambda: _is(db, sub.run_id, "first", "running"), what="first running")
        await c.pause(sub)
        with pytest.raises(cyclone.StateError, match="not running"):
            await c.pause(sub)
        paused = await c.get_run(sub)
        assert paused.state == RunState.PAUSED and paused.paused_at is not None
        db.execute("INSERT INTO gate VALUES (1)")  # the running step finishes during the pause
        await apoll_until(lambda: _is(db, sub.run_id, "first", "completed"), what="first done")
        assert _state(db, sub.run_id, "second") == "paused"  # parked, not claimable
        assert _state(db, sub.run_id, "go") == "paused"
        # the pause lasts an hour on the database clock
        db.execute(
            "UPDATE cyclone_runs SET paused_at = paused_at - interval '1 hour' WHERE id = %s",
            (sub.run_id,),
        )
        before = scalar(db, "SELECT deadline_at FROM cyclone_runs WHERE id = %s", (sub.run_id,))
        await c.resume(sub)
        with pytest.raises(cyclone.StateError, match="not paused"):
            await c.resume(sub)
        after = scalar(db, "SELECT deadline_at FROM cyclone_runs WHERE id = %s", (sub.run_id,))
        assert timedelta(minutes=59) < after - before < timedelta(hours=1, minutes=1)
        await apoll_until(lambda: _is(db, sub.run_id, "second", "completed"), what="second")
        assert _state(db, sub.run_id, "go") == "waiting_signal"
        assert await c.signal(sub, "go", None)
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.paused_at is None and run.result == "x"


async def test_pause_then_deadline_fails_the_run_after_resume(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = cyclone.Workflow("late")
    wf.wait_signal("never")
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None, deadline=timedelta(hours=1))
        await apoll_until(lambda: _is(db, sub.run_id, "never", "waiting_signal"), what="wait")
        await c.pause(sub)
        db.execute(
            "UPDATE cyclone_runs SET deadline_at = now() - interval '1 second' WHERE id = %s",
            (sub.run_id,),
        )
        assert (await c.get_run(sub)).state == RunState.PAUSED  # no deadline while paused
        await c.resume(sub)  # moves it by the (short) pause: still in the past
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.FAILED and run.error == "run deadline passed"


@cyclone.step("w_flaky", max_attempts=1)
async def flaky(ctx: cyclone.Context, inp: Any) -> str:
    if not FIXED[0]:
        raise cyclone.Discard("broken for now")
    return "fixed"


FIXED = [False]


async def test_retry_of_a_discarded_step_completes_the_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    FIXED[0] = False
    wf = cyclone.Workflow("retried")
    f = wf.node("flaky", flaky)
    after = wf.node("after", echo, input_from=f)
    wf.node("side", echo)
    wf.result(after)
    async with client(dsn, wf, handlers=[echo, flaky]) as c:
        sub = await c.submit(wf, None)
        failed = await c.wait(sub, timeout=30)
        assert failed.state == RunState.FAILED
        with pytest.raises(cyclone.StateError, match="cannot be resumed"):
            await c.resume(sub)
        FIXED[0] = True
        assert await c.retry(sub) >= 2  # flaky (discarded) and after (cancelled)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
        with pytest.raises(cyclone.StateError, match="no discarded"):
            await c.retry(sub)
        with pytest.raises(cyclone.NotFoundError):
            await c.retry(10**9)
    assert run.state == RunState.COMPLETED and run.result == "fixed" and run.error is None
    assert steps["flaky"].attempt == 0 and steps["flaky"].reclaims == 0
    assert steps["flaky"].error is None


def test_sync_client_controls_runs(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("sync_control")
    wf.wait_signal("go")
    with cyclone.SyncClient(dsn) as c:
        sub = c.submit(wf, None)
        c.pause(sub)
        assert c.get_run(sub).state == RunState.PAUSED
        c.resume(sub)
        c.cancel(sub)
        assert c.retry(sub) == 1
        assert c.get_run(sub).state == RunState.RUNNING
        with pytest.raises(cyclone.StateError):
            c.resume(sub)


async def test_a_step_reclaimed_during_a_pause_stays_parked(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A running step of a paused run whose worker died goes back as paused, not
    available, and runs after resume."""
    wf = cyclone.Workflow("reclaimed_in_pause")
    wf.result(wf.node("only", echo))
    with cyclone.SyncClient(dsn) as producer:
        sub = producer.submit(wf, "x")
        # a worker that claimed the step and died: running, lease already expired
        db.execute(
            "UPDATE cyclone_steps SET state = 'running', lease_owner = 'dead/1',"
            " lease_generation = 1, lease_expiry = now() - interval '1 second',"
            " started_at = now() WHERE run_id = %s",
            (sub.run_id,),
        )
        producer.pause(sub)
    async with client(dsn, wf, poll_interval=0.05, sweep_interval=0.05) as c:
        await apoll_until(lambda: _is(db, sub.run_id, "only", "paused"), what="the reclaim")
        assert scalar(db, "SELECT reclaims FROM cyclone_steps WHERE run_id = %s", (sub.run_id,))
        await c.resume(sub)
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.result == "x"


async def test_retry_rules_paused_unknown_node_and_failures_left_behind(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    FIXED[0] = False
    wf = cyclone.Workflow("retry_rules")
    x = wf.node("flaky", flaky)
    y = wf.node("y", echo, after=[x])
    wf.node("z", echo)
    wf.result(y)
    async with client(dsn, wf, handlers=[echo, flaky]) as c:
        sub = await c.submit(wf, None)
        assert (await c.wait(sub, timeout=30)).state == RunState.FAILED
        with pytest.raises(cyclone.ValidationError, match="no node 'ghost'"):
            await c.retry(sub, "ghost")
        FIXED[0] = True
        # the cancelled result node, with its discarded parent above it
        assert await c.retry(sub, "y") >= 2
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.result is None  # y echoes the run input


@cyclone.action("w_fail", max_attempts=1)
async def always_fails(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard("always")


async def test_retry_of_one_node_refuses_to_leave_another_failure_behind(dsn: str) -> None:
    FIXED[0] = False
    wf = cyclone.Workflow("two_failures_contained")
    x = wf.node("flaky", flaky)
    wf.node("xb", echo, after=[x], on_dep_failure="cancel_branch")
    w = wf.node("w", always_fails)
    wf.node("wb", echo, after=[w], on_dep_failure="cancel_branch")
    async with client(dsn, wf, handlers=[echo, flaky, always_fails]) as c:
        sub = await c.submit(wf, None)
        assert (await c.wait(sub, timeout=30)).state == RunState.COMPLETED  # contained
        with pytest.raises(cyclone.StateError, match=r"\['w'\] would stay behind"):
            await c.retry(sub, "flaky")
        steps = {s.node: s.state for s in await c.list_steps(sub)}
    assert steps["flaky"] == StepState.DISCARDED  # nothing was reset


async def test_retry_of_a_paused_run_is_refused(dsn: str) -> None:
    wf = cyclone.Workflow("retry_paused")
    bad = wf.node("bad", flaky)
    wf.node("below", echo, after=[bad], on_dep_failure="cancel_branch")
    wf.wait_signal("hold")
    FIXED[0] = False
    async with client(dsn, wf, handlers=[echo, flaky]) as c:
        sub = await c.submit(wf, None)
        await apoll_until(lambda: _has_discard(dsn, sub.run_id), what="the discard")
        await c.pause(sub)
        with pytest.raises(cyclone.StateError, match="is paused: resume it"):
            await c.retry(sub)
        await c.resume(sub)
        FIXED[0] = True
        assert await c.retry(sub) == 2
        assert await c.signal(sub, "hold", None)
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED


async def _has_discard(dsn: str, run_id: int) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND state = 'discarded'",
            (run_id,),
        )
        row = await cur.fetchone()
    return bool(row and row[0])


async def test_a_contained_discard_during_a_pause_still_completes_the_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    db.execute("CREATE TABLE gate (open int)")  # before the step can poll it
    wf = cyclone.Workflow("contained_in_pause")
    bad = wf.node("bad", gate_fail)
    wf.node("below", echo, after=[bad], on_dep_failure="cancel_branch")
    GATE_DSN[0] = dsn
    async with client(dsn, wf, handlers=[echo, gate_fail]) as c:
        sub = await c.submit(wf, None)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await apoll_until(lambda: _running(dsn, sub.run_id), what="bad to run")
            await c.pause(sub)
            await conn.execute("INSERT INTO gate VALUES (1)")  # bad discards during the pause
        run = await c.wait(sub, timeout=30)
    assert run.state == RunState.COMPLETED and run.paused_at is not None


async def _running(dsn: str, run_id: int) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM cyclone_steps WHERE run_id = %s AND state = 'running'",
            (run_id,),
        )
        row = await cur.fetchone()
    return bool(row and row[0])


@cyclone.action("w_gate_fail", max_attempts=1)
async def gate_fail(ctx: cyclone.Context, inp: Any) -> None:
    await gate.fn(ctx, inp)
    raise cyclone.Discard("fails after the gate")
