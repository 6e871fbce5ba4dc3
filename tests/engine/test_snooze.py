"""``raise cyclone.Snooze(delay)``: the step comes back later without using an attempt.

A snooze puts the step back to ``available`` at ``now() + delay`` on the database
clock with ``snoozes + 1`` and ``attempt`` unchanged; past the kind's ``max_snoozes``
the step is discarded with ``error_kind = 'snooze_limit'`` and its run resolved as any
discard. Delays are an hour long and the tests move ``scheduled_at`` to ``now()`` to
end them (the worker polls every 0.2 s), so no test waits for a delay.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from cyclone.observability.hooks import Observer, Outcome
from cyclone.transitions import Claimed
from tests.cli.test_commands import as_json, ok
from tests.cli.test_step import fields
from tests.helpers import apoll_until, scalar

CALLS: dict[tuple[int, str], int] = {}
"""Handler calls so far, by run id and node."""
GATES: dict[str, asyncio.Event] = {}
"""Events a gated handler waits for before it snoozes, by the input's ``gate``."""
HOUR = 3600.0


def _call(ctx: cyclone.Context) -> int:
    key = (ctx.run_id, ctx.node)
    CALLS[key] = CALLS.get(key, 0) + 1
    return CALLS[key]


def _delay(inp: dict[str, Any]) -> float | timedelta:
    delay = float(inp.get("delay", HOUR))
    return timedelta(seconds=delay) if inp.get("timedelta") else delay


@cyclone.step("snoozer")
async def snoozer(ctx: cyclone.Context, inp: dict[str, Any]) -> int:
    """Snoozes for ``delay`` its first ``snoozes`` calls, then returns its call count."""
    calls = _call(ctx)
    if calls <= inp["snoozes"]:
        raise cyclone.Snooze(_delay(inp))
    return calls


@cyclone.step("snoozer_sync")
def snoozer_sync(ctx: cyclone.Context, inp: dict[str, Any]) -> int:
    """:func:`snoozer` as a plain ``def`` (run in a handler thread)."""
    calls = _call(ctx)
    if calls <= inp["snoozes"]:
        raise cyclone.Snooze(_delay(inp))
    return calls


@cyclone.action("snoozes_forever", max_snoozes=2)
async def snoozes_forever(ctx: cyclone.Context, inp: Any) -> None:
    _call(ctx)
    raise cyclone.Snooze(0)


@cyclone.action("snooze_ledger")
async def snooze_ledger(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    """Writes in its completion transaction, then snoozes on its first call."""
    calls = _call(ctx)
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id, call) VALUES (%s, %s)", (ctx.run_id, calls))
    if calls == 1:
        raise cyclone.Snooze(0)


@cyclone.action("snooze_ledger_sync")
def snooze_ledger_sync(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    """:func:`snooze_ledger` as a plain ``def``."""
    calls = _call(ctx)
    tx = ctx.completion_tx()
    tx.execute("INSERT INTO ledger (run_id, call) VALUES (%s, %s)", (ctx.run_id, calls))
    if calls == 1:
        raise cyclone.Snooze(0)


@cyclone.step("gated_snoozer")
async def gated_snoozer(ctx: cyclone.Context, inp: dict[str, Any]) -> int:
    """On its first call waits for its gate, then snoozes for no time."""
    calls = _call(ctx)
    if calls == 1:
        await GATES[inp["gate"]].wait()
        raise cyclone.Snooze(0)
    return calls


ALL = [snoozer, snoozer_sync, snoozes_forever, snooze_ledger, snooze_ledger_sync, gated_snoozer]


class Outcomes(Observer):
    """Every ``step_ended`` the client's engine reports, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, Outcome]] = []

    def step_ended(self, step: Claimed, outcome: Outcome, duration: float | None) -> None:
        self.seen.append((step.id, outcome))


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("handlers", ALL)
    options.setdefault("poll_interval", 0.2)
    options.setdefault("lease_ttl", 5)
    return cyclone.Client(dsn, workflows=workflows, **options)


@pytest.fixture(autouse=True)
def fresh_counts() -> None:
    """Every test's database numbers its runs from 1 again."""
    CALLS.clear()
    GATES.clear()


@pytest.fixture
def ledger(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint, call int)")


def _snoozed(db: psycopg.Connection[Any], step_id: int, times: int = 1) -> bool:
    """The step is available again after ``times`` snoozes."""
    row = db.execute(
        "SELECT state, snoozes FROM cyclone_steps WHERE id = %s", (step_id,)
    ).fetchone()
    return row == ("available", times)


def _due_in(db: psycopg.Connection[Any], step_id: int) -> float:
    """Seconds from now until the step is due, on the database clock."""
    return float(
        scalar(
            db,
            "SELECT extract(epoch FROM scheduled_at - now()) FROM cyclone_steps WHERE id = %s",
            (step_id,),
        )
    )


def _end_delay(db: psycopg.Connection[Any], step_id: int) -> None:
    """The step's snooze is over: due now."""
    db.execute("UPDATE cyclone_steps SET scheduled_at = now() WHERE id = %s", (step_id,))


@pytest.mark.parametrize(
    ("kind", "options", "lower"),
    [
        pytest.param("snoozer", {}, 3000.0, id="seconds"),
        pytest.param("snoozer", {"delay": 1800, "timedelta": True}, 1200.0, id="timedelta"),
        pytest.param("snoozer_sync", {}, 3000.0, id="sync"),
    ],
)
async def test_a_snooze_gives_the_step_back_without_an_attempt(
    dsn: str, db: psycopg.Connection[Any], kind: str, options: dict[str, Any], lower: float
) -> None:
    observer = Outcomes()
    async with client(dsn) as c:
        c.observers.add(observer)
        job = await c.enqueue(kind, {"snoozes": 1, **options})
        await apoll_until(lambda: asyncio.to_thread(_snoozed, db, job.step_id), what="snooze")
        snoozed = await c.get_step(job.step_id)
        # due at now() + delay on the database clock: an hour (or half), give or take
        upper = 3600.0 if lower == 3000.0 else 1800.0
        assert lower < _due_in(db, job.step_id) <= upper
        _end_delay(db, job.step_id)
        run = await c.wait(job, timeout=30)
        step = await c.get_step(job.step_id)
    assert (snoozed.state, snoozed.attempt, snoozed.snoozes) == (StepState.AVAILABLE, 0, 1)
    assert (snoozed.error, snoozed.error_kind, snoozed.lease_owner) == (None, None, None)
    assert (run.state, run.result) == (RunState.COMPLETED, 2)
    assert (step.state, step.attempt, step.snoozes, step.error_kind) == (
        StepState.COMPLETED,
        0,
        1,
        None,
    )
    assert [outcome for step_id, outcome in observer.seen if step_id == job.step_id] == [
        "released",
        "completed",
    ]


async def test_past_max_snoozes_the_step_is_discarded(dsn: str) -> None:
    observer = Outcomes()
    async with client(dsn) as c:
        c.observers.add(observer)
        job = await c.enqueue(snoozes_forever, None)
        run = await c.wait(job, timeout=30)
        step = await c.get_step(job.step_id)
    assert CALLS[job.run_id, "snoozes_forever"] == 3  # two snoozes, then one past the limit
    assert (step.state, step.error_kind, step.snoozes) == (StepState.DISCARDED, "snooze_limit", 2)
    assert step.error == "snoozed 2 times, max_snoozes is 2"
    assert step.attempt == 1  # the execution past the limit failed, as a Discard does
    assert "raise cyclone.Snooze(0)" in (step.panic_stack or "")
    assert (run.state, run.error) == (RunState.FAILED, "snoozed 2 times, max_snoozes is 2")
    assert [outcome for _, outcome in observer.seen] == ["released", "released", "discarded"]


async def test_a_workflow_node_snoozes_then_runs_on(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("snoozing_chain")
    first = wf.node("first", snoozer)
    wf.result(wf.node("second", snoozer, after=[first], input={"snoozes": 0}))
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, {"snoozes": 1})
        steps = {s.node: s for s in await c.list_steps(sub)}
        await apoll_until(lambda: asyncio.to_thread(_snoozed, db, steps["first"].id), what="snooze")
        assert (await c.get_run(sub)).state == RunState.RUNNING
        _end_delay(db, steps["first"].id)
        run = await c.wait(sub, timeout=30)
        after = {s.node: s for s in await c.list_steps(sub)}
    assert (run.state, run.result) == (RunState.COMPLETED, 1)  # second ran once
    assert (after["first"].snoozes, after["first"].attempt, after["first"].output) == (1, 0, 2)
    assert (after["second"].state, after["second"].snoozes) == (StepState.COMPLETED, 0)


async def test_a_workflow_node_past_max_snoozes_fails_its_run(dsn: str) -> None:
    wf = cyclone.Workflow("snoozing_forever")
    stuck = wf.node("stuck", snoozes_forever)
    wf.node("below", snoozer, after=[stuck], input={"snoozes": 0})
    wf.node("other", snoozer, input={"snoozes": 1})  # claimable, or snoozed for an hour
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, None)
        run = await c.wait(sub, timeout=30)
        steps = {s.node: s for s in await c.list_steps(sub)}
    assert (run.state, run.error) == (RunState.FAILED, "snoozed 2 times, max_snoozes is 2")
    assert (steps["stuck"].state, steps["stuck"].error_kind) == (
        StepState.DISCARDED,
        "snooze_limit",
    )
    # fail-fast, exactly as for a Discard: the rest of the run is cancelled
    assert steps["below"].state == StepState.CANCELLED
    assert steps["other"].state == StepState.CANCELLED


@pytest.mark.parametrize("kind", ["snooze_ledger", "snooze_ledger_sync"])
async def test_a_snooze_rolls_back_the_completion_transaction(
    dsn: str, db: psycopg.Connection[Any], ledger: None, kind: str
) -> None:
    async with client(dsn) as c:
        job = await c.enqueue(kind, {})
        run = await c.wait(job, timeout=30)
        step = await c.get_step(job.step_id)
    assert run.state == RunState.COMPLETED
    assert (step.snoozes, step.attempt) == (1, 0)
    rows = db.execute("SELECT call FROM ledger WHERE run_id = %s", (job.run_id,)).fetchall()
    assert rows == [(2,)], "the snoozed call's writes were committed"


async def test_a_snooze_in_a_paused_run_parks_the_step(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    GATES["paused"] = asyncio.Event()
    async with client(dsn) as c:
        job = await c.enqueue(gated_snoozer, {"gate": "paused"})
        started = (job.run_id, "gated_snoozer")
        await apoll_until(lambda: asyncio.sleep(0, CALLS.get(started)), what="handler start")
        await c.pause(job)
        GATES["paused"].set()

        def parked() -> bool:
            row = db.execute(
                "SELECT state, snoozes FROM cyclone_steps WHERE id = %s", (job.step_id,)
            ).fetchone()
            return row == ("paused", 1)

        await apoll_until(lambda: asyncio.to_thread(parked), what="parked as paused")
        await c.resume(job)
        run = await c.wait(job, timeout=30)
    assert (run.state, run.result) == (RunState.COMPLETED, 2)


@pytest.mark.slow  # runs the `cyclone` command in a process
async def test_cyclone_step_shows_the_snoozes(dsn: str) -> None:
    async with client(dsn) as c:
        job = await c.enqueue(snoozes_forever, None)
        await c.wait(job, timeout=30)
    shown = fields(ok(dsn, "step", str(job.step_id)))
    assert (shown["state"], shown["snoozes"], shown["error_kind"]) == (
        "discarded",
        "2",
        "snooze_limit",
    )
    assert shown["error"] == "snoozed 2 times, max_snoozes is 2"
    assert as_json(dsn, "step", str(job.step_id))["snoozes"] == 2
