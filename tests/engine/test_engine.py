"""The engine apart from the client: a client with handlers builds one engine when it
starts (worker, pools, background passes) and drops it when it stops; a client with no
handlers never has one, yet enqueues and inspects."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg

import cyclone
from cyclone.engine import Engine
from tests.helpers import apoll_until, scalar


@cyclone.step("engine_echo")
async def echo(ctx: cyclone.Context, inp: int) -> int:
    return inp


async def test_a_started_client_with_handlers_runs_one_engine(dsn: str) -> None:
    client = cyclone.Client(dsn, handlers=[echo], purge_interval=60)
    assert client.engine is None
    async with client:
        engine = client.engine
        assert isinstance(engine, Engine)
        assert client.worker is engine.worker is not None
        assert client.sweeper is engine.sweeper is not None
        assert client.wait_scanner is engine.wait_scanner is not None
        assert client.schedule_scanner is engine.schedule_scanner is not None
        assert client.purger is engine.purger is not None
        run = await client.wait(await client.enqueue(echo, 7), timeout=30)
        assert run.result == 7
    assert client.engine is None and client.worker is None and client.wait_scanner is None
    assert engine.wait_scanner is None and engine.purger is None
    assert engine._lease_pool.closed
    async with client:  # a stopped client starts again, with a new engine
        assert client.engine is not None and client.engine is not engine
        run = await client.wait(await client.enqueue(echo, 8), timeout=30)
        assert run.result == 8


async def test_a_client_without_handlers_has_no_engine(dsn: str) -> None:
    async with cyclone.Client(dsn) as producer:
        handle = await producer.enqueue("engine_echo", 1)
        assert producer.engine is None and producer.worker is None
        assert (await producer.get_run(handle)).state == cyclone.RunState.RUNNING


_gate: dict[str, asyncio.Event] = {}
_thread_gate = threading.Event()


@cyclone.step("engine_gated")
async def gated(ctx: cyclone.Context, inp: None) -> str:
    _gate["started"].set()
    await _gate["release"].wait()
    return "done"


@cyclone.step("engine_blocking")
def blocking(ctx: cyclone.Context, inp: None) -> None:
    _thread_gate.wait(60)


async def test_two_overlapping_stops_let_the_running_step_complete(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    _gate.update(started=asyncio.Event(), release=asyncio.Event())
    client = cyclone.Client(dsn, handlers=[gated], shutdown_grace=60)
    await client.start()
    handle = await client.enqueue(gated, None)
    await asyncio.wait_for(_gate["started"].wait(), 30)
    worker = client.worker
    assert worker is not None
    first = asyncio.create_task(client.stop())
    second = asyncio.create_task(client.stop())

    async def draining() -> bool:
        return worker._stopping and not first.done() and not second.done()

    await apoll_until(draining, what="both stops to be under way")
    assert client.engine is not None and client.worker is worker  # reachable while it drains
    _gate["release"].set()
    await asyncio.wait_for(asyncio.gather(first, second), 60)
    row = db.execute(
        "SELECT state, output FROM cyclone_steps WHERE id = %s", [handle.step_id]
    ).fetchone()
    assert row == ("completed", "done")


async def test_hurry_cuts_the_grace_of_a_stop_short(dsn: str, db: psycopg.Connection[Any]) -> None:
    _thread_gate.clear()
    client = cyclone.Client(dsn, handlers=[blocking], shutdown_grace=600)
    await client.start()
    handle = await client.enqueue(blocking, None)

    async def running() -> bool:
        state = scalar(db, "SELECT state FROM cyclone_steps WHERE id = %s", (handle.step_id,))
        return state == "running" and client.threads_running == 1

    await apoll_until(running, what="the handler thread to run")
    worker = client.worker
    assert worker is not None
    stopping = asyncio.create_task(client.stop())

    async def draining() -> bool:
        return worker._stopping

    await apoll_until(draining, what="the stop to be under way")
    client.hurry()
    try:
        await asyncio.wait_for(stopping, 60)  # not the 600 s grace
        assert client.threads_running == 1  # the thread outlived the stop
        state = scalar(db, "SELECT state FROM cyclone_steps WHERE id = %s", (handle.step_id,))
        assert state == "available"  # given back, no attempt counted
    finally:
        _thread_gate.set()
