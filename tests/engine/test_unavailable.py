"""Producer and inspection calls while the database is down: they fail fast with
``cyclone.DatabaseUnavailable`` (after ``connect_timeout``, not the pool's 30 s) and
work again by themselves once the server is back."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import apoll_until, poll_until
from tests.throwaway import ThrowawayServer, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="no initdb/pg_ctl to make a throwaway server"),
]


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
    for make in (cyclone.Client, cyclone.SyncClient):
        with pytest.raises(cyclone.ValidationError, match=r"connect_timeout .* got None"):
            make("dbname=x", connect_timeout=None)  # type: ignore[arg-type]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A DSN of a "server" that accepts TCP connections and never says a word (a frozen
    PostgreSQL, a half-dead host)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"host=127.0.0.1 port={port} user=nobody dbname=none"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in accepted:
            conn.close()
        listener.close()


async def test_a_silent_server_fails_the_first_calls_and_migrate(silent_server: str) -> None:
    """Connecting never hangs: the first call of a new client, and migrate, give up
    after their ``connect_timeout`` (libpq waits for ever without one)."""
    with pytest.raises(cyclone.DatabaseUnavailable):
        await cyclone.Client(silent_server, connect_timeout=1).enqueue("k", {})
    with pytest.raises(cyclone.DatabaseUnavailable):
        cyclone.SyncClient(silent_server, connect_timeout=1).enqueue("k", {})
    with pytest.raises(psycopg.OperationalError):
        await cyclone.migrate_async(silent_server, connect_timeout=1)


def test_a_busy_pool_is_not_an_outage(dsn: str) -> None:
    """Every connection of the pool is busy while the database answers: a call waits
    past ``connect_timeout`` for one to come free (after checking that the database
    answers) instead of raising DatabaseUnavailable."""
    with cyclone.SyncClient(dsn, max_connections=1, connect_timeout=0.2) as client:
        job = client.enqueue("k", {})
        release = threading.Event()
        got: list[Any] = []

        def hold() -> None:
            with client._pool.connection():
                release.wait(60)

        def call() -> None:
            try:
                got.append(client.get_run(job).state)
            except BaseException as exc:
                got.append(exc)

        holder = threading.Thread(target=hold)
        holder.start()
        poll_until(lambda: client._pool.get_stats().get("pool_available", 1) == 0)
        caller = threading.Thread(target=call)
        caller.start()
        # the caller's first wait ran out; it checked the database and waits again
        poll_until(lambda: client._pool.get_stats().get("requests_errors", 0) >= 1)
        assert not got
        release.set()
        holder.join(timeout=30)
        caller.join(timeout=30)
    assert got == [cyclone.RunState.RUNNING]
