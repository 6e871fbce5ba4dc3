"""A NOTIFY that fails after the commit is logged, never reported as a failed call.

The wakeup is made to fail for real: Cyclone connects as a role that may not execute
``pg_notify`` (revoked from PUBLIC on the test's database only; ``pg_proc`` is per
database). Every call that commits work and then announces it must return the
committed result, and a worker must still run the work by polling, recording each
outcome once.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import cyclone
from cyclone import RunState
from tests.helpers import apoll_until, scalar


@pytest.fixture
def denied_dsn(dsn: str, db: psycopg.Connection[Any]) -> Iterator[str]:
    """A DSN to the test's database as a non-superuser role that cannot NOTIFY."""
    role = f"cyclone_nonotify_{uuid.uuid4().hex[:8]}"
    ident = sql.Identifier(role)
    db.execute("REVOKE EXECUTE ON FUNCTION pg_notify(text, text) FROM PUBLIC")
    db.execute(sql.SQL("CREATE ROLE {} LOGIN").format(ident))
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(ident))
    db.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(
            ident
        )
    )
    db.execute(sql.SQL("GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {}").format(ident))
    denied = make_conninfo(dsn, user=role)
    with (
        psycopg.connect(denied, autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),  # the revoke holds for it
    ):
        conn.execute("SELECT pg_notify('cyclone_available', 'x')")
    yield denied
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
    db.execute(sql.SQL("DROP OWNED BY {}").format(ident))
    db.execute(sql.SQL("DROP ROLE {}").format(ident))


@cyclone.step("echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.action("refuse")
async def refuse(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard("no")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_async_calls_return_what_they_committed(
    denied_dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """enqueue, enqueue_many and cancel of Client succeed although their NOTIFY fails."""
    caplog.set_level(logging.WARNING, logger="cyclone")
    async with cyclone.Client(denied_dsn) as client:
        job = await client.enqueue("echo", 1, queue="a")
        many = await client.enqueue_many("echo", [2, 3], queue="b")
        await client.cancel(job)
        cancelled = await client.get_run(job)
    ids = [job.run_id, *(m.run_id for m in many)]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)", (ids,)) == 3
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE run_id = ANY(%s)", (ids,)) == 3
    assert cancelled.state == RunState.CANCELLED
    assert any("wakeup not published" in m for m in _warnings(caplog))  # it did fail


def test_sync_calls_return_what_they_committed(
    denied_dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The same for SyncClient, whose wakeup is a round trip of its own after commit."""
    caplog.set_level(logging.WARNING, logger="cyclone")
    with cyclone.SyncClient(denied_dsn) as client:
        job = client.enqueue("echo", 1, queue="a")
        many = client.enqueue_many("echo", [2, 3], queue="b")
        client.cancel(job)
        cancelled = client.get_run(job)
    ids = [job.run_id, *(m.run_id for m in many)]
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)", (ids,)) == 3
    assert cancelled.state == RunState.CANCELLED
    assert any("wakeup not published" in m for m in _warnings(caplog))


async def test_a_worker_records_each_outcome_once_by_polling(
    dsn: str, denied_dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A completion and a discard are written once and reported as what they are: no
    "completion failed", no retried write of a committed discard. (The jobs come from
    a producer that may NOTIFY; only the worker may not.)"""
    caplog.set_level(logging.INFO, logger="cyclone")
    with cyclone.SyncClient(dsn) as producer:
        jobs = [producer.enqueue("echo", 7), producer.enqueue("refuse", None)]
    async with cyclone.Client(denied_dsn, handlers=[echo, refuse], poll_interval=0.1) as worker:
        done, failed = [await worker.wait(job, timeout=30) for job in jobs]
    messages = _warnings(caplog)
    assert done.state == RunState.COMPLETED and done.result == 7
    assert failed.state == RunState.FAILED
    assert not [m for m in messages if "completion failed" in m or "write failed" in m]
    assert len([m for m in messages if "discarded" in m]) == 1
    attempts = scalar(db, "SELECT attempt FROM cyclone_steps WHERE run_id = %s", (failed.id,))
    assert attempts == 1


async def test_a_sweep_discard_is_counted_once(
    denied_dsn: str, db: psycopg.Connection[Any]
) -> None:
    """The sweep's discard of a step past its reclaims returns normally."""
    async with cyclone.Client(
        denied_dsn, handlers=[echo], max_reclaims=0, sweep_interval=3600, poll_interval=3600
    ) as worker:
        sweeper = worker.sweeper
        assert sweeper is not None
        await apoll_until(lambda: asyncio.sleep(0, sweeper.passes), what="first sweep")
        # not due for a day: only the UPDATE below makes it "running"
        job = await worker.enqueue("echo", 1, scheduled_at=timedelta(days=1))
        db.execute(
            "UPDATE cyclone_steps SET state = 'running', lease_owner = 'gone', "
            "lease_generation = 1, lease_expiry = now() - interval '1 s', started_at = now() "
            "WHERE id = %s",
            (job.step_id,),
        )
        result = await sweeper.sweep_once()
        run = await worker.get_run(job)
    assert result.discarded == 1
    assert run.state == RunState.FAILED
