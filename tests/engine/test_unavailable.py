"""Producer and inspection calls while the database is down: they fail fast with
``cyclone.DatabaseUnavailable`` (after ``connect_timeout``, not the pool's 30 s) and
work again by themselves once the server is back."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import cyclone
from tests.helpers import apoll_until, poll_until
from tests.throwaway import ThrowawayServer, available

pytestmark = pytest.mark.skipif(
    not available(), reason="no initdb/pg_ctl to make a throwaway server"
)


@pytest.fixture
def server() -> Iterator[ThrowawayServer]:
    pg = ThrowawayServer()
    pg.start()
    cyclone.migrate(pg.dsn)
    try:
        yield pg
    finally:
        pg.stop()


async def test_async_calls_fail_fast_while_the_server_is_down(server: ThrowawayServer) -> None:
    async with cyclone.Client(server.dsn, connect_timeout=1) as client:
        job = await client.enqueue("k", {})
        server.halt()
        for _ in range(10):  # the pool's idle connections are dead: each fails once
            with pytest.raises(psycopg.OperationalError) as failed:
                await client.enqueue("k", {})
            if isinstance(failed.value, cyclone.DatabaseUnavailable):
                break
        assert isinstance(failed.value, cyclone.DatabaseUnavailable)
        assert "within 1 s" in str(failed.value)
        with pytest.raises(cyclone.DatabaseUnavailable):
            await client.get_run(job)
        with pytest.raises(cyclone.DatabaseUnavailable):
            await client.list_runs()
        # a client that never connected fails at once too, with the server's reason
        with pytest.raises(cyclone.DatabaseUnavailable, match="cannot connect"):
            await cyclone.Client(server.dsn, connect_timeout=1).enqueue("k", {})
        server.start()

        async def enqueued() -> bool:
            try:
                await client.enqueue("k", {})
            except psycopg.OperationalError:
                return False
            return True

        await apoll_until(enqueued, timeout=60, interval=0.2, what="enqueue after the restart")
        assert (await client.get_run(job)).state == cyclone.RunState.RUNNING


def test_sync_calls_fail_fast_while_the_server_is_down(server: ThrowawayServer) -> None:
    with cyclone.SyncClient(server.dsn, connect_timeout=1) as client:
        job = client.enqueue("k", {})
        server.halt()
        for _ in range(10):  # the pool's idle connections are dead: each fails once
            with pytest.raises(psycopg.OperationalError) as failed:
                client.get_run(job)
            if isinstance(failed.value, cyclone.DatabaseUnavailable):
                break
        assert isinstance(failed.value, cyclone.DatabaseUnavailable)
        assert "within 1 s" in str(failed.value)
        with pytest.raises(cyclone.DatabaseUnavailable, match="cannot connect"):
            cyclone.SyncClient(server.dsn, connect_timeout=1).get_run(job)
        server.start()

        def read() -> bool:
            try:
                return client.get_run(job).state == cyclone.RunState.RUNNING
            except psycopg.OperationalError:
                return False

        poll_until(read, timeout=60, interval=0.2, what="get_run after the restart")


def test_connect_timeout_is_checked() -> None:
    with pytest.raises(cyclone.ValidationError, match="connect_timeout"):
        cyclone.Client("dbname=x", connect_timeout=-1)
    with pytest.raises(cyclone.ValidationError, match="connect_timeout"):
        cyclone.SyncClient("dbname=x", connect_timeout="5")  # type: ignore[arg-type]
