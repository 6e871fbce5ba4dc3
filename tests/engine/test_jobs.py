"""Standalone jobs end to end: outcomes, retries, discard, timeout, uniqueness, cancel."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from tests.helpers import apoll_until, scalar

FAST_RETRY = cyclone.RetryPolicy(base=0.05, factor=1.0, cap=0.05, jitter=0.0)


@cyclone.step("add")
async def add(ctx: cyclone.Context, inp: dict[str, int]) -> int:
    return inp["a"] + inp["b"]


@cyclone.step("add_sync")
def add_sync(ctx: cyclone.Context, inp: dict[str, int]) -> int:
    return inp["a"] + inp["b"]


@cyclone.step("flaky", max_attempts=3, retry=FAST_RETRY)
async def flaky(ctx: cyclone.Context, inp: dict[str, int]) -> int:
    if ctx.attempt < inp["fail_times"]:
        raise RuntimeError(f"failure {ctx.attempt}")
    return ctx.attempt


@cyclone.step("always_fails", max_attempts=2, retry=FAST_RETRY)
def always_fails(ctx: cyclone.Context, inp: Any) -> None:
    raise ValueError("bad input, always")


@cyclone.action("discards")
async def discards(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard("not worth retrying")


class Permanent(Exception):
    pass


@cyclone.action("no_retry_kind", no_retry=[Permanent])
async def no_retry_kind(ctx: cyclone.Context, inp: Any) -> None:
    raise Permanent("permanent")


@cyclone.step("slow", timeout=0.3, max_attempts=1)
async def slow(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.sleep(3600)


@cyclone.action("write_ledger")
async def write_ledger(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id, item) VALUES (%s, %s)", (ctx.run_id, inp["item"]))
    if inp.get("fail"):
        raise RuntimeError("fails after writing")


@cyclone.action("write_ledger_sync")
def write_ledger_sync(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    tx = ctx.completion_tx()
    tx.execute("INSERT INTO ledger (run_id, item) VALUES (%s, %s)", (ctx.run_id, inp["item"]))


@cyclone.action("spawns")
async def spawns(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    await ctx.enqueue_completion("add", {"a": 20, "b": 22})
    if inp.get("fail"):
        raise cyclone.Discard("child must not exist")


ALL = [
    add,
    add_sync,
    flaky,
    always_fails,
    discards,
    no_retry_kind,
    slow,
    write_ledger,
    write_ledger_sync,
    spawns,
]


@pytest.fixture
def ledger(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint, item text)")


def client(dsn: str, **options: Any) -> cyclone.Client:
    options.setdefault("handlers", ALL)
    options.setdefault("poll_interval", 0.2)
    options.setdefault("lease_ttl", 5)
    return cyclone.Client(dsn, **options)


async def test_step_output_becomes_run_result(dsn: str) -> None:
    async with client(dsn) as c:
        job = await c.enqueue(add, {"a": 2, "b": 3})
        sync_job = await c.enqueue("add_sync", {"a": 4, "b": 5})
        run = await c.wait(job, timeout=30)
        sync_run = await c.wait(sync_job, timeout=30)
    assert (run.state, run.result, run.error) == (RunState.COMPLETED, 5, None)
    assert (sync_run.state, sync_run.result) == (RunState.COMPLETED, 9)
    assert run.finished_at is not None and run.workflow == "add" and run.def_version == "job"


async def test_failed_attempts_retry_with_attempt_counted(dsn: str) -> None:
    async with client(dsn) as c:
        job = await c.enqueue(flaky, {"fail_times": 2})
        run = await c.wait(job, timeout=30)
        (step,) = await c.list_steps(job)
    assert run.state == RunState.COMPLETED and run.result == 2
    assert step.attempt == 2 and step.error == "RuntimeError: failure 1"
    assert step.error_kind == "exception" and "Traceback" in (step.panic_stack or "")


async def test_last_attempt_discards_and_fails_run(dsn: str) -> None:
    async with client(dsn) as c:
        run = await c.wait(await c.enqueue(always_fails, None), timeout=30)
        (step,) = await c.list_steps(run.id)
    assert run.state == RunState.FAILED and run.error == "ValueError: bad input, always"
    assert step.state == StepState.DISCARDED and step.attempt == 2 and step.max_attempts == 2
    assert 'raise ValueError("bad input, always")' in (step.panic_stack or "")


@pytest.mark.parametrize("kind", ["discards", "no_retry_kind"])
async def test_discard_skips_remaining_attempts(dsn: str, kind: str) -> None:
    async with client(dsn) as c:
        run = await c.wait(await c.enqueue(kind), timeout=30)
        (step,) = await c.list_steps(run.id)
    assert run.state == RunState.FAILED
    assert step.state == StepState.DISCARDED and step.attempt == 1
    assert step.error_kind == "discard"


async def test_async_handler_past_timeout_fails_with_timeout_kind(dsn: str) -> None:
    async with client(dsn) as c:
        run = await c.wait(await c.enqueue(slow), timeout=30)
        (step,) = await c.list_steps(run.id)
    assert run.state == RunState.FAILED
    assert step.error_kind == "timeout" and step.attempt == 1
    assert step.error == "TimeoutError: step exceeded its timeout of 0.3 s"


async def test_completion_tx_commits_with_step(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    async with client(dsn) as c:
        a = await c.wait(await c.enqueue(write_ledger, {"item": "a"}), timeout=30)
        b = await c.wait(await c.enqueue(write_ledger_sync, {"item": "b"}), timeout=30)
    assert a.state == b.state == RunState.COMPLETED
    rows = db.execute("SELECT run_id, item FROM ledger ORDER BY item").fetchall()
    assert rows == [(a.id, "a"), (b.id, "b")]


async def test_failing_handler_rolls_back_its_writes(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    async with client(dsn) as c:
        job = await c.enqueue(write_ledger, {"item": "x", "fail": True}, max_attempts=2)
        run = await c.wait(job, timeout=30)
    assert run.state == RunState.FAILED
    assert scalar(db, "SELECT count(*) FROM ledger") == 0


async def test_enqueue_completion_exists_only_if_step_completes(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with client(dsn) as c:
        ok = await c.wait(await c.enqueue(spawns, {}), timeout=30)
        failed = await c.wait(await c.enqueue(spawns, {"fail": True}), timeout=30)
        child_id = scalar(db, "SELECT id FROM cyclone_runs WHERE workflow = 'add'")
        child = await c.wait(child_id, timeout=30)
    assert ok.state == RunState.COMPLETED and failed.state == RunState.FAILED
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE workflow = 'add'") == 1
    assert child.result == 42


async def test_unique_key_returns_live_duplicate_then_frees(dsn: str) -> None:
    later = timedelta(hours=1)
    async with client(dsn, handlers=[]) as c:
        first = await c.enqueue("add", {"a": 1, "b": 1}, unique_key="cust-7", scheduled_at=later)
        again = await c.enqueue("add", {"a": 9, "b": 9}, unique_key="cust-7")
        other_kind = await c.enqueue("add_sync", {"a": 1, "b": 1}, unique_key="cust-7")
        await c.cancel(first)
        fresh = await c.enqueue("add", {"a": 1, "b": 1}, unique_key="cust-7")
    assert not first.duplicate and again.duplicate
    assert (again.run_id, again.step_id) == (first.run_id, first.step_id)
    assert not other_kind.duplicate and other_kind.run_id != first.run_id
    assert not fresh.duplicate and fresh.run_id != first.run_id


async def test_concurrent_unique_enqueues_make_one_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with client(dsn, handlers=[]) as c:
        results = await asyncio.gather(
            *(
                c.enqueue(
                    "add", {"a": i, "b": 0}, unique_key="once", scheduled_at=timedelta(hours=1)
                )
                for i in range(20)
            )
        )
    assert len({r.run_id for r in results}) == 1
    assert sum(not r.duplicate for r in results) == 1
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 1


async def test_priority_then_scheduled_at_orders_claims(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    order: list[int] = []

    @cyclone.action("record")
    async def record(ctx: cyclone.Context, inp: int) -> None:
        order.append(inp)

    async with cyclone.Client(dsn, handlers=[], poll_interval=0.2) as producer:
        base = await producer.enqueue("record", 0)  # only to learn the database clock
        now = scalar(db, "SELECT scheduled_at FROM cyclone_steps WHERE id = %s", (base.step_id,))
        await producer.cancel(base)
        await producer.enqueue("record", 3, priority=0, scheduled_at=now - timedelta(seconds=1))
        await producer.enqueue("record", 4, priority=0, scheduled_at=now)
        await producer.enqueue("record", 1, priority=5, scheduled_at=now)
        await producer.enqueue(
            "record", 2, priority=5, scheduled_at=now + timedelta(milliseconds=1)
        )
    async with cyclone.Client(dsn, handlers=[record], queues={"default": 1}, poll_interval=0.2):
        await apoll_until(lambda: asyncio.sleep(0, len(order) == 4), timeout=30)
    assert order == [1, 2, 3, 4]


async def test_cancel_running_and_finished_runs(dsn: str) -> None:
    started = asyncio.Event()

    @cyclone.action("blocks")
    async def blocks(ctx: cyclone.Context, inp: Any) -> None:
        started.set()
        await asyncio.sleep(3600)

    async with client(dsn, handlers=[blocks, add], lease_ttl=0.6) as c:
        job = await c.enqueue(blocks)
        await asyncio.wait_for(started.wait(), 30)
        await c.cancel(job)
        run = await c.get_run(job)
        (step,) = await c.list_steps(job)
        with pytest.raises(cyclone.StateError, match="already cancelled"):
            await c.cancel(job)
        with pytest.raises(cyclone.NotFoundError):
            await c.cancel(10**9)
        # the handler learns of the cancel at its next heartbeat and is cancelled
        await apoll_until(
            lambda: asyncio.sleep(0, c.worker is not None and c.worker.held == 0), timeout=30
        )
    assert run.state == RunState.CANCELLED and step.state == StepState.CANCELLED


async def test_enqueue_tx_rollback_leaves_nothing_commit_is_claimed(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with client(dsn) as c:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await c.enqueue_tx(conn, add, {"a": 1, "b": 1})
            await conn.rollback()
            assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
            job = await c.enqueue_tx(conn, add, {"a": 2, "b": 2})
            await conn.commit()
        run = await c.wait(job, timeout=30)
    assert run.state == RunState.COMPLETED and run.result == 4
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 1


async def test_enqueue_many_in_input_order(dsn: str) -> None:
    async with client(dsn) as c:
        jobs = await c.enqueue_many(add, [{"a": i, "b": 1} for i in range(50)])
        runs = [await c.wait(j, timeout=30) for j in jobs]
        assert await c.enqueue_many(add, []) == []
    assert [r.result for r in runs] == [i + 1 for i in range(50)]
    assert [r.input for r in runs] == [{"a": i, "b": 1} for i in range(50)]


async def test_list_runs_filters_and_pages(dsn: str) -> None:
    async with client(dsn, handlers=[]) as c:
        ids = [(await c.enqueue("add", {"a": i, "b": 0})).run_id for i in range(5)]
        await c.cancel(ids[0])
        newest = await c.list_runs(limit=2)
        older = await c.list_runs(limit=10, before=newest[-1].id)
        cancelled = await c.list_runs(state="cancelled")
        none = await c.list_runs(workflow="other")
        with pytest.raises(cyclone.ValidationError, match="state must be one of"):
            await c.list_runs(state="bogus")
    assert [r.id for r in newest] == ids[:-3:-1]
    assert [r.id for r in older] == ids[2::-1]
    assert [r.id for r in cancelled] == [ids[0]] and none == []


async def test_wait_times_out_and_not_found(dsn: str) -> None:
    async with client(dsn, handlers=[]) as c:
        job = await c.enqueue("add", {"a": 1, "b": 1})
        with pytest.raises(cyclone.WaitTimeout) as info:
            await c.wait(job, timeout=0.3)
        assert isinstance(info.value, TimeoutError)
        with pytest.raises(cyclone.NotFoundError):
            await c.wait(10**9, timeout=1)


async def test_a_step_enqueued_by_name_takes_the_workers_declared_timeout(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A producer that does not know the kind writes no timeout; the worker's claim
    applies the timeout its kind declares, so it is enforced (and durable)."""
    async with cyclone.Client(dsn, handlers=[]) as producer:
        job = await producer.enqueue("slow", {}, max_attempts=1)
    assert scalar(db, "SELECT timeout FROM cyclone_steps") is None
    async with client(dsn) as worker:
        run = await worker.wait(job, timeout=30)
    step = db.execute(
        "SELECT extract(epoch FROM timeout)::float8, error_kind FROM cyclone_steps"
    ).fetchone()
    assert run.state == RunState.FAILED
    assert step == (pytest.approx(0.3), "timeout")
