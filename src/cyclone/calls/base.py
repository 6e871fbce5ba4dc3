"""What the call mixins need from the client classes they are mixed into.

``Client`` and ``SyncClient`` are each assembled from the calls of
:mod:`cyclone.calls` (producers, runs, schedules: an async module and its ``_sync``
twin for each) and a core that owns connections, pools and, for ``Client``, the
engine. The bases here declare, for the type checker, what the core provides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any

import psycopg

from cyclone.config import ClientConfig
from cyclone.connections import ConnectionSettings
from cyclone.notify import Listener, Publisher
from cyclone.wakeups import Wakeups

__all__ = ["AsyncCalls", "SyncCalls"]


class AsyncCalls:
    """The core of ``Client`` as its call mixins see it."""

    config: ClientConfig
    settings: ConnectionSettings
    poll_interval: float
    _publisher: Publisher | None
    _inline_wakeups: bool
    _waiters: dict[int, set[asyncio.Event]]
    _listener: Listener | None

    if TYPE_CHECKING:

        def _connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

        def _engine_connection(
            self,
        ) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

        async def _open(self) -> None: ...

        def _announce(self, wakeups: Wakeups, finished: Iterable[int] = ()) -> None: ...

        def _ensure_listener(self) -> None: ...


class SyncCalls:
    """The core of ``SyncClient`` as its call mixins see it."""

    config: ClientConfig
    settings: ConnectionSettings
    poll_interval: float
    _listen_conninfo: str

    if TYPE_CHECKING:

        def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _publish(
            self, conn: psycopg.Connection[Any], queues: Iterable[str], runs: Iterable[int]
        ) -> None: ...
