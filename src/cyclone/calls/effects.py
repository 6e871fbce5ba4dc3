"""Each client call written once, for ``Client`` and ``SyncClient`` alike.

A call is a *script*: a generator method that checks its arguments, builds the plans of
what to write (pure code: :mod:`cyclone.producer`, :mod:`cyclone.control`, ...), yields
*effects* and receives their results, then returns the call's value. The effects are
few: run a plan on a connection of the client's (:class:`Own`) or on the caller's, in
the caller's transaction (:class:`Joined`), and record what it wrote there
(:class:`Track`); announce, after the commit, what the call
wrote (:class:`Announce`); insert one run, announced (:class:`EnqueueOne`, the one call
that each client writes its fastest way).

The decorator :class:`twin` turns a script into a method of both clients: on a
``Client`` a coroutine function whose effects the async shell performs
(:mod:`cyclone.calls.async_shell`), on a ``SyncClient`` a function the sync shell
performs (:mod:`cyclone.calls.sync_shell`). A call's parameters, checks, documented
errors and plans therefore cannot differ between the two; only how a connection is
borrowed and how a wakeup is sent does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass, field
from types import MethodType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from cyclone.dbio import Plan, Stmt
from cyclone.errors import NotFoundError
from cyclone.wakeups import NO_WAKEUPS, Wakeups

if TYPE_CHECKING:
    from cyclone.config import ClientConfig
    from cyclone.producer import EnqueueRequest

__all__ = [
    "Announce",
    "AsyncShellBase",
    "CallsCore",
    "Conn",
    "EnqueueOne",
    "Joined",
    "Own",
    "Script",
    "SyncShellBase",
    "Track",
    "fetch",
    "fetch_one",
    "twin",
]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

Conn = Any
"""The caller's transaction of a ``*_tx`` call: a ``psycopg.AsyncConnection`` (or a
SQLAlchemy ``AsyncSession``/``AsyncConnection``) for ``Client``; a
``psycopg.Connection`` (or a SQLAlchemy ``Session``/``Connection``, a Django
connection) for ``SyncClient``. Checked when it is used (:mod:`cyclone.joins`)."""


@dataclass(frozen=True, slots=True)
class Own(Generic[T]):
    """Run ``plan`` on a connection the client borrows for the call (one per call,
    kept for all its effects); the result is the plan's return value.

    Attributes:
        plan: the statements (:data:`cyclone.dbio.Plan`).
        atomic: the plan is one transaction; otherwise each statement stands alone
            (committed at the end on a connection not in autocommit mode).
        engine: on one of the client's own engine connections (autocommit, READ
            COMMITTED) even when the caller gave the client a pool.
    """

    plan: Plan[T]
    atomic: bool = False
    engine: bool = False


@dataclass(frozen=True, slots=True)
class Joined(Generic[T]):
    """Run ``plan`` on the caller's connection ``conn``, inside the caller's
    transaction, once the shell has checked that ``conn`` can join one (a connection of
    the client's kind, open, not failed, not autocommit outside a transaction)."""

    conn: Any
    plan: Plan[T]


@dataclass(frozen=True, slots=True)
class Announce:
    """After the commit of what the call wrote: wake the ``wakeups`` and announce the
    runs ``finished``; with ``flush`` the notifications are sent before the call
    returns."""

    wakeups: Wakeups = NO_WAKEUPS
    finished: frozenset[int] = field(default_factory=frozenset)
    flush: bool = False

    @classmethod
    def of(cls, wakeups: Wakeups, finished: Iterable[int] = ()) -> Announce:
        """An announcement of ``wakeups`` and the runs ``finished``."""
        return cls(wakeups, frozenset(finished))


@dataclass(frozen=True, slots=True)
class EnqueueOne:
    """Insert the one run of ``request`` (no keys: it always inserts) in a transaction
    of its own, and announce its queue; the result is its
    :class:`cyclone.Enqueued`. ``Client`` sends the wakeup in the insert itself at the
    leading edge of the queue's wakeup window."""

    request: EnqueueRequest


@dataclass(frozen=True, slots=True)
class Track:
    """A ``*_tx`` call wrote work for ``queues`` in the caller's transaction on
    ``conn`` (after its :class:`Joined`): record the queues in ``conn``'s tracker if it
    is tracked; otherwise, when the holder of the transaction can run a callback after
    its commit (a SQLAlchemy ``Session``, a Django connection), publish them then."""

    conn: Any
    queues: tuple[str, ...]


Effect = Own[Any] | Joined[Any] | Announce | EnqueueOne | Track
Script = Generator[Effect, Any, T]
"""A call: yields effects, receives their results, returns the call's value."""


def fetch(stmt: Stmt[R]) -> Plan[list[R]]:
    """The plan of one statement: its rows."""
    rows: list[R] = yield stmt
    return rows


def fetch_one(stmt: Stmt[R], missing: str) -> Plan[R]:
    """The plan of one statement that finds one thing: its first row.

    Raises:
        NotFoundError: the statement returned no row (``missing`` is the message).
    """
    rows: list[R] = yield stmt
    if not rows:
        raise NotFoundError(missing)
    return rows[0]


class CallsCore:
    """What a call's script reads of the client it runs on."""

    config: ClientConfig


class AsyncShellBase(CallsCore):
    """The part of ``Client`` that performs scripts (see
    :mod:`cyclone.calls.async_shell`)."""

    async def _perform(self, script: Script[T]) -> T:
        raise NotImplementedError


class SyncShellBase(CallsCore):
    """The part of ``SyncClient`` that performs scripts (see
    :mod:`cyclone.calls.sync_shell`)."""

    def _perform(self, script: Script[T]) -> T:
        raise NotImplementedError


class twin(Generic[P, T]):
    """Make the script ``fn`` a call of both clients.

    Read on a ``Client``, the call is a coroutine function (``await client.x(...)``);
    on a ``SyncClient``, a plain function. Both take ``fn``'s parameters (after
    ``self``), carry its docstring, and return what the script returns.
    """

    def __init__(self, fn: Callable[Concatenate[Any, P], Script[T]]) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.__name__ = fn.__name__
        self.__wrapped__ = fn

        async def call_async(client: Any, *args: Any, **kwargs: Any) -> Any:
            return await client._perform(fn(client, *args, **kwargs))

        def call_sync(client: Any, *args: Any, **kwargs: Any) -> Any:
            return client._perform(fn(client, *args, **kwargs))

        # made once: reading the call on a client only binds one of them
        self._async = functools.update_wrapper(call_async, fn)
        self._sync = functools.update_wrapper(call_sync, fn)

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(
        self, obj: AsyncShellBase, owner: type[Any]
    ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, obj: SyncShellBase, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, obj: Any, owner: type[Any]) -> Any:
        if obj is None:
            return self
        return MethodType(self._async if isinstance(obj, AsyncShellBase) else self._sync, obj)
