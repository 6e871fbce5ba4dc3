"""The engine apart from the client: a client with handlers builds one engine when it
starts (worker, pools, background passes) and drops it when it stops; a client with no
handlers never has one, yet enqueues and inspects."""

from __future__ import annotations

import cyclone
from cyclone.engine import Engine


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
