"""Resilience of the engine's loops (issue: heartbeats and the sweep never wait behind
handler work; a claim that errors does not stop the loop; backoff stays capped)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import psycopg

import cyclone
from cyclone.retry import error_backoff
from tests.helpers import apoll_until, scalar


async def test_heartbeats_renew_while_every_tx_slot_is_taken(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Handlers hold every completion-transaction connection open; a third waits for a
    slot. Heartbeats still renew every lease (the engine's reserve is never lent)."""
    release = asyncio.Event()
    opened = 0

    @cyclone.action("holds_tx")
    async def holds_tx(ctx: cyclone.Context, inp: Any) -> None:
        nonlocal opened
        await ctx.completion_tx()
        opened += 1
        await release.wait()

    client = cyclone.Client(
        dsn,
        handlers=[holds_tx],
        queues={"default": 3},
        tx_slots=2,
        lease_ttl=2,  # room for a stalled loop: the heartbeat is due every 0.67 s
        sweep_interval=0.1,
    )
    async with client:
        jobs = [await client.enqueue(holds_tx) for _ in range(3)]
        await apoll_until(lambda: asyncio.sleep(0, opened == 2), what="two open transactions")

        async def all_running() -> bool:
            return bool(
                scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'") == 3
            )

        await apoll_until(all_running, what="three running steps")
        first = dict(db.execute("SELECT id, lease_expiry FROM cyclone_steps").fetchall())

        async def all_renewed() -> bool:
            now = dict(db.execute("SELECT id, lease_expiry FROM cyclone_steps").fetchall())
            return all(now[i] is not None and now[i] > first[i] for i in first)

        await apoll_until(all_renewed, what="every lease renewed")
        assert opened == 2  # the third still waits for a slot
        release.set()
        runs = [await client.wait(job, timeout=30) for job in jobs]
    assert [r.state for r in runs] == [cyclone.RunState.COMPLETED] * 3
    assert scalar(db, "SELECT sum(reclaims) FROM cyclone_steps") == 0


async def test_failing_claims_do_not_stop_the_loop(dsn: str, db: psycopg.Connection[Any]) -> None:
    """While every claim errors (a column is missing), the loop keeps trying with capped
    backoff; once the database is right again the work is claimed."""

    @cyclone.step("echo")
    async def echo(ctx: cyclone.Context, inp: Any) -> Any:
        return inp

    async with cyclone.Client(dsn, handlers=[echo], poll_interval=0.1) as client:
        worker = client.worker
        assert worker is not None
        # From a thread: the ALTER waits for the lock of any engine transaction in
        # flight, which only the event loop can finish (run on the loop, it would hang).
        gone = "ALTER TABLE cyclone_steps RENAME COLUMN priority TO priority_gone"
        back = "ALTER TABLE cyclone_steps RENAME COLUMN priority_gone TO priority"
        await asyncio.to_thread(db.execute, gone)
        try:
            errors = worker.claim_errors
            await apoll_until(
                lambda: asyncio.sleep(0, worker.claim_errors >= errors + 3), what="3 failed claims"
            )
        finally:
            await asyncio.to_thread(db.execute, back)
        run = await client.wait(await client.enqueue(echo, "back"), timeout=60)
    assert run.result == "back"


def test_loop_backoff_is_finite_and_capped() -> None:
    delays = [error_backoff(n) for n in (0, 1, 5, 20, 10**6, 10**12)]
    assert all(math.isfinite(d) and 0 < d <= 10 for d in delays)
    assert delays[0] < delays[1] < delays[2]


def test_sync_client_round_trip(dsn: str) -> None:
    """SyncClient: enqueue, inspect, cancel and wait without asyncio."""
    with cyclone.SyncClient(dsn) as client:
        job = client.enqueue("nobody_runs_this", {"x": 1}, queue="elsewhere")
        many = client.enqueue_many("nobody_runs_this", [1, 2, 3])
        run = client.get_run(job)
        (step,) = client.list_steps(job)
        assert [r.id for r in client.list_runs(limit=10)] == [m.run_id for m in many[::-1]] + [
            job.run_id
        ]
        client.cancel(job)
        cancelled = client.wait(job, timeout=10)
    assert run.state == cyclone.RunState.RUNNING and run.input == {"x": 1}
    assert step.queue == "elsewhere" and step.state == cyclone.StepState.AVAILABLE
    assert cancelled.state == cyclone.RunState.CANCELLED


async def test_wait_outlives_lost_connections_and_a_client_restarts(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A wait carries on when the server drops its connections (as in a restart), and a
    stopped client can be started again."""

    @cyclone.step("later")
    async def later(ctx: cyclone.Context, inp: Any) -> str:
        return "done"

    async with cyclone.Client(dsn, poll_interval=0.1) as producer:
        job = await producer.enqueue("later")
        waiting = asyncio.create_task(producer.wait(job, timeout=60))
        await apoll_until(lambda: asyncio.sleep(0, job.run_id in producer._waiters))
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND application_name LIKE 'cyclone%'"
        )
        worker = cyclone.Client(dsn, handlers=[later])
        await worker.start()
        await worker.stop()
        async with worker:  # the same client, started again
            run = await waiting
    assert run.result == "done"
