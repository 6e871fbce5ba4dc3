"""Flow control as a busy worker sees it: fairness takes turns across claims of one
step, a freed place is claimed at once, and a spent rate bucket does not hold up
another bucket's steps."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import cyclone
from tests.helpers import apoll_until, scalar


@cyclone.step("turn_job")
async def turn_job(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("turn_single", max_concurrency=1)
async def turn_single(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("turn_rated", rate_limit=cyclone.RateLimit(5, per=1, burst=5))
async def turn_rated(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def _started_before_last(db: psycopg.Connection[Any], many: str, few: str) -> int:
    """Steps of fairness or rate key ``many`` started no later than the last of ``few``."""
    return int(
        scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE coalesce(fairness_key, rate_key) = %s"
            " AND started_at <= (SELECT max(started_at) FROM cyclone_steps"
            " WHERE coalesce(fairness_key, rate_key) = %s)",
            (many, few),
        )
    )


async def test_a_one_slot_worker_takes_fairness_keys_in_turn(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """600 jobs of key A, then 10 of B and 10 of C, run by a worker with one slot (every
    claim takes one step): claims go round the keys, so B's and C's 10 each start
    within the first 30 claims or so, not after A's backlog."""
    async with cyclone.Client(dsn) as producer:
        await producer.enqueue_many(turn_job, list(range(600)), fairness_key="A")
        b = await producer.enqueue_many(turn_job, list(range(10)), fairness_key="B")
        c = await producer.enqueue_many(turn_job, list(range(10)), fairness_key="C")
    async with cyclone.Client(dsn, handlers=[turn_job], queues={"default": 1}) as worker:
        for job in b + c:
            await worker.wait(job, timeout=60)
    assert _started_before_last(db, "A", "B") <= 12
    assert _started_before_last(db, "A", "C") <= 12


async def test_a_freed_place_is_claimed_without_waiting_for_a_poll(dsn: str) -> None:
    """A worker that never polls (poll_interval of an hour) runs five jobs of a
    ``max_concurrency=1`` kind one after the other: each end of a step of a limited
    kind wakes its queue's claim, since nothing else would."""
    async with cyclone.Client(
        dsn, handlers=[turn_single], queues={"default": 4}, poll_interval=3600
    ) as worker:
        jobs = await worker.enqueue_many(turn_single, list(range(5)))
        runs = [await worker.wait(job, timeout=30) for job in jobs]
    assert [run.result for run in runs] == list(range(5))


async def test_a_spent_bucket_does_not_hold_up_another_bucket(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """``RateLimit(5, per=1, burst=5)``: 200 jobs of bucket A spend its tokens; 5 of
    bucket B enqueued after them start at once, not after A's backlog."""
    async with cyclone.Client(dsn) as producer:
        await producer.enqueue_many(turn_rated, list(range(200)), rate_key="A")
    async with cyclone.Client(
        dsn, handlers=[turn_rated], queues={"default": 10}, poll_interval=0.05
    ) as worker:
        done = "SELECT count(*) FROM cyclone_steps WHERE state = 'completed'"
        await apoll_until(lambda: asyncio.sleep(0, scalar(db, done) >= 12), what="A's tokens spent")
        b = await worker.enqueue_many(turn_rated, list(range(5)), rate_key="B")
        for job in b:
            await worker.wait(job, timeout=30)
    assert _started_before_last(db, "A", "B") <= 25


_GATE = asyncio.Event()


@cyclone.step("turn_gated", max_concurrency=1)
async def turn_gated(ctx: cyclone.Context, inp: Any) -> Any:
    if inp == "x":
        await _GATE.wait()
    return inp


async def test_a_full_group_does_not_hide_a_fairness_keys_other_groups(dsn: str) -> None:
    """One fairness key, one kind with ``max_concurrency=1``: 30 steps of group x
    enqueued first (the one running blocks), then 3 of group y: y's steps run while x's
    group is full, though x's backlog comes first in the key."""
    _GATE.clear()
    async with cyclone.Client(dsn) as producer:
        xs = await producer.enqueue_many(
            turn_gated, ["x"] * 30, concurrency_key="x", fairness_key="t"
        )
        ys = await producer.enqueue_many(
            turn_gated, ["y"] * 3, concurrency_key="y", fairness_key="t"
        )
    async with cyclone.Client(
        dsn, handlers=[turn_gated], queues={"default": 10}, poll_interval=0.05
    ) as worker:
        for job in ys:
            assert (await worker.wait(job, timeout=30)).result == "y"
        _GATE.set()
        for job in xs:
            assert (await worker.wait(job, timeout=60)).result == "x"
