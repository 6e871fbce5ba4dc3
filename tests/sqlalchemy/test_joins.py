"""*_tx calls on SQLAlchemy sessions and connections: the runs exist exactly when the
session's (or connection's) transaction commits, a session's commit publishes the
wakeups, tracking works with a session, and other objects are refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

import cyclone
from cyclone.records import RunRef
from tests.helpers import scalar
from tests.sqlalchemy.conftest import Order


@cyclone.step("sa_double")
async def double(ctx: cyclone.Context, inp: int) -> int:
    return inp * 2


def flow() -> cyclone.Workflow:
    wf = cyclone.Workflow("sa_flow")
    wf.result(wf.node("only", double))
    return wf


async def _results(runs: list[RunRef], dsn: str) -> list[Any]:
    """Run a worker until every run in ``runs`` ended; their results."""
    async with cyclone.Client(dsn, handlers=[double], workflows=[flow()]) as worker:
        ended = [await worker.wait(run, timeout=30) for run in runs]
    assert [run.state for run in ended] == [cyclone.RunState.COMPLETED] * len(runs)
    return [run.result for run in ended]


def _items(db: psycopg.Connection[Any]) -> list[str]:
    return [row[0] for row in db.execute("SELECT item FROM shop_orders ORDER BY id")]


async def test_session_tx_calls_commit_with_the_session(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """enqueue_tx, enqueue_many_tx and submit_tx on a Session: committed with the
    session's ORM writes (and run by a worker), or rolled back with them."""
    with cyclone.SyncClient(dsn) as client, Session(engine) as session:
        session.add(Order(item="kept"))
        job = client.enqueue_tx(session, double, 1)
        many = client.enqueue_many_tx(session, double, [2, 3])
        submitted = client.submit_tx(session, flow(), 4)
        session.commit()
        session.add(Order(item="dropped"))
        lost = client.enqueue_tx(session, double, 5)
        lost_many = client.enqueue_many_tx(session, double, [6])
        lost_flow = client.submit_tx(session, flow(), 7)
        assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 4
        session.rollback()
    assert await _results([job, *many, submitted], dsn) == [2, 4, 6, 8]
    assert _items(db) == ["kept"]
    ids = [lost.run_id, lost_many[0].run_id, lost_flow.run_id]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)", (ids,)) == 0
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 4


async def test_connection_tx_calls_commit_with_the_connection(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """The same on a Connection, whether a transaction is already begun on it or the
    call begins it (the connection's commit() then commits the run)."""
    with cyclone.SyncClient(dsn) as client:
        with engine.connect() as conn:  # no transaction yet: the call begins one
            job = client.enqueue_tx(conn, double, 1)
            assert conn.in_transaction()
            conn.execute(insert(Order).values(item="kept"))
            conn.commit()
        with engine.begin() as conn:
            many = client.enqueue_many_tx(conn, double, [2, 3])
            submitted = client.submit_tx(conn, flow(), 4)
        with engine.connect() as conn:
            conn.execute(insert(Order).values(item="dropped"))
            lost = client.enqueue_tx(conn, double, 5)
            lost_flow = client.submit_tx(conn, flow(), 6)
            conn.rollback()
    assert await _results([job, *many, submitted], dsn) == [2, 4, 6, 8]
    assert _items(db) == ["kept"]
    ids = [lost.run_id, lost_flow.run_id]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)", (ids,)) == 0


async def test_async_session_and_connection_join_with_client(
    dsn: str, db: psycopg.Connection[Any], async_engine: AsyncEngine
) -> None:
    """Client takes an AsyncSession or an AsyncConnection: committed runs are run by
    the worker, rolled back ones never exist."""
    async with cyclone.Client(dsn, handlers=[double], workflows=[flow()]) as client:
        async with AsyncSession(async_engine) as session:
            session.add(Order(item="kept"))
            job = await client.enqueue_tx(session, double, 1)
            many = await client.enqueue_many_tx(session, double, [2, 3])
            submitted = await client.submit_tx(session, flow(), 4)
            await session.commit()
            session.add(Order(item="dropped"))
            lost = await client.enqueue_tx(session, double, 5)
            await session.rollback()
        async with async_engine.connect() as conn:
            conn_job = await client.enqueue_tx(conn, double, 6)
            await conn.execute(insert(Order).values(item="by connection"))
            await conn.commit()
            lost_conn = await client.submit_tx(conn, flow(), 7)
            await conn.rollback()
        committed: list[RunRef] = [job, *many, submitted, conn_job]
        runs = [await client.wait(run, timeout=30) for run in committed]
        async with AsyncSession(async_engine) as session:
            items = (await session.scalars(select(Order.item).order_by(Order.id))).all()
    assert [run.result for run in runs] == [2, 4, 6, 8, 12]
    assert items == ["kept", "by connection"]
    ids = [lost.run_id, lost_conn.run_id]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)", (ids,)) == 0


def test_session_commit_publishes_the_wakeups_rollback_none(
    dsn: str, engine: Engine, heard: Callable[[], list[str]]
) -> None:
    """A session's wakeups are sent once it commits (not before), never for a rollback,
    not even at a later commit of the same session; a Connection sends none (its work is
    found by the poll, or through track_wakeups)."""
    with cyclone.SyncClient(dsn) as client, Session(engine) as session:
        client.enqueue_tx(session, double, 1, queue="sa_a")
        client.enqueue_many_tx(session, double, [1], queue="sa_b")
        assert heard() == []
        session.commit()
        assert sorted(heard()) == ["sa_a", "sa_b"]
        client.enqueue_tx(session, double, 2, queue="sa_c")
        session.rollback()
        session.add(Order(item="later"))
        session.commit()
        assert heard() == []
        with engine.begin() as conn:
            client.enqueue_tx(conn, double, 3, queue="sa_d")
        assert heard() == []


def test_a_savepoint_does_not_publish_before_the_commit(
    dsn: str, engine: Engine, heard: Callable[[], list[str]]
) -> None:
    """Releasing a savepoint (SQLAlchemy calls after_commit for it) commits nothing:
    the wakeup waits for the real commit, and a rollback after it sends none."""
    with cyclone.SyncClient(dsn) as client, Session(engine) as session:
        client.enqueue_tx(session, double, 1, queue="sa_a")
        with session.begin_nested():
            session.add(Order(item="in a savepoint"))
        assert heard() == []
        session.rollback()
        assert heard() == []
        client.enqueue_tx(session, double, 2, queue="sa_b")
        with session.begin_nested():
            session.add(Order(item="in a savepoint"))
        assert heard() == []
        session.commit()
        assert heard() == ["sa_b"]


async def test_a_client_not_yet_opened_publishes_after_the_commit(
    dsn: str, async_engine: AsyncEngine, heard: Callable[[], list[str]]
) -> None:
    """A *_tx call is the first use of a Client: the wakeup still goes out at commit."""
    client = cyclone.Client(dsn)
    try:
        async with AsyncSession(async_engine) as session:
            await client.enqueue_tx(session, double, 1, queue="sa_first")
            await session.commit()
        assert client._publisher is not None
        await client._publisher.flush()
        assert heard() == ["sa_first"]
    finally:
        await client.stop()


async def test_async_session_commit_publishes_the_wakeups(
    dsn: str, async_engine: AsyncEngine, heard: Callable[[], list[str]]
) -> None:
    """The same through Client and an AsyncSession (the publisher sends them)."""
    async with cyclone.Client(dsn) as client:
        publisher = client._publisher
        async with AsyncSession(async_engine) as session:
            await client.enqueue_tx(session, double, 1, queue="sa_a")
            assert publisher is not None
            await publisher.flush()
            assert heard() == []
            await session.commit()
            await publisher.flush()
            assert heard() == ["sa_a"]
            await client.enqueue_tx(session, double, 2, queue="sa_b")
            await session.rollback()
            await session.commit()
            await publisher.flush()
            assert heard() == []


def test_track_wakeups_with_a_session(
    dsn: str, engine: Engine, heard: Callable[[], list[str]]
) -> None:
    """track_wakeups(session): the tx calls record their queues in the tracker (nothing
    is sent at the commit) and publish_wakeups sends them."""
    with cyclone.SyncClient(dsn) as client, Session(engine) as session:
        tracker = client.track_wakeups(session)
        assert client.track_wakeups(session) is tracker
        client.enqueue_tx(session, double, 1, queue="sa_t")
        client.submit_tx(session, flow(), 2)
        assert tracker.queues == {"sa_t", "default"}
        session.commit()
        assert heard() == []
        client.publish_wakeups(tracker)
        assert sorted(heard()) == ["default", "sa_t"]
        assert tracker.queues == set()


def test_other_objects_are_refused_naming_them(
    dsn: str, db: psycopg.Connection[Any], engine: Engine
) -> None:
    """A session or connection on another dialect, a closed connection, a plain object:
    a ValidationError that names it, and nothing written."""
    sqlite = create_engine("sqlite://")
    with cyclone.SyncClient(dsn) as client:
        with Session(sqlite) as session:
            with pytest.raises(cyclone.ValidationError, match=r"sqlite\+pysqlite dialect"):
                client.enqueue_tx(session, double, 1)
            with pytest.raises(cyclone.ValidationError, match="Session object"):
                client.submit_tx(session, flow(), 1)
        with sqlite.connect() as conn, pytest.raises(cyclone.ValidationError, match="sqlite"):
            client.enqueue_many_tx(conn, double, [1])
        with pytest.raises(cyclone.ValidationError, match="got <object object"):
            client.enqueue_tx(object(), double, 1)
        conn = engine.connect()
        conn.close()
        with pytest.raises(cyclone.ValidationError, match="closed"):
            client.enqueue_tx(conn, double, 1)
    sqlite.dispose()
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0


async def test_client_refuses_sync_sessions_and_closed_connections(
    dsn: str, db: psycopg.Connection[Any], engine: Engine, async_engine: AsyncEngine
) -> None:
    """Client takes only the asyncio forms; a sync Session or a closed AsyncConnection
    is refused by name, and nothing is written."""
    async with cyclone.Client(dsn) as client:
        with Session(engine) as session, pytest.raises(cyclone.ValidationError, match="Session"):
            await client.enqueue_tx(session, double, 1)
        conn = await async_engine.connect()
        await conn.close()
        with pytest.raises(cyclone.ValidationError, match=r"AsyncConnection.*closed"):
            await client.enqueue_tx(conn, double, 1)
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0


def test_a_client_closed_before_the_commit_warns_in_one_line(
    dsn: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """The run commits with the session; its wakeup cannot go out through a client
    closed meanwhile: one warning line (a poll finds the work), no error, no traceback."""
    with Session(engine) as session:
        with cyclone.SyncClient(dsn) as client:
            job = client.enqueue_tx(session, double, 1, queue="sa_closed")
        session.commit()
    warned = [r for r in caplog.records if "after a caller's commit not sent" in r.getMessage()]
    assert [(r.levelname, r.exc_info) for r in warned] == [("WARNING", None)]
    assert "sa_closed" in warned[0].getMessage()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    with psycopg.connect(dsn) as conn:
        assert scalar(conn, "SELECT count(*) FROM cyclone_runs WHERE id = %s", (job.run_id,)) == 1
