"""The completion transaction: its boundaries belong to the worker, its failures are
failed attempts, and its slots are never lost (docs/design.md, The completion transaction)."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.notify import runs_in_payload
from tests.helpers import apoll_until, scalar


@pytest.fixture
def ledger(db: psycopg.Connection[Any]) -> None:
    db.execute("CREATE TABLE ledger (run_id bigint, item text)")


async def test_interrupted_handler_gives_its_slot_back(
    dsn: str, db: psycopg.Connection[Any], ledger: None, caplog: pytest.LogCaptureFixture
) -> None:
    """A sync handler that opened its transaction and then stops with
    ctx.raise_if_cancelled() (at its timeout) returns the only tx slot: the next
    handler still gets a transaction. The LeaseLost it raised is the worker's to drop,
    not an exception left in a task nobody awaits."""

    @cyclone.action("loops", timeout=0.3, max_attempts=1)
    def loops(ctx: cyclone.Context, inp: Any) -> None:
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s, 'loops')", (ctx.run_id,))
        while True:
            ctx.raise_if_cancelled()
            time.sleep(0.01)

    @cyclone.action("writes")
    def writes(ctx: cyclone.Context, inp: Any) -> None:
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s, 'writes')", (ctx.run_id,))

    async with cyclone.Client(dsn, handlers=[loops, writes], tx_slots=1) as client:
        first = await client.wait(await client.enqueue(loops), timeout=30)
        second = await client.wait(await client.enqueue(writes), timeout=30)
    assert first.state == cyclone.RunState.FAILED
    assert second.state == cyclone.RunState.COMPLETED
    assert db.execute("SELECT item FROM ledger").fetchall() == [("writes",)]
    gc.collect()  # a task whose exception was never retrieved reports it when collected
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_handler_transaction_blocks_are_savepoints(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    """``with tx.transaction():`` inside a handler is a savepoint of the completion
    transaction: when the handler then fails, nothing it wrote commits."""

    @cyclone.action("nested", max_attempts=1)
    async def nested(ctx: cyclone.Context, inp: Any) -> None:
        tx = await ctx.completion_tx()
        async with tx.transaction():
            await tx.execute("INSERT INTO ledger VALUES (%s, 'nested')", (ctx.run_id,))
        raise RuntimeError("after the block")

    @cyclone.action("commits_itself", max_attempts=1)
    def commits_itself(ctx: cyclone.Context, inp: Any) -> None:
        tx = ctx.completion_tx()
        tx.execute("INSERT INTO ledger VALUES (%s, 'own commit')", (ctx.run_id,))
        tx.commit()

    async with cyclone.Client(dsn, handlers=[nested, commits_itself]) as client:
        runs = [
            await client.wait(await client.enqueue(kind), timeout=30)
            for kind in (nested, commits_itself)
        ]
        steps = [(await client.list_steps(run))[0] for run in runs]
    assert [r.state for r in runs] == [cyclone.RunState.FAILED] * 2
    assert "forbidden" in (steps[1].error or "")
    assert scalar(db, "SELECT count(*) FROM ledger") == 0


async def test_a_commit_that_fails_is_a_failed_attempt(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A deferred constraint that fails at COMMIT: the attempt is counted with the
    database's error, not left to the sweep as a lost lease."""
    db.execute(
        "CREATE TABLE receipts (order_id int, CONSTRAINT one_receipt UNIQUE (order_id) "
        "DEFERRABLE INITIALLY DEFERRED)"
    )

    @cyclone.action("receipt", max_attempts=2, retry=cyclone.RetryPolicy(base=0.05, jitter=0))
    async def receipt(ctx: cyclone.Context, inp: Any) -> None:
        tx = await ctx.completion_tx()
        await tx.execute("INSERT INTO receipts VALUES (1), (1)")

    async with cyclone.Client(dsn, handlers=[receipt]) as client:
        run = await client.wait(await client.enqueue(receipt), timeout=30)
        (step,) = await client.list_steps(run)
    assert run.state == cyclone.RunState.FAILED
    assert (step.attempt, step.reclaims, step.error_kind) == (2, 0, "exception")
    assert "one_receipt" in (step.error or "")
    assert scalar(db, "SELECT count(*) FROM receipts") == 0


async def test_sync_and_async_kinds_share_the_transaction_budget(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    """With both flavours and the smallest budget, handlers wait for a connection of
    their flavour as long as needed instead of failing on a pool timeout."""

    @cyclone.action("slow_async")
    async def slow_async(ctx: cyclone.Context, inp: Any) -> None:
        tx = await ctx.completion_tx()
        await tx.execute("INSERT INTO ledger VALUES (%s, 'async')", (ctx.run_id,))
        await asyncio.sleep(0.3)

    @cyclone.action("slow_sync")
    def slow_sync(ctx: cyclone.Context, inp: Any) -> None:
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s, 'sync')", (ctx.run_id,))
        time.sleep(0.3)

    client = cyclone.Client(
        dsn, handlers=[slow_async, slow_sync], queues={"default": 6}, tx_slots=2, max_connections=8
    )
    async with client:
        jobs = [await client.enqueue(k) for k in (slow_async, slow_sync) * 3]
        runs = [await client.wait(job, timeout=60) for job in jobs]
    assert [r.state for r in runs] == [cyclone.RunState.COMPLETED] * 6
    assert scalar(db, "SELECT count(*) FROM ledger") == 6
    with pytest.raises(cyclone.PoolTooSmallError, match="need at least 8"):
        cyclone.Client(dsn, handlers=[slow_async, slow_sync], tx_slots=1, max_connections=7)


async def test_a_connection_ended_while_pooled_costs_no_attempt(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    """The server ends the sessions resting in the handler pools (a restart, a network
    fault, pg_terminate_backend): the next completion transactions take fresh
    connections instead of failing their step's only attempt."""

    @cyclone.action("writes_async", max_attempts=1)
    async def writes_async(ctx: cyclone.Context, inp: Any) -> None:
        tx = await ctx.completion_tx()
        await tx.execute("INSERT INTO ledger VALUES (%s, 'async')", (ctx.run_id,))

    @cyclone.action("writes_sync", max_attempts=1)
    def writes_sync(ctx: cyclone.Context, inp: Any) -> None:
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s, 'sync')", (ctx.run_id,))

    kinds = [writes_async, writes_sync]
    async with cyclone.Client(dsn, handlers=kinds) as client:
        for kind in kinds:  # each handler pool now holds an idle connection
            await client.wait(await client.enqueue(kind), timeout=30)
        ended = [
            pid
            for (pid,) in db.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'cyclone-tx' AND state = 'idle' AND query = 'COMMIT'"
            ).fetchall()
        ]
        assert len(ended) == 2
        db.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (ended,))
        await apoll_until(
            lambda: asyncio.to_thread(
                scalar,
                db,
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY(%s)",
                (ended,),
            ),
            what="the sessions to end",
        )
        runs = [await client.wait(await client.enqueue(kind), timeout=30) for kind in kinds]
    assert [r.state for r in runs] == [cyclone.RunState.COMPLETED] * 2
    assert scalar(db, "SELECT count(*) FROM ledger") == 4


async def test_a_sync_handler_committing_in_its_transaction_announces_its_run(
    dsn: str, db: psycopg.Connection[Any], ledger: None
) -> None:
    """A plain ``def`` handler that completes inside its completion transaction has its
    finished run announced on ``cyclone_run_done`` after the commit."""

    @cyclone.action("announces_sync", max_attempts=1)
    def announces_sync(ctx: cyclone.Context, inp: Any) -> None:
        ctx.completion_tx().execute("INSERT INTO ledger VALUES (%s, 'sync')", (ctx.run_id,))

    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN cyclone_run_done")
        async with cyclone.Client(dsn, handlers=[announces_sync]) as client:
            job = await client.enqueue(announces_sync)
            run = await client.wait(job, timeout=30)
        # stop() flushed the publisher: every announcement is sent; a marker ends the read
        db.execute("SELECT pg_notify('cyclone_run_done', 'marker')")
        heard: set[int] = set()
        for note in listener.notifies(timeout=30):
            if note.payload == "marker":
                break
            heard |= set(runs_in_payload(note.payload))
    assert run.state == cyclone.RunState.COMPLETED
    assert scalar(db, "SELECT count(*) FROM ledger") == 1
    assert job.run_id in heard
