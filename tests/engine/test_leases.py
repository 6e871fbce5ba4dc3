"""Leases, heartbeats, timeouts, the recovery sweep and graceful shutdown.

docs/design.md, Claims, leases and heartbeats, and Recovery sweep: a lease is renewed at
most TTL/3 after the last renewal for the whole attempt, by one heartbeat statement per
tick for every lease a worker has due; past ``started_at + timeout`` it is not renewed
and the sweep takes the step even while its lease is fresh; a reclaim is not an attempt;
``max_reclaims`` bounds reclaims with ``reclaim_limit``; releasing at graceful shutdown
is not a reclaim.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState, StepState
from tests.helpers import apoll_until, scalar


async def wait_db(
    db: psycopg.Connection[Any], query: str, expected: Any, timeout: float = 30
) -> None:
    """Poll ``query`` (first column of first row) until it equals ``expected``."""

    async def check() -> bool:
        return bool(scalar(db, query) == expected)

    await apoll_until(check, timeout=timeout, what=f"{query} == {expected!r}")


async def test_heartbeats_renew_the_lease_for_a_long_handler(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A handler running over several TTLs keeps its lease: no reclaim, no attempt."""
    release = asyncio.Event()

    @cyclone.step("long")
    async def long(ctx: cyclone.Context, inp: Any) -> str:
        await release.wait()
        return "done"

    async with cyclone.Client(dsn, handlers=[long], lease_ttl=1.5, sweep_interval=0.1) as c:
        job = await c.enqueue(long)
        await wait_db(db, "SELECT state FROM cyclone_steps", "running")
        seen: set[Any] = set()

        async def three_heartbeats() -> bool:
            seen.add(scalar(db, "SELECT lease_expiry FROM cyclone_steps"))
            return len(seen) >= 4

        await apoll_until(three_heartbeats, timeout=30, what="three lease renewals")
        release.set()
        run = await c.wait(job, timeout=30)
    step = db.execute("SELECT reclaims, attempt, lease_generation FROM cyclone_steps").fetchone()
    assert run.state == RunState.COMPLETED and run.result == "done"
    assert step == (0, 0, 1)


@pytest.mark.slow  # waits for real heartbeat ticks
async def test_one_heartbeat_statement_a_tick_renews_every_held_lease(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """30 long steps held: each tick sends one statement for every lease due, not one
    per step; each of the 30 leases keeps moving forward, the sweep reclaims none, and
    with nothing held any more the ticker is gone."""
    release = asyncio.Event()

    @cyclone.step("long30")
    async def long30(ctx: cyclone.Context, inp: Any) -> Any:
        await release.wait()
        return inp

    async with cyclone.Client(dsn, handlers=[]) as producer:
        jobs = await producer.enqueue_many(long30, list(range(30)))
    async with cyclone.Client(
        dsn,
        handlers=[long30],
        queues={"default": 30},
        claim_batch=30,
        lease_ttl=3,
        sweep_interval=0.2,
    ) as c:
        await wait_db(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'", 30)
        seen: dict[int, set[Any]] = {}

        async def each_renewed_three_times() -> bool:
            for step_id, expiry in db.execute("SELECT id, lease_expiry FROM cyclone_steps"):
                seen.setdefault(step_id, set()).add(expiry)
            return len(seen) == 30 and all(len(e) >= 4 for e in seen.values())

        await apoll_until(each_renewed_three_times, timeout=60, what="30 leases renewed 3 times")
        assert c.worker is not None
        beats = c.worker.heartbeats
        # the database shows a renewal as it commits, the ticker counts it a moment later
        await apoll_until(lambda: asyncio.sleep(0, beats.renewed >= 90), what="90 counted")
        statements, renewed = beats.statements, beats.renewed
        # one statement per renewal round of the 30 (a step per statement would be 30x)
        assert statements <= renewed / 30 + 2, (statements, renewed)
        assert beats.errors == 0
        release.set()
        runs = [await c.wait(job, timeout=30) for job in jobs]
        await apoll_until(lambda: asyncio.sleep(0, not beats.running), what="ticker gone")
    assert [r.result for r in runs] == list(range(30))
    rows = db.execute("SELECT DISTINCT reclaims, attempt, lease_generation FROM cyclone_steps")
    assert rows.fetchall() == [(0, 0, 1)]


async def test_a_lost_lease_among_many_cancels_only_its_handler(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """One of ten held steps is taken by another owner (a new generation): the next
    tick's statement finds that lease gone, its handler is told and cancelled, and the
    nine others keep their leases and complete."""
    release = asyncio.Event()
    cancelled: list[int] = []
    contexts: dict[int, cyclone.Context] = {}

    @cyclone.step("held10")
    async def held10(ctx: cyclone.Context, inp: Any) -> Any:
        contexts[ctx.step_id] = ctx
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.append(ctx.step_id)
            raise
        return inp

    async with cyclone.Client(dsn, handlers=[]) as producer:
        jobs = await producer.enqueue_many(held10, list(range(10)))
    async with cyclone.Client(
        dsn,
        handlers=[held10],
        queues={"default": 10},
        claim_batch=10,
        lease_ttl=1.5,
        sweep_interval=60,
    ) as c:
        await wait_db(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'", 10)
        await apoll_until(lambda: asyncio.sleep(0, len(contexts) == 10), what="10 handlers")
        victim = min(contexts)
        db.execute(
            "UPDATE cyclone_steps SET lease_owner = 'thief', lease_generation = 2, "
            "lease_expiry = now() + interval '1 hour' WHERE id = %s",
            (victim,),
        )
        await apoll_until(lambda: asyncio.sleep(0, bool(cancelled)), what="victim cancelled")
        assert contexts[victim].cancelled
        others = [job for job in jobs if job.step_id != victim]
        release.set()
        runs = [await c.wait(job, timeout=30) for job in others]
    assert cancelled == [victim]
    assert not any(ctx.cancelled for step_id, ctx in contexts.items() if step_id != victim)
    assert [r.result for r in runs] == [i for i, job in enumerate(jobs) if job.step_id != victim]
    row = db.execute("SELECT state, lease_owner FROM cyclone_steps WHERE id = %s", (victim,))
    assert row.fetchone() == ("running", "thief")  # nothing of the cancelled handler written


async def test_timeout_is_swept_while_lease_is_fresh_then_reclaim_limit(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Past started_at + timeout the sweep reclaims the step although its lease has far
    to run; past max_reclaims it is discarded with reclaim_limit and the run fails."""
    holds: list[cyclone.Context] = []

    @cyclone.action("stuck", timeout=600)
    async def stuck(ctx: cyclone.Context, inp: Any) -> None:
        holds.append(ctx)
        await asyncio.Event().wait()

    async with cyclone.Client(
        dsn,
        handlers=[stuck],
        lease_ttl=60,  # fresh for the whole test
        sweep_interval=0.1,
        max_reclaims=1,
        poll_interval=0.1,
        shutdown_grace=0.2,
    ) as c:
        job = await c.enqueue(stuck)
        await wait_db(db, "SELECT lease_generation FROM cyclone_steps WHERE state = 'running'", 1)
        db.execute("UPDATE cyclone_steps SET started_at = now() - interval '1 hour'")
        await wait_db(db, "SELECT reclaims FROM cyclone_steps", 1)
        row = db.execute("SELECT error_kind, attempt FROM cyclone_steps").fetchone()
        assert row == ("timeout", 0)
        # claimed again under a new generation; time out once more: over the limit
        await wait_db(db, "SELECT lease_generation FROM cyclone_steps WHERE state = 'running'", 2)
        db.execute("UPDATE cyclone_steps SET started_at = now() - interval '1 hour'")
        run = await c.wait(job, timeout=30)
    step = db.execute(
        "SELECT state, error_kind, reclaims, attempt, lease_owner FROM cyclone_steps"
    ).fetchone()
    assert run.state == RunState.FAILED
    assert step == ("discarded", "reclaim_limit", 1, 0, None)


async def test_heartbeat_past_timeout_tells_the_handler(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Past its timeout a step's heartbeat no longer renews the lease: the handler sees
    ``ctx.cancelled`` and an async handler is cancelled."""
    holds: list[cyclone.Context] = []
    cancelled = asyncio.Event()

    @cyclone.action("stuck", timeout=600)
    async def stuck(ctx: cyclone.Context, inp: Any) -> None:
        holds.append(ctx)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with cyclone.Client(dsn, handlers=[stuck], lease_ttl=0.9, sweep_interval=60) as c:
        await c.enqueue(stuck)
        await wait_db(db, "SELECT state FROM cyclone_steps", "running")
        db.execute("UPDATE cyclone_steps SET started_at = now() - interval '1 hour'")
        await asyncio.wait_for(cancelled.wait(), 30)
    assert holds[0].cancelled


async def test_expired_lease_is_reclaimed_without_counting_an_attempt(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A lease that lapses (by the database clock) is reclaimed: available again at
    once with scheduled_at unchanged, reclaims + 1, attempt unchanged."""
    async with cyclone.Client(dsn, handlers=[]) as producer:
        await producer.enqueue("orphan")
    db.execute(
        """UPDATE cyclone_steps SET state = 'running', lease_owner = 'gone',
           lease_expiry = now() - interval '1 second', lease_generation = 1,
           started_at = now()"""
    )
    before = scalar(db, "SELECT scheduled_at FROM cyclone_steps")

    @cyclone.action("orphan")
    async def orphan(ctx: cyclone.Context, inp: Any) -> None:
        raise AssertionError("not claimed in this test")

    # A client serving another queue: its sweep recovers the step, nobody claims it.
    async with cyclone.Client(dsn, handlers=[orphan], queues={"other": 1}, sweep_interval=0.1):
        await wait_db(db, "SELECT reclaims FROM cyclone_steps", 1)
    row = db.execute(
        "SELECT state, attempt, scheduled_at, lease_owner, lease_expiry, error_kind "
        "FROM cyclone_steps"
    ).fetchone()
    assert row == ("available", 0, before, None, None, "lease_expired")


async def test_graceful_stop_finishes_quick_handlers_and_releases_slow_ones(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """At stop, a handler that ends within the grace period completes; one that does not
    is cancelled and its step given back with no attempt and no reclaim counted."""
    finish_quick = asyncio.Event()
    started = {"quick": asyncio.Event(), "slow": asyncio.Event()}

    @cyclone.step("quick")
    async def quick(ctx: cyclone.Context, inp: Any) -> str:
        started["quick"].set()
        await finish_quick.wait()
        return "finished"

    @cyclone.step("slow")
    async def slow(ctx: cyclone.Context, inp: Any) -> None:
        started["slow"].set()
        await asyncio.Event().wait()

    client = cyclone.Client(dsn, handlers=[quick, slow], shutdown_grace=0.5, lease_ttl=30)
    async with client:
        q = await client.enqueue(quick)
        s = await client.enqueue(slow)
        await asyncio.wait_for(started["quick"].wait(), 30)
        await asyncio.wait_for(started["slow"].wait(), 30)
        stopping = asyncio.create_task(client.stop())
        finish_quick.set()
        await stopping
    rows = {
        r[0]: r[1:]
        for r in db.execute(
            "SELECT run_id, state, attempt, reclaims, lease_owner FROM cyclone_steps"
        ).fetchall()
    }
    assert rows[q.run_id] == ("completed", 0, 0, None)
    assert rows[s.run_id] == ("available", 0, 0, None)


async def test_sync_handler_past_timeout_is_failed_and_fenced(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A sync handler cannot be killed: at its timeout the attempt is recorded as a
    timeout, and its late completion (with its writes) is fenced off."""
    db.execute("CREATE TABLE ledger (generation bigint)")
    release = threading.Event()

    @cyclone.step("overrun", timeout=0.3, max_attempts=1)
    def overrun(ctx: cyclone.Context, inp: Any) -> str:
        release.wait(60)
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s)", (ctx.lease_generation,))
        return "late"

    async with cyclone.Client(dsn, handlers=[overrun], shutdown_grace=5) as c:
        run = await c.wait(await c.enqueue(overrun), timeout=30)
        assert c.worker is not None
        assert c.worker.held == 1  # its slot stays busy until the thread returns
        release.set()
        worker = c.worker
        await apoll_until(lambda: asyncio.sleep(0, worker.held == 0), timeout=30)
    step = db.execute("SELECT state, error_kind, attempt, output FROM cyclone_steps").fetchone()
    assert run.state == RunState.FAILED
    assert step == (StepState.DISCARDED.value, "timeout", 1, None)
    assert scalar(db, "SELECT count(*) FROM ledger") == 0
