"""Queue pause: ``pause_queue`` / ``resume_queue`` of both clients (docs/flow-control.md).

No claim that starts after ``pause_queue`` returns takes a step of the queue: the test
proves it without waiting for "long enough", by counting the worker's claim
statements (``Worker.claims`` counts each one as it starts, and one queue's claims run
one after another): once the count has gone up by two since the jobs were enqueued, a
whole claim statement of the queue started after the pause and the inserts, and ended.
A resume publishes a wakeup, so a worker that polls once a minute claims at once. A
pause is a row: idempotent, shown by ``stats()`` and ``cyclone_queues_v1``, and a bad
queue name is refused before anything is written.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import cyclone
from tests.engine.test_control_wakeups import heard  # noqa: F401 - the fixture
from tests.helpers import apoll_until, scalar

QUEUE = "qp_images"
RELEASE: dict[str, asyncio.Event] = {}
"""The event ``qp_hold`` waits for, made by the test that runs it."""


@cyclone.step("qp_job", queue=QUEUE)
async def job(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("qp_hold", queue=QUEUE)
async def hold(ctx: cyclone.Context, inp: Any) -> Any:
    await RELEASE["hold"].wait()
    return inp


def _states(db: psycopg.Connection[Any], run_ids: list[int]) -> list[str]:
    rows = db.execute(
        "SELECT state FROM cyclone_steps WHERE run_id = ANY(%s) ORDER BY run_id", (run_ids,)
    ).fetchall()
    return [row[0] for row in rows]


def _pause_row(db: psycopg.Connection[Any], queue: str) -> tuple[Any, ...] | None:
    return db.execute(
        "SELECT paused_at, paused_by FROM cyclone_queue_pauses WHERE queue = %s", (queue,)
    ).fetchone()


async def test_pause_and_resume_of_a_queue_with_workers_running(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A worker serves the queue; a step it holds across the pause finishes; jobs
    enqueued after the pause stay available through two of its claim statements;
    after a resume from another client they all complete (the worker polls once a
    minute: the resume's wakeup is what starts it)."""
    RELEASE["hold"] = asyncio.Event()
    async with (
        cyclone.Client(dsn, handlers=[job, hold], queues={QUEUE: 4}, poll_interval=60) as server,
        cyclone.Client(dsn) as producer,
    ):

        async def listening() -> bool:
            return server.listening

        await apoll_until(listening, what="the worker's LISTEN")
        try:
            await _pause_and_resume(server, producer, db)
        finally:
            RELEASE["hold"].set()  # a failed check does not keep the stop waiting


async def _pause_and_resume(
    server: cyclone.Client, producer: cyclone.Client, db: psycopg.Connection[Any]
) -> None:
    worker = server.worker
    assert worker is not None
    held = await producer.enqueue("qp_hold", "held", queue=QUEUE)
    await apoll_until(
        lambda: asyncio.to_thread(lambda: _states(db, [held.run_id]) == ["running"]),
        what="the held step running",
    )

    assert await producer.pause_queue(QUEUE) is True
    jobs = [await producer.enqueue("qp_job", i, queue=QUEUE) for i in range(5)]
    first = worker.claims

    async def two_claims_since() -> bool:
        worker.wake(QUEUE)  # the worker's own wakeup: claim now, not in a minute
        return worker.claims >= first + 2

    await apoll_until(two_claims_since, what="two claim statements after the pause")
    states = await asyncio.to_thread(_states, db, [j.run_id for j in jobs])
    assert states == ["available"] * 5, "a claim took a step of the paused queue"
    stats = (await producer.stats())[QUEUE]
    assert (stats.paused, stats.available, stats.running) == (True, 5, 1)

    RELEASE["hold"].set()  # a step claimed before the pause runs to its end
    done = await producer.wait(held, timeout=30)
    assert done.state == cyclone.RunState.COMPLETED

    assert await producer.resume_queue(QUEUE) is True
    for i, handle in enumerate(jobs):
        run = await producer.wait(handle, timeout=30)
        assert (run.state, run.result) == (cyclone.RunState.COMPLETED, i)
    assert QUEUE not in await producer.stats()


async def test_pause_records_the_client_and_keeps_the_first_pause(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """``paused_by`` is the pausing ``Client``'s owner id (none for a SyncClient); a
    second pause changes nothing, whoever sends it."""
    async with cyclone.Client(dsn) as client:
        assert await client.pause_queue("qp_owned") is True
        first = _pause_row(db, "qp_owned")
        assert first is not None and first[1] == client.owner
        assert await client.pause_queue("qp_owned") is False
    with cyclone.SyncClient(dsn) as sync_client:
        assert sync_client.pause_queue("qp_owned") is False
        assert _pause_row(db, "qp_owned") == first
        assert sync_client.pause_queue("qp_anonymous") is True
    row = _pause_row(db, "qp_anonymous")
    assert row is not None and row[1] is None


def test_a_pause_is_a_row_shown_by_stats_and_the_view(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A queue without steps can be paused: ``stats()`` and ``cyclone_queues_v1`` list
    it as paused with zero counts; resumed, it is gone from both. Pause and resume
    report whether they changed anything."""
    with cyclone.SyncClient(dsn) as client:
        client.enqueue("qp_job", 1, queue="qp_busy")
        assert client.pause_queue("qp_empty") is True
        stats = client.stats()
        assert list(stats) == ["qp_busy", "qp_empty"]  # name order
        assert stats["qp_empty"] == cyclone.QueueStats("qp_empty", 0, 0, 0, None, 0, True)
        assert stats["qp_busy"].paused is False and stats["qp_busy"].available == 1
        view = db.execute(
            "SELECT queue, available, paused, paused_at IS NOT NULL, paused_by"
            " FROM cyclone_queues_v1 ORDER BY queue"
        ).fetchall()
        assert view == [("qp_busy", 1, False, False, None), ("qp_empty", 0, True, True, None)]

        assert client.resume_queue("qp_empty") is True
        assert client.resume_queue("qp_empty") is False
        assert client.resume_queue("qp_never_paused") is False
        assert list(client.stats()) == ["qp_busy"]
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0


# -- wakeups -----------------------------------------------------------------------------


def _woken(notes: list[tuple[str, str]]) -> list[str]:
    assert {channel for channel, _ in notes} <= {"cyclone_available"}
    return [json.loads(payload)["queue"] for _, payload in notes]


def test_sync_resume_wakes_the_queue_and_pause_wakes_nothing(
    dsn: str,
    heard: Callable[[], list[tuple[str, str]]],  # noqa: F811 - the fixture
) -> None:
    with cyclone.SyncClient(dsn) as client:
        heard()
        client.pause_queue("qp_wake")
        assert heard() == []
        client.resume_queue("qp_wake")
        assert _woken(heard()) == ["qp_wake"]
        client.resume_queue("qp_wake")  # not paused: nothing changed, nothing to wake
        assert heard() == []


async def test_async_resume_wakes_the_queue_and_pause_wakes_nothing(
    dsn: str,
    heard: Callable[[], list[tuple[str, str]]],  # noqa: F811 - the fixture
) -> None:
    async with cyclone.Client(dsn) as client:
        heard()
        await client.pause_queue("qp_wake")
        await client.stop()  # flushes what the publisher holds
        assert heard() == []
        await client.resume_queue("qp_wake")
        await client.stop()
        assert _woken(heard()) == ["qp_wake"]
        await client.resume_queue("qp_wake")
        await client.stop()
        assert heard() == []


# -- bad input ---------------------------------------------------------------------------

BAD_NAMES: list[tuple[str, Any, str]] = [
    ("empty", "", "queue must not be empty"),
    ("NUL", "a\x00b", r"queue must not contain NUL, got 'a\\x00b'"),
    ("over 256 bytes", "q" * 257, "queue is 257 bytes, over the 256-byte cap: 'qqq"),
    ("multibyte over 256 bytes", "é" * 129, "queue is 258 bytes"),
    ("not a string", 42, "queue must be a string, got 42"),
    ("None", None, "queue must be a string, got None"),
]


@pytest.mark.parametrize(("case", "name", "message"), BAD_NAMES, ids=[c[0] for c in BAD_NAMES])
async def test_a_bad_queue_name_is_refused_and_nothing_is_written(
    dsn: str, db: psycopg.Connection[Any], case: str, name: Any, message: str
) -> None:
    with cyclone.SyncClient(dsn) as sync_client:
        for call in (sync_client.pause_queue, sync_client.resume_queue):
            with pytest.raises(cyclone.ValidationError, match=message):
                call(name)
    async with cyclone.Client(dsn) as client:
        for acall in (client.pause_queue, client.resume_queue):
            with pytest.raises(cyclone.ValidationError, match=message):
                await acall(name)
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0
