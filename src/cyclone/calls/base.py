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
from cyclone.errors import WaitTimeout
from cyclone.notify import Listener, Publisher
from cyclone.records import Run
from cyclone.wakeups import Wakeups

Deadline = tuple[float, float] | None
"""A wait's limit in seconds and the clock time it ends at, or ``None``: no limit."""

__all__ = ["AsyncCalls", "SyncCalls", "wait_pause"]


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


def wait_pause(
    run_id: int, current: Run | None, poll_interval: float, deadline: Deadline, now: float
) -> float:
    """Seconds a ``wait`` for a run not yet terminal (``current``, ``None`` when it could
    not be read) sleeps before it reads the run again: ``poll_interval``, cut to the
    time left before ``deadline`` (``(limit, clock time)``, or ``None``) at ``now``.

    Raises:
        WaitTimeout: the deadline has passed.
    """
    if deadline is None:
        return poll_interval
    limit, at = deadline
    remaining = at - now
    if remaining <= 0:
        state = current.state.value if current else "unknown"
        raise WaitTimeout(f"run {run_id} is still {state} after {limit} s")
    return min(poll_interval, remaining)
