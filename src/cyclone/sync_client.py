"""``SyncClient``: the producer and inspection calls of ``Client``, synchronous.

The same method names and arguments as :class:`cyclone.Client`,
for code without an event loop: web handlers, scripts, tests. It runs no workers (use
``Client`` or ``cyclone worker``). Wakeups are published right after each commit, in
their own transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Self, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from cyclone.calls.producers import ProducerCalls
from cyclone.calls.queues import QueueCalls
from cyclone.calls.runs import RunCalls
from cyclone.calls.schedules import ScheduleCalls
from cyclone.calls.sync_shell import SyncShell
from cyclone.config import ClientConfig
from cyclone.connections import (
    DEFAULT_TCP_USER_TIMEOUT,
    borrow_sync,
    client_connections,
    connect_failure,
)
from cyclone.handlers import Handler
from cyclone.migrate import check_schema, migrate
from cyclone.notify import publish_sync
from cyclone.options import HOUR, Duration, seconds
from cyclone.workflow import Workflow

__all__ = ["SyncClient"]

T = TypeVar("T")


class SyncClient(SyncShell, ProducerCalls, RunCalls, ScheduleCalls, QueueCalls):
    """Synchronous producer and inspection client.

    Args:
        conninfo: a libpq connection string or URL, or a ``psycopg_pool.ConnectionPool``.
        handlers: kinds whose default options (queue, priority, ...) ``enqueue`` applies
            when given their name.
        workflows: workflows whose nodes' kinds are registered the same way.
        poll_interval: seconds between polls of :meth:`wait` (default 1).
        notify: LISTEN in :meth:`wait` (default True); wakeups are published either way.
        schema: the Postgres schema Cyclone lives in (default ``public``).
        tcp_user_timeout: seconds after which a connection whose network is gone is
            dropped (default 10; ``None``: the libpq and system defaults). Sets libpq's
            ``tcp_user_timeout`` and keepalives on the client's own connections; values
            in ``conninfo`` win. See docs/operations.md, Network faults.
        retention: default time a finished run is kept (default 7 days).
        max_connections: size of the client's own pool (default 4).
        pooler: ``"transaction"`` behind a transaction-mode pooler, ``"session"``
            otherwise (default ``$CYCLONE_POOLER``, else ``"session"``); see
            ``Client``.
        connect_timeout: seconds a call waits for a connection before it raises
            :class:`cyclone.DatabaseUnavailable` (default 5).

    Raises:
        ValidationError: a bad option.
    """

    __module__ = "cyclone"

    def __init__(
        self,
        conninfo: str | ConnectionPool[Any],
        *,
        handlers: Iterable[Handler] = (),
        workflows: Iterable[Workflow] = (),
        poll_interval: Duration = 1.0,
        notify: bool = True,
        schema: str = "public",
        tcp_user_timeout: Duration | None = DEFAULT_TCP_USER_TIMEOUT,
        retention: Duration | None = timedelta(days=7),
        max_connections: int = 4,
        pooler: str | None = None,
        connect_timeout: Duration = 5.0,
    ) -> None:
        self.config = ClientConfig(
            handlers=handlers,
            workflows=workflows,
            schema=schema,
            retention=retention,
            notify=notify,
        )
        self.poll_interval = seconds(poll_interval, "poll_interval", maximum=HOUR) or 1.0
        given, base, self.settings = client_connections(
            conninfo,
            ConnectionPool,
            "SyncClient",
            schema=schema,
            pooler=pooler,
            connect_timeout=connect_timeout,
            tcp_user_timeout=tcp_user_timeout,
        )
        """Conninfo, schema, pooler mode and timeouts of every connection it opens."""
        self.connect_timeout: float = self.settings.connect_timeout or 5.0
        self.tcp_user_timeout = self.settings.tcp_user_timeout
        if given is not None:
            self._pool, self._own_pool = given, False
        else:
            self._pool = ConnectionPool(
                self.settings.conninfo_for("cyclone-sync"),
                min_size=1,
                max_size=max_connections,
                kwargs=self.settings.kwargs(autocommit=True),
                open=False,
                name="cyclone-sync",
                configure=self.settings.configure_sync(),
            )
            self._own_pool = True
        self._conninfo = base
        self._listen_conninfo = self.settings.conninfo_for("cyclone-wait")
        self._opened = False

    # -- lifecycle -----------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply missing migrations (see :func:`cyclone.migrate`)."""
        return migrate(
            self._conninfo,
            schema=self.config.schema,
            pooler=self.settings.pooler,
            connect_timeout=self.connect_timeout,
        )

    def open(self) -> None:
        """Check the schema and open the pool (done on first use).

        Raises:
            ConfigurationError: the schema is not installed or not current.
            DatabaseUnavailable: the first connection failed (down, unreachable within
                ``connect_timeout``, or refused: the message gives the server's reason).
        """
        if not self._opened:
            try:
                check_schema(self._conninfo, settings=self.settings)
            except psycopg.OperationalError as exc:
                raise connect_failure(exc) from exc
            if self._own_pool:
                self._pool.open()
            self._opened = True

    def close(self) -> None:
        """Close the client's own pool."""
        if self._opened and self._own_pool:
            self._pool.close()
        self._opened = False

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection of the pool within ``connect_timeout``.

        Raises:
            DatabaseUnavailable: none came in time (the server is down or unreachable).
        """
        self.open()
        with borrow_sync(self._pool, self.settings) as conn:
            yield conn

    def _publish(
        self, conn: psycopg.Connection[Any], queues: Iterable[str], runs: Iterable[int]
    ) -> None:
        """Send wakeups after the commit of what they announce, in a round trip and a
        transaction of their own; a failure is logged, never raised."""
        if not conn.autocommit:  # a user's pool in transaction mode: finish its transaction
            conn.commit()
        publish_sync(conn, queues, runs)
