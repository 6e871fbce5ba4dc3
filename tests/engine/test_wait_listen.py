"""The listener hears cyclone_run_done only while a wait is pending.

docs/concepts.md, Wakeups and polling: a client LISTENs on the run-done
channel while one of its waits is pending and UNLISTENs a while (notify.RUN_DONE_LINGER)
after the last one ended, so a worker nobody waits on decodes no run-done
notifications; a wait reads its run again once the LISTEN is in place, so a run that
ends meanwhile is not missed; a reconnected listener LISTENs again only while waits are
pending. Every wait here has a 60 s poll: only a notification, or the read after the
LISTEN, can end it within the test's deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from cyclone.control import cancel_stmts
from cyclone.dbio import batch_sync
from cyclone.notify import AVAILABLE, RUN_DONE, Listener
from cyclone.records import Run
from tests.helpers import apoll_until


@cyclone.step("echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def _listener(client: cyclone.Client) -> Listener:
    listener = client._listener
    assert listener is not None
    return listener


async def _until(condition: Any, what: str) -> None:
    await apoll_until(lambda: asyncio.sleep(0, condition()), what=what)


def _count_reads(monkeypatch: pytest.MonkeyPatch, client: cyclone.Client) -> list[Run]:
    """Record every run ``client.get_run`` returned (the reads of ``wait``)."""
    reads: list[Run] = []
    real = client.get_run

    async def counted(run: Any) -> Run:
        result = await real(run)
        reads.append(result)
        return result

    monkeypatch.setattr(client, "get_run", counted)
    return reads


def _kill_listener(db: psycopg.Connection[Any]) -> None:
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = 'cyclone-listen' AND datname = current_database()"
    )


async def test_a_worker_nobody_waits_on_hears_no_run_done(
    dsn: str, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no wait pending a worker's listener hears only cyclone_available: a run-done
    NOTIFY sent before a work NOTIFY (both from one session, delivered in order) never
    arrives. A pending wait LISTENs, returns on the notification, and the channel is
    UNLISTENed after the wait."""
    async with (
        cyclone.Client(dsn, handlers=[echo], poll_interval=60) as worker,
        cyclone.Client(dsn) as producer,
    ):
        await _until(lambda: worker.listening, "LISTEN up")
        listener = _listener(worker)
        assert listener.channels == {AVAILABLE}
        heard = dict(listener.received)
        db.execute("""SELECT pg_notify('cyclone_run_done', '{"runs": [1]}')""")
        db.execute("""SELECT pg_notify('cyclone_available', '{"queue": "elsewhere"}')""")
        await _until(lambda: listener.received[AVAILABLE] > heard[AVAILABLE], "work NOTIFY")
        assert listener.received[RUN_DONE] == heard[RUN_DONE]

        job = await producer.enqueue("nobody_runs_this", 1)
        reads = _count_reads(monkeypatch, worker)
        waiting = asyncio.create_task(worker.wait(job, timeout=600))
        await _until(lambda: RUN_DONE in listener.channels, "LISTEN cyclone_run_done")
        await _until(lambda: len(reads) >= 2, "the read after the LISTEN")
        await producer.cancel(job)  # publishes run-done after its commit
        run = await asyncio.wait_for(waiting, 30)
        assert run.state == RunState.CANCELLED
        assert listener.received[RUN_DONE] > heard[RUN_DONE]
        await _until(lambda: RUN_DONE not in listener.channels, "UNLISTEN cyclone_run_done")
        assert listener.channels == {AVAILABLE}


async def test_a_run_that_ends_before_the_listen_is_seen_by_the_read_after_it(
    dsn: str, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wait's first read finds the run active; the run then ends without any NOTIFY
    (written by hand) while the LISTEN is still being set up. The wait reads the run
    again once the LISTEN is in place and returns, long before its poll."""
    async with cyclone.Client(dsn, poll_interval=60) as client:
        job = await client.enqueue("nobody_runs_this", 1)
        real = client.get_run
        reads: list[Run] = []

        async def first_read_then_cancel(run: Any) -> Run:
            result = await real(run)
            if not reads:
                batch_sync(db, cancel_stmts(job.run_id), transaction=True)  # no NOTIFY
            reads.append(result)
            return result

        monkeypatch.setattr(client, "get_run", first_read_then_cancel)
        run = await asyncio.wait_for(client.wait(job, timeout=600), 30)
    assert reads[0].state == RunState.RUNNING
    assert run.state == RunState.CANCELLED


async def test_a_reconnected_listener_listens_for_run_done_only_with_waits_pending(
    dsn: str, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LISTEN connection is killed: reconnected without a wait pending it LISTENs on
    cyclone_available only; killed again while a wait is pending it LISTENs on both,
    and the wait returns on the notification."""
    async with (
        cyclone.Client(dsn, handlers=[echo], poll_interval=60) as worker,
        cyclone.Client(dsn) as producer,
    ):
        await _until(lambda: worker.listening, "LISTEN up")
        listener = _listener(worker)
        _kill_listener(db)
        await _until(lambda: listener.connects >= 2 and worker.listening, "reconnect")
        assert listener.channels == {AVAILABLE}

        job = await producer.enqueue("nobody_runs_this", 1)
        reads = _count_reads(monkeypatch, worker)
        waiting = asyncio.create_task(worker.wait(job, timeout=600))
        await _until(lambda: RUN_DONE in listener.channels, "LISTEN cyclone_run_done")
        _kill_listener(db)
        await _until(lambda: listener.connects >= 3 and worker.listening, "second reconnect")
        assert listener.channels == {AVAILABLE, RUN_DONE}
        # the reconnect makes the wait read its run again; then only a NOTIFY can end it
        await _until(lambda: len(reads) >= 3, "the read after the reconnect")
        await producer.cancel(job)
        run = await asyncio.wait_for(waiting, 30)
    assert run.state == RunState.CANCELLED
