"""LISTEN/NOTIFY wakeups and the polling floor.

docs/concepts.md, Wakeups and polling: NOTIFY after the creating
transaction commits, payload naming the queue; one LISTEN connection per client; each
worker wakes only for its queues; polling claims the work when LISTEN is broken or off;
caller-owned transactions publish through track_wakeups / publish_wakeups.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from typing import Any

import psycopg

import cyclone
from cyclone import RunState
from tests.helpers import apoll_until, scalar


@cyclone.step("echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("echo_b", queue="b")
async def echo_b(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


async def test_poll_only_client_claims_by_polling(dsn: str) -> None:
    """notify=False: no LISTEN connection, and the work is still claimed (by polling)."""
    async with cyclone.Client(dsn, handlers=[echo], notify=False, poll_interval=0.2) as worker:
        assert not worker.listening
        async with cyclone.Client(dsn) as producer:  # publishes; nobody listens for it
            job = await producer.enqueue("echo", 7)
            run = await producer.wait(job, timeout=60)
    assert run.state == RunState.COMPLETED and run.result == 7


async def test_work_is_claimed_while_listen_keeps_breaking(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """The LISTEN connection is killed over and over; untracked caller transactions send
    no NOTIFY at all; polling still claims every job and the listener reconnects."""
    stop = threading.Event()

    def break_listen() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not stop.is_set():
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'cyclone-listen' AND pid <> pg_backend_pid() "
                    "AND datname = current_database()"
                )
                stop.wait(0.05)

    async with cyclone.Client(dsn, handlers=[echo], poll_interval=0.2) as worker:
        await apoll_until(lambda: asyncio.sleep(0, worker.listening), what="LISTEN up")
        breaker = threading.Thread(target=break_listen)
        breaker.start()
        try:
            async with await psycopg.AsyncConnection.connect(dsn) as conn:
                jobs = [await worker.enqueue_tx(conn, "echo", i) for i in range(10)]
                await conn.commit()
            runs = [await worker.wait(job, timeout=60) for job in jobs]
        finally:
            stop.set()
            breaker.join()
        listener = worker._listener
        assert listener is not None
        await apoll_until(lambda: asyncio.sleep(0, listener.connects >= 2), what="reconnect")
    assert [r.result for r in runs] == list(range(10))


async def test_notify_wakes_an_idle_worker_long_before_its_poll(dsn: str) -> None:
    """With a one-hour poll interval only the wakeup can start the job in time."""
    async with cyclone.Client(dsn, handlers=[echo], poll_interval=3600) as worker:
        await apoll_until(lambda: asyncio.sleep(0, worker.listening), what="LISTEN up")
        run = await worker.wait(await worker.enqueue("echo", "hi"), timeout=30)
    assert run.result == "hi"


async def test_tracked_caller_transaction_publishes_after_commit(dsn: str) -> None:
    """Work from enqueue_tx wakes workers once the caller commits and publishes."""
    async with cyclone.Client(dsn, handlers=[echo], poll_interval=3600) as worker:
        await apoll_until(lambda: asyncio.sleep(0, worker.listening), what="LISTEN up")
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            tracker = worker.track_wakeups(conn)
            job = await worker.enqueue_tx(conn, "echo", 1)
            assert tracker.queues == {"default"}
            await conn.commit()
        await worker.publish_wakeups(tracker)
        assert tracker.queues == set()
        run = await worker.wait(job, timeout=30)
    assert run.result == 1


def test_sync_client_tracked_transaction_publishes(dsn: str) -> None:
    """SyncClient: track_wakeups on a caller connection, publish after commit."""
    with psycopg.connect(dsn, autocommit=True) as listen:
        listen.execute("LISTEN cyclone_available")
        with cyclone.SyncClient(dsn) as client, psycopg.connect(dsn) as conn:
            tracker = client.track_wakeups(conn)
            client.enqueue_tx(conn, "echo", 1, queue="q1")
            conn.commit()
            client.publish_wakeups(tracker)
        notes = list(listen.notifies(timeout=10, stop_after=1))
    assert [json.loads(n.payload) for n in notes] == [{"queue": "q1"}]


def test_notify_comes_after_commit_and_names_the_queue(dsn: str) -> None:
    """A listener that receives the wakeup already sees the committed run."""
    with psycopg.connect(dsn, autocommit=True) as listen, psycopg.connect(dsn) as reader:
        reader.autocommit = True
        listen.execute("LISTEN cyclone_available")
        with cyclone.SyncClient(dsn) as client:
            job = client.enqueue("echo", 1, queue="images")
        (note,) = listen.notifies(timeout=10, stop_after=1)
        visible = scalar(reader, "SELECT count(*) FROM cyclone_runs WHERE id = %s", (job.run_id,))
    assert json.loads(note.payload) == {"queue": "images"}
    assert visible == 1


async def test_run_done_is_published_when_a_run_ends(dsn: str) -> None:
    """cyclone_run_done carries the ids of runs that became terminal."""
    listen = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with listen:
        await listen.execute("LISTEN cyclone_run_done")
        async with cyclone.Client(dsn, handlers=[echo]) as worker:
            job = await worker.enqueue("echo", 1)
            runs: list[int] = []
            async for note in listen.notifies(timeout=30):
                runs.extend(json.loads(note.payload)["runs"])
                if job.run_id in runs:
                    break
    assert job.run_id in runs


async def test_worker_wakes_only_for_its_queues(dsn: str) -> None:
    """A wakeup names a queue: only that queue's loop wakes; unknown queues are ignored."""
    async with cyclone.Client(dsn, handlers=[echo, echo_b], queues={"default": 1, "b": 1}) as c:
        worker = c.worker
        assert worker is not None
        for queue in worker._queues.values():
            queue.wake.clear()
        worker.wake("b")
        woken = {name for name, q in worker._queues.items() if q.wake.is_set()}
        worker.wake("not-served")
        woken_after = {name for name, q in worker._queues.items() if q.wake.is_set()}
    assert woken == {"b"} and woken_after == {"b"}


async def test_a_burst_of_enqueues_folds_into_few_wakeups(dsn: str) -> None:
    """Within the wakeup window a busy producer sends one NOTIFY for the first job and
    one at the window's end for the rest; with no window, every job is announced at
    once (each wakeup is awaited before the next job, so none folds into another)."""
    listen = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with listen:
        await listen.execute("LISTEN cyclone_available")
        async with cyclone.Client(dsn, notify_coalesce=0.5) as producer:
            began = time.monotonic()
            for i in range(30):
                await producer.enqueue("echo", i)
            last = await producer.enqueue("echo", "last")
            burst = time.monotonic() - began
        folded = [n async for n in listen.notifies(timeout=2)]
        each: list[psycopg.Notify] = []
        async with cyclone.Client(dsn, notify_coalesce=0) as producer:
            for i in range(10):
                await producer.enqueue("echo", i)
                each += [n async for n in listen.notifies(timeout=10, stop_after=1)]
    # one NOTIFY opens the first window, and one at the end of each window that had
    # jobs: a slow machine spreads the 31 jobs over more windows, not one NOTIFY a job
    assert 1 <= len(folded) <= 2 + math.ceil(burst / 0.5)
    assert len(folded) < 31
    assert len(each) == 10
    assert last.run_id > 0


async def test_trailing_wakeup_reaches_an_idle_worker(dsn: str) -> None:
    """Jobs enqueued inside the window are announced at its end: an idle worker that
    never polls in time still runs them all."""
    async with cyclone.Client(dsn, handlers=[echo], poll_interval=3600) as worker:
        await apoll_until(lambda: asyncio.sleep(0, worker.listening), what="LISTEN up")
        async with cyclone.Client(dsn, notify_coalesce=0.3) as producer:
            jobs = [await producer.enqueue("echo", i) for i in range(5)]
            runs = [await producer.wait(job, timeout=30) for job in jobs]
    assert [r.result for r in runs] == list(range(5))


async def test_a_wakeup_reaches_only_the_workers_of_its_queue(dsn: str) -> None:
    """Two workers on different queues, neither polling in time: a job of queue "a"
    wakes the worker of "a" only; the worker of "b" claims once, for its own job."""
    async with (
        cyclone.Client(dsn, handlers=[echo], poll_interval=3600) as worker_a,
        cyclone.Client(dsn, handlers=[echo_b], poll_interval=3600) as worker_b,
    ):
        await apoll_until(lambda: asyncio.sleep(0, worker_a.listening), what="LISTEN up")
        await apoll_until(lambda: asyncio.sleep(0, worker_b.listening), what="LISTEN up")
        assert worker_b.worker is not None
        async with cyclone.Client(dsn) as producer:
            # The wakeup each worker gives itself when its LISTEN connects may still be
            # claiming: a job of "b" first, so that worker b's loop is idle afterwards.
            await producer.wait(await producer.enqueue("echo_b", "warm", queue="b"), timeout=30)
            before = worker_b.worker.claims
            await producer.wait(await producer.enqueue("echo", "a"), timeout=30)
            await producer.wait(await producer.enqueue("echo_b", "b", queue="b"), timeout=30)
            after = worker_b.worker.claims
    assert after == before + 1


async def test_a_poll_only_producer_still_publishes(dsn: str) -> None:
    """notify=False turns off listening, not publishing: a listening worker that never
    polls in time runs the job at once."""
    async with cyclone.Client(dsn, handlers=[echo], poll_interval=3600) as worker:
        await apoll_until(lambda: asyncio.sleep(0, worker.listening), what="LISTEN up")
        async with cyclone.Client(dsn, notify=False, poll_interval=0.1) as producer:
            run = await producer.wait(await producer.enqueue("echo", 5), timeout=30)
    assert run.result == 5
