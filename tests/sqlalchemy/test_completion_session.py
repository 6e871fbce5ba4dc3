"""ctx.completion_session(): ORM writes of sync and async handlers commit with the
step or not at all; the worker flushes and commits the session, the handler may not;
the session leaves the pooled connection as it found it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

import cyclone
from cyclone.records import RunRef
from tests.helpers import apoll_until, scalar
from tests.sqlalchemy.conftest import Customer, Order

FAST_RETRY = cyclone.RetryPolicy(base=0.05, jitter=0)


@cyclone.action("sa_sync_order", max_attempts=1)
def sync_order(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    session = ctx.completion_session()
    assert isinstance(session, Session)
    assert ctx.completion_session() is session
    session.add(Order(item=inp["item"], run_id=ctx.run_id))
    if inp.get("raise"):
        raise RuntimeError("after session.add")
    if inp.get("commit"):
        session.commit()


@cyclone.action("sa_async_order", max_attempts=1)
async def async_order(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    session = await ctx.completion_session()
    assert isinstance(session, AsyncSession)
    assert await ctx.completion_session() is session
    session.add(Order(item=inp["item"], run_id=ctx.run_id))
    if inp.get("raise"):
        raise RuntimeError("after session.add")
    if inp.get("commit"):
        await session.commit()


async def _ended(client: cyclone.Client, run: RunRef) -> tuple[cyclone.Run, cyclone.Step]:
    ended = await client.wait(run, timeout=30)
    (step,) = await client.list_steps(ended)
    return ended, step


def _orders(db: psycopg.Connection[Any]) -> list[tuple[str, int | None]]:
    return db.execute("SELECT item, run_id FROM shop_orders ORDER BY id").fetchall()


@pytest.mark.parametrize("kind", [sync_order, async_order], ids=["sync", "async"])
async def test_orm_insert_commits_with_the_step_or_not_at_all(
    dsn: str, db: psycopg.Connection[Any], engine: Engine, kind: Any
) -> None:
    """An ORM insert commits with the step; a handler that raises after session.add
    leaves no row; a handler's own session.commit() raises StateError, which fails the
    step as any exception of the handler would, and nothing it added is written."""
    async with cyclone.Client(dsn, handlers=[kind]) as client:
        kept, _ = await _ended(client, await client.enqueue(kind, {"item": "kept"}))
        raised, raised_step = await _ended(
            client, await client.enqueue(kind, {"item": "raised", "raise": True})
        )
        committed, committed_step = await _ended(
            client, await client.enqueue(kind, {"item": "committed", "commit": True})
        )
    assert kept.state == cyclone.RunState.COMPLETED
    assert _orders(db) == [("kept", kept.id)]
    assert raised.state == cyclone.RunState.FAILED
    assert raised_step.error == "RuntimeError: after session.add"
    assert committed.state == cyclone.RunState.FAILED
    assert (committed_step.error or "").startswith(
        "StateError: the completion session is committed by the worker"
    )
    assert committed_step.error_kind == "exception"


@cyclone.step("sa_relations")
def relations(ctx: cyclone.Context, inp: Any) -> int:
    """Reads, an explicit flush for a generated key, a nested block, a rollback of
    the session's own writes next to a completion_tx() write, and enqueue_completion."""
    session: Session = ctx.completion_session()
    customer = session.scalars(select(Customer).where(Customer.name == "ada")).one()
    customer.name = "ada lovelace"
    fresh = Customer(name="grace")
    session.add(fresh)
    session.flush()  # fresh.id is known from here
    with session.begin_nested():
        session.add(Order(item="nested", customer_id=fresh.id))
    session.add(Order(item="undone"))
    session.flush()
    session.rollback()  # back to the session's savepoint: "undone", fresh and the rename go
    ctx.completion_tx().execute("INSERT INTO shop_orders (item) VALUES ('raw')")
    session.add(Order(item="after rollback", customer_id=customer.id, run_id=ctx.run_id))
    ctx.enqueue_completion(sync_order, {"item": "child"})
    return customer.id


async def test_session_rollback_undoes_its_own_writes_only(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """The session's transaction is a savepoint of the completion transaction: its
    rollback undoes what it wrote, not the handler's other writes there; what it writes
    afterwards commits with the step, as does a run enqueued in the same transaction."""
    with Session(engine) as session:
        session.add(Customer(name="ada"))
        session.commit()
    async with cyclone.Client(dsn, handlers=[relations, sync_order]) as client:
        run, _ = await _ended(client, await client.enqueue(relations))
        (child,) = await client.list_runs(workflow="sa_sync_order")
        assert (await client.wait(child, timeout=30)).state == cyclone.RunState.COMPLETED
    assert run.state == cyclone.RunState.COMPLETED
    assert db.execute("SELECT name FROM shop_customers").fetchall() == [("ada",)]
    ada = scalar(db, "SELECT id FROM shop_customers WHERE name = 'ada'")
    assert run.result == ada
    assert db.execute("SELECT item, customer_id FROM shop_orders ORDER BY id").fetchall() == [
        ("raw", None),
        ("after rollback", ada),
        ("child", None),
    ]


@cyclone.action("sa_duplicate", max_attempts=2, retry=FAST_RETRY)
def duplicate(ctx: cyclone.Context, inp: Any) -> None:
    session = ctx.completion_session()
    session.add(Order(item="fine"))
    session.add(Order(item="taken"))  # flushed by the worker: a unique violation


@cyclone.action("sa_duplicate_async", max_attempts=1)
async def duplicate_async(ctx: cyclone.Context, inp: Any) -> None:
    session = await ctx.completion_session()
    session.add(Order(item="taken"))


async def test_a_flush_that_fails_is_the_handlers_failure(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """What the handler left to flush fails at the worker's flush: the attempt fails
    with the database's error and is retried, and its transaction rolls back."""
    db.execute("INSERT INTO shop_orders (item) VALUES ('taken')")
    async with cyclone.Client(dsn, handlers=[duplicate, duplicate_async]) as client:
        run, step = await _ended(client, await client.enqueue(duplicate))
        run_async, step_async = await _ended(client, await client.enqueue(duplicate_async))
    assert (run.state, run_async.state) == (cyclone.RunState.FAILED,) * 2
    assert (step.attempt, step.error_kind) == (2, "exception")
    assert (step.error or "").startswith("IntegrityError")
    assert "shop_orders_item_key" in (step.error or "")
    assert "shop_orders_item_key" in (step_async.error or "")
    assert _orders(db) == [("taken", None)]


@cyclone.action("sa_overruns", timeout=0.3, max_attempts=1)
def overruns(ctx: cyclone.Context, inp: Any) -> None:
    session: Session = ctx.completion_session()
    session.add(Order(item="late"))
    session.flush()
    while not ctx.cancelled:
        time.sleep(0.01)


async def test_a_sync_handler_past_its_timeout_leaves_no_row_and_its_slot(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """The engine ends the transaction of a sync handler that overran its timeout: the
    row its session flushed is gone, and the only slot serves the next session step."""
    async with cyclone.Client(dsn, handlers=[overruns, sync_order], tx_slots=1) as client:
        late, late_step = await _ended(client, await client.enqueue(overruns))
        after, _ = await _ended(client, await client.enqueue(sync_order, {"item": "next"}))
    assert (late.state, late_step.error_kind) == (cyclone.RunState.FAILED, "timeout")
    assert after.state == cyclone.RunState.COMPLETED
    assert _orders(db) == [("next", after.id)]


ENGINES: list[int] = []


@cyclone.action("sa_engine_sync")
def engine_sync(ctx: cyclone.Context, inp: int) -> None:
    session = ctx.completion_session()
    ENGINES.append(id(session.get_bind().engine))
    session.add(Order(item=f"sync {inp}"))


@cyclone.action("sa_engine_async")
async def engine_async(ctx: cyclone.Context, inp: int) -> None:
    session = await ctx.completion_session()
    ENGINES.append(id(session.sync_session.get_bind().engine))
    session.add(Order(item=f"async {inp}"))


@cyclone.action("sa_plain_tx")
async def plain_tx(ctx: cyclone.Context, inp: int) -> None:
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO shop_orders (item) VALUES (%s)", (f"plain {inp}",))


async def test_one_engine_per_pool_and_the_connection_comes_back_clean(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """Steps share one engine per handler pool; with one connection in each handler
    pool every step reuses it, and completion_tx() steps that follow session steps find
    it idle, with nothing left open by SQLAlchemy."""
    ENGINES.clear()
    kinds = [engine_sync, engine_async, plain_tx]
    client = cyclone.Client(dsn, handlers=kinds, tx_slots=2, max_connections=8)
    async with client:
        for number in range(3):
            for kind in kinds:
                run, step = await _ended(client, await client.enqueue(kind, number))
                assert run.state == cyclone.RunState.COMPLETED, step.error
    assert len(ENGINES) == 6
    assert len(set(ENGINES[0::2])) == 1 and len(set(ENGINES[1::2])) == 1
    assert scalar(db, "SELECT count(*) FROM shop_orders") == 9
    idle = scalar(
        db,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%%'",
    )
    assert idle == 0


@cyclone.action("sa_inner_enqueue")
def inner_enqueue(ctx: cyclone.Context, inp: Any) -> None:
    session = ctx.completion_session()
    PRODUCER[0].enqueue_tx(session, sync_order, {"item": "inner"}, queue="sa_in")
    STARTED.set()
    assert PROCEED.wait(30)


PRODUCER: list[cyclone.SyncClient] = []
STARTED, PROCEED = threading.Event(), threading.Event()


async def test_tx_call_on_the_completion_session_wakes_after_the_step_commits(
    dsn: str, db: psycopg.Connection[Any], engine: Engine, heard: Callable[[], list[str]]
) -> None:
    """enqueue_tx on the completion session: its wakeup is sent after the completion
    transaction commits, not when the worker commits the session (a wakeup before the
    commit would send workers to find nothing). The commit is held back by a lock on
    the run's row while the listener is read."""
    STARTED.clear()
    PROCEED.clear()
    async with cyclone.Client(dsn, handlers=[inner_enqueue]) as client:
        with cyclone.SyncClient(dsn) as producer:
            PRODUCER[:] = [producer]
            job = await client.enqueue(inner_enqueue)
            await apoll_until(lambda: asyncio.sleep(0, STARTED.is_set()), what="handler")
            async with await psycopg.AsyncConnection.connect(dsn) as blocker:
                await blocker.execute(
                    "SELECT 1 FROM cyclone_runs WHERE id = %s FOR UPDATE", (job.run_id,)
                )
                PROCEED.set()
                await apoll_until(
                    lambda: _waits_for_lock(blocker), what="the completion waiting on the row"
                )
                assert "sa_in" not in heard()  # (the enqueue above woke "default")
                await blocker.rollback()
            run = await client.wait(job, timeout=30)
            assert run.state == cyclone.RunState.COMPLETED
            got: list[str] = []  # the thread sends it just after the commit: wait for it

            async def inner_woken() -> bool:
                got.extend(heard())
                return "sa_in" in got

            await apoll_until(inner_woken, what="the wakeup of the inner run")
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE workflow = 'sa_sync_order'") == 1


async def _waits_for_lock(blocker: psycopg.AsyncConnection[Any]) -> bool:
    cur = await blocker.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'"
    )
    row = await cur.fetchone()
    return row is not None and row[0] > 0


@pytest.mark.slow
def test_importing_cyclone_imports_no_sqlalchemy() -> None:
    """The adapter is imported on demand only: by a tx call on a SQLAlchemy object, or
    by ctx.completion_session()."""
    code = "import sys, cyclone, cyclone.context; print('sqlalchemy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@cyclone.action("sa_mixed_block", max_attempts=1)
def mixed_block(ctx: cyclone.Context, inp: Any) -> None:
    conn = ctx.completion_tx()
    session = ctx.completion_session()
    with conn.transaction():  # a savepoint of the handler's own
        session.execute(insert(Order).values(item="in the block"))  # the session's first
    session.add(Order(item="after the block"))


@cyclone.action("sa_mixed_block_async", max_attempts=1)
async def mixed_block_async(ctx: cyclone.Context, inp: Any) -> None:
    conn = await ctx.completion_tx()
    session = await ctx.completion_session()
    async with conn.transaction():
        await session.execute(insert(Order).values(item="in the block"))
    session.add(Order(item="after the block"))


@pytest.mark.parametrize("kind", [mixed_block, mixed_block_async], ids=["sync", "async"])
async def test_a_session_first_used_inside_a_completion_tx_block_commits(
    dsn: str, db: psycopg.Connection[Any], engine: Engine, kind: Any
) -> None:
    """The session's savepoint is opened when the session is made, at the transaction's
    top level: a first statement inside a block of the handler's own (which ends its
    own savepoint) does not take the session's savepoint with it."""
    async with cyclone.Client(dsn, handlers=[kind]) as client:
        run, step = await _ended(client, await client.enqueue(kind))
    assert run.state == cyclone.RunState.COMPLETED, step.error
    assert [item for item, _ in _orders(db)] == ["in the block", "after the block"]
