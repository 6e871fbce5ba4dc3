"""The caller's transaction of a ``*_tx`` call, whatever holds it.

A ``*_tx`` call runs its statements on the caller's connection, inside the caller's
transaction. That connection is a psycopg connection, or an object of a library that
holds one: a SQLAlchemy ``Session`` or ``Connection``, a Django connection. A
:class:`Join` is what such an object gives the call: the psycopg connection its
transaction runs on, and, when the library can say so, a way to run a callback after
that transaction commits (the call's wakeups are published then, and dropped with a
rollback).

Each library's adapter registers its unwrapping functions here with :func:`register`;
the adapters of the integrations Cyclone ships (:mod:`cyclone.contrib.sqlalchemy`,
:mod:`cyclone.contrib.django`) are loaded on first use when their library is imported,
so that a plain psycopg user imports neither.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from cyclone.errors import ValidationError

__all__ = ["Join", "join_async", "join_sync", "register"]

AfterCommit = Callable[[Callable[[], None]], None]
"""Registers a callback to run once the caller's transaction commits (never after a
rollback)."""


@dataclass(frozen=True, slots=True)
class Join:
    """The caller's transaction as a ``*_tx`` call sees it.

    Attributes:
        conn: the psycopg connection the transaction runs on (a ``psycopg.Connection``
            for ``SyncClient``, a ``psycopg.AsyncConnection`` for ``Client``).
        after_commit: registers a callback run after the transaction commits, or
            ``None`` when the holder cannot tell (then only a tracked connection gets
            its wakeups published, see ``track_wakeups``).
    """

    conn: Any
    after_commit: AfterCommit | None = None


SyncUnwrap = Callable[[Any], Join | None]
"""Gives the :class:`Join` of an object of its library, or ``None`` for any other."""

AsyncUnwrap = Callable[[Any], Awaitable[Join | None]]
"""The asynchronous form of :data:`SyncUnwrap` (an async session must be awaited to
give its connection)."""

_SYNC: list[SyncUnwrap] = []
_ASYNC: list[AsyncUnwrap] = []

_ADAPTERS = {
    "sqlalchemy": "cyclone.contrib.sqlalchemy",
    "django": "cyclone.contrib.django.joins",
}
"""The adapter module of each library Cyclone integrates with, loaded once the library
itself is imported."""


def register(*, sync: SyncUnwrap | None = None, async_: AsyncUnwrap | None = None) -> None:
    """Add unwrapping functions for the holders of a library (each is tried in turn
    on an object that is not a psycopg connection)."""
    if sync is not None and sync not in _SYNC:
        _SYNC.append(sync)
    if async_ is not None and async_ not in _ASYNC:
        _ASYNC.append(async_)


def _load_adapters() -> None:
    for library, adapter in _ADAPTERS.items():
        if library in sys.modules and adapter not in sys.modules:
            importlib.import_module(adapter)


def _refused(conn: Any, expected: str) -> ValidationError:
    return ValidationError(f"expected a {expected} inside a transaction, got {conn!r}")


def join_sync(conn: Any) -> Join:
    """The :class:`Join` of ``conn`` for ``SyncClient``.

    Raises:
        ValidationError: ``conn`` is neither a ``psycopg.Connection`` nor an object an
            adapter knows (a SQLAlchemy ``Session``/``Connection``, a Django
            connection); nothing is written.
    """
    if isinstance(conn, psycopg.Connection):
        return Join(conn)
    _load_adapters()
    for unwrap in _SYNC:
        join = unwrap(conn)
        if join is not None:
            return join
    raise _refused(
        conn, "psycopg.Connection (or a SQLAlchemy Session or Connection, a Django connection)"
    )


async def join_async(conn: Any) -> Join:
    """The :class:`Join` of ``conn`` for ``Client``.

    Raises:
        ValidationError: ``conn`` is neither a ``psycopg.AsyncConnection`` nor an
            object an adapter knows (a SQLAlchemy ``AsyncSession``/``AsyncConnection``);
            nothing is written.
    """
    if isinstance(conn, psycopg.AsyncConnection):
        return Join(conn)
    _load_adapters()
    for unwrap in _ASYNC:
        join = await unwrap(conn)
        if join is not None:
            return join
    raise _refused(
        conn, "psycopg.AsyncConnection (or a SQLAlchemy AsyncSession or AsyncConnection)"
    )
