"""SQLAlchemy 2 integration (extra ``sqlalchemy``, the ``postgresql+psycopg`` dialect).

Two things, each in sync and asyncio forms:

* **Joining the caller's transaction.** ``enqueue_tx``, ``enqueue_many_tx``,
  ``submit_tx`` and ``track_wakeups`` take a ``Session`` or ``Connection`` (on
  ``SyncClient``) or an ``AsyncSession`` or ``AsyncConnection`` (on ``Client``) in place of
  a psycopg connection: the call's statements run on the psycopg connection under it, in
  its transaction (begun now if it was not yet), so that the run exists exactly when that
  transaction commits. A session also says when it commits (its ``after_commit`` event):
  the call's wakeups are published then, and dropped with a rollback. A ``Connection``
  cannot say so; its work is found by the workers' poll, or woken through
  ``track_wakeups`` and ``publish_wakeups``. An object on another dialect (SQLite,
  psycopg2, asyncpg, ...) is refused with a :class:`cyclone.ValidationError` naming it.
  This module registers itself with :mod:`cyclone.joins` when imported, which Cyclone does
  on its own once SQLAlchemy is imported.

* **The completion session.** ``ctx.completion_session()`` gives a handler a ``Session``
  (``await ctx.completion_session()``: an ``AsyncSession`` in an ``async def`` handler)
  on the step's completion transaction, the connection ``ctx.completion_tx()`` returns.
  ORM writes made with it commit together with the step's completion, or not at all.

How the completion session is bound to a connection it does not own
--------------------------------------------------------------------

The completion transaction lives on a connection of Cyclone's handler pool, inside a
psycopg transaction block that only the worker ends. SQLAlchemy, left to itself, would
roll that connection back when it is returned (``pool_reset_on_return``), close it when
its pool lets it go, and commit or roll it back when the session does. Three pieces
keep it off the transaction's ends:

1. **A dialect that never ends what it did not open.** ``postgresql+cyclone_lent`` (a
   subclass of the psycopg dialect, registered under that name in SQLAlchemy's dialect
   registry) compiles and executes exactly as ``postgresql+psycopg`` does, but its
   ``do_close`` and ``do_terminate`` do nothing, its ``do_commit`` raises
   :class:`cyclone.StateError`, and its ``do_rollback`` raises it too except while the
   connection is being lent (SQLAlchemy rolls back after its first-connect checks). It
   adds no per-connection setup (no notice handler, no isolation level, no hstore
   adapter), so the pooled connection leaves each step as it came.

2. **One engine per handler pool, a pool that makes nothing.** Each of Cyclone's handler
   pools gets one ``Engine`` (``AsyncEngine`` for the async pool), made on first use and
   cached for as long as the pool lives: ``NullPool`` (a connection record per checkout,
   nothing kept between steps), ``pool_reset_on_return=None``, and a creator that hands
   out the connection being lent at that moment (a context variable set only around the
   ``connect()`` call, so that concurrent handlers never see each other's connection).
   The dialect's first-connect checks (server version, default schema) run once per
   engine, as reads inside the first step's transaction.

3. **A session whose transaction is a savepoint.** The session is bound to that engine
   connection with ``join_transaction_mode="create_savepoint"``: its transaction is a
   SAVEPOINT inside the completion transaction. ``session.rollback()`` (and SQLAlchemy's
   own rollback after a failed flush) rolls back to it, undoing the session's writes
   only; ``begin_nested()`` nests further savepoints; ``session.commit()`` is refused
   with :class:`cyclone.StateError` (a ``before_commit`` listener): the worker commits.
   When the handler returns, Cyclone commits the session itself (flushing it and
   releasing its savepoint; an error there is the handler's error, so the step fails and
   its transaction rolls back), completes the step and commits the transaction. Then,
   or when the handler raised, it invalidates the engine connection (which, with the
   dialect above, sends nothing) and closes the session: no statement of SQLAlchemy's
   reaches the connection after it goes back to Cyclone's pool. ``expire_on_commit``
   is off, so objects the handler loaded keep their attributes.

Mapped classes need no metadata binding: the session's one bind serves every mapper.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import sqlalchemy.exc
from psycopg import pq
from sqlalchemy import event
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg, PGDialectAsync_psycopg
from sqlalchemy.engine import Connection, Dialect, Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session, SessionTransaction
from sqlalchemy.pool import NullPool

from cyclone.errors import StateError, ValidationError
from cyclone.joins import AfterCommit, Join, register

if TYPE_CHECKING:
    from cyclone.completion import CompletionTx

__all__ = ["completion_session_async", "completion_session_sync"]

log = logging.getLogger("cyclone.sqlalchemy")

_LENT: ContextVar[Any] = ContextVar("cyclone_lent_connection", default=None)
"""The psycopg connection being lent to an engine of this module, during its connect()."""

_COMMIT_REFUSED = (
    "the completion session is committed by the worker, together with the step, when "
    "the handler returns: do not commit it yourself (roll it back, or raise, to undo)"
)
_ROLLBACK_REFUSED = (
    "the completion transaction is rolled back by the worker when the handler raises; "
    "use session.rollback() to undo the session's own writes"
)


# -- joining the caller's transaction ---------------------------------------------------


def _check_dialect(holder: Any, dialect: Dialect) -> None:
    """Refuse ``holder`` unless it runs on the psycopg 3 dialect of PostgreSQL."""
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise ValidationError(
            f"{holder!r} runs on the {dialect.name}+{dialect.driver} dialect; *_tx calls "
            "join only a postgresql+psycopg (psycopg 3) session or connection"
        )


@contextlib.contextmanager
def _refusing(holder: Any) -> Iterator[None]:
    """SQLAlchemy's refusals of an unusable holder (closed, unbound, in a failed
    transaction) as a :class:`ValidationError` naming it."""
    try:
        yield
    except sqlalchemy.exc.InvalidRequestError as exc:
        raise ValidationError(f"cannot join the transaction of {holder!r}: {exc}") from exc


_PENDING = "cyclone.after_commit"
"""Key in ``Session.info``: callbacks to run after the session's next commit."""
_PENDING_CONN = "cyclone.after_commit.conn"
"""Key in ``Session.info``: the psycopg connection whose commit they wait for."""


def _after_commit_of(session: Session, driver: Any) -> AfterCommit:
    """How to run a callback after ``session`` commits its transaction on the psycopg
    connection ``driver`` (dropped if it rolls back)."""
    completion = session.info.get(_COMPLETION)
    if isinstance(completion, _Completion):  # its commit is the worker's
        return completion.tx.after_commit.append
    if not event.contains(session, "after_commit", _run_pending):
        event.listen(session, "after_commit", _run_pending)
        event.listen(session, "after_transaction_end", _drop_pending)
    pending: list[Callable[[], None]] = session.info.setdefault(_PENDING, [])
    session.info[_PENDING_CONN] = driver
    return pending.append


def _run_pending(session: Session) -> None:
    # SQLAlchemy also calls after_commit when a savepoint (begin_nested) is released,
    # and when a session joined to a connection's outer transaction commits its own
    # part: the database transaction is still open then, and nothing is committed yet.
    driver = session.info.get(_PENDING_CONN)
    if driver is not None and driver.info.transaction_status != pq.TransactionStatus.IDLE:
        return
    session.info.pop(_PENDING_CONN, None)
    callbacks = session.info.pop(_PENDING, [])
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("a callback after the session's commit failed")


def _drop_pending(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the root ended without a commit (else already run)
        session.info.pop(_PENDING, None)
        session.info.pop(_PENDING_CONN, None)


def _join_sync(holder: Any) -> Join | None:
    """The :class:`Join` of a ``Session`` or ``Connection``; ``None`` for other objects."""
    if isinstance(holder, Session):
        with _refusing(holder):
            _check_dialect(holder, holder.get_bind().dialect)
            driver = holder.connection().connection.driver_connection
            return Join(driver, _after_commit_of(holder, driver))
    if isinstance(holder, Connection):
        _check_dialect(holder, holder.dialect)
        with _refusing(holder):
            if not holder.in_transaction():
                holder.begin()
            return Join(holder.connection.driver_connection)
    return None


async def _join_async(holder: Any) -> Join | None:
    """The :class:`Join` of an ``AsyncSession`` or ``AsyncConnection``; ``None`` for
    other objects."""
    if isinstance(holder, AsyncSession):
        with _refusing(holder):
            _check_dialect(holder, holder.sync_session.get_bind().dialect)
            conn = await holder.connection()
            driver = (await conn.get_raw_connection()).driver_connection
            return Join(driver, _after_commit_of(holder.sync_session, driver))
    if isinstance(holder, AsyncConnection):
        _check_dialect(holder, holder.dialect)
        with _refusing(holder):
            if not holder.in_transaction():
                await holder.begin()
            raw = await holder.get_raw_connection()
            return Join(raw.driver_connection)
    return None


register(sync=_join_sync, async_=_join_async)


# -- the dialect of a lent connection ---------------------------------------------------


class _NeverEnds:
    """The overrides that keep SQLAlchemy off the ends of a lent transaction."""

    def on_connect(self) -> None:
        return None  # no notice handler or isolation level added to the lent connection

    def do_commit(self, dbapi_connection: Any) -> None:
        raise StateError(_COMMIT_REFUSED)

    def do_rollback(self, dbapi_connection: Any) -> None:
        if _LENT.get() is None:  # not the first-connect checks: someone's rollback()
            raise StateError(_ROLLBACK_REFUSED)

    def do_close(self, dbapi_connection: Any) -> None:
        pass  # the connection goes back to Cyclone's pool, open

    def do_terminate(self, dbapi_connection: Any) -> None:
        pass


class _LentDialect(_NeverEnds, PGDialect_psycopg):
    """The psycopg dialect on a connection lent by Cyclone (see the module docstring)."""

    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: Any) -> type[Dialect]:
        return _LentAsyncDialect


class _LentAsyncDialect(_NeverEnds, PGDialectAsync_psycopg):
    """The asyncio psycopg dialect on a connection lent by Cyclone."""

    supports_statement_cache = True


_DIALECT = "cyclone_lent"
registry.register(f"postgresql.{_DIALECT}", __name__, "_LentDialect")
_URL = f"postgresql+{_DIALECT}://"
_ENGINE_OPTIONS: dict[str, Any] = {
    "poolclass": NullPool,
    "pool_reset_on_return": None,
    "use_native_hstore": False,
}

_ENGINES: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()
_ASYNC_ENGINES: weakref.WeakKeyDictionary[Any, AsyncEngine] = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


def _lent() -> Any:
    conn = _LENT.get()
    if conn is None:  # pragma: no cover - only connect() below checks out
        raise StateError("this engine serves only Cyclone's completion sessions")
    return conn


async def _lent_async() -> Any:
    return _lent()


def _engine_for(pool: Any) -> Engine:
    """The engine of handler pool ``pool`` (made once)."""
    with _ENGINES_LOCK:
        engine = _ENGINES.get(pool)
        if engine is None:
            engine = _ENGINES[pool] = create_engine(_URL, creator=_lent, **_ENGINE_OPTIONS)
        return engine


def _async_engine_for(pool: Any) -> AsyncEngine:
    """The async engine of handler pool ``pool`` (made once)."""
    with _ENGINES_LOCK:
        engine = _ASYNC_ENGINES.get(pool)
        if engine is None:
            engine = create_async_engine(_URL, async_creator=_lent_async, **_ENGINE_OPTIONS)
            _ASYNC_ENGINES[pool] = engine
        return engine


@contextlib.contextmanager
def _lending(conn: Any) -> Iterator[None]:
    token = _LENT.set(conn)
    try:
        yield
    finally:
        _LENT.reset(token)


@contextlib.asynccontextmanager
async def _lending_async(conn: Any) -> AsyncIterator[None]:
    token = _LENT.set(conn)
    try:
        yield
    finally:
        _LENT.reset(token)


# -- the completion session -------------------------------------------------------------

_COMPLETION = "cyclone.completion"
"""Key in ``Session.info``: the :class:`_Completion` of a completion session."""

_SESSION_OPTIONS: dict[str, Any] = {
    "join_transaction_mode": "create_savepoint",
    "expire_on_commit": False,
}


def _refuse_commit(session: Session) -> None:
    """``before_commit`` of a completion session: only the worker commits its root."""
    completion = session.info.get(_COMPLETION)
    if not isinstance(completion, _Completion) or completion.finishing:
        return
    if session.in_nested_transaction():  # a begin_nested() block ends: a RELEASE
        return
    raise StateError(_COMMIT_REFUSED)


class _Completion:
    """A completion session and its engine connection, bound to a completion
    transaction (``CompletionTx.attachment``)."""

    def __init__(self, tx: CompletionTx, session: Session) -> None:
        self.tx = tx
        self.session = session
        self.finishing = False
        session.info[_COMPLETION] = self
        event.listen(session, "before_commit", _refuse_commit)

    def _commit_savepoint(self) -> None:
        """Flush the session and release its savepoint (the worker commits the rest).

        Raises:
            Exception: what the flush raised (the handler failed).
        """
        self.finishing = True
        try:
            self.session.commit()
        finally:
            self.finishing = False


class _SyncCompletion(_Completion):
    def __init__(self, tx: CompletionTx, session: Session, conn: Connection) -> None:
        super().__init__(tx, session)
        self.conn = conn

    def finish(self) -> None:
        """The handler returned: write what the session holds."""
        self._commit_savepoint()

    def release(self) -> None:
        """The transaction ends now: let go of it without a statement."""
        self.conn.invalidate()
        self.session.close()
        self.conn.close()


class _AsyncCompletion(_Completion):
    def __init__(self, tx: CompletionTx, session: AsyncSession, conn: AsyncConnection) -> None:
        super().__init__(tx, session.sync_session)
        self.async_session = session
        self.conn = conn

    async def finish(self) -> None:
        """The handler returned: write what the session holds."""
        self.finishing = True
        try:
            await self.async_session.commit()
        finally:
            self.finishing = False

    async def release(self) -> None:
        """The transaction ends now: let go of it without a statement."""
        await self.conn.invalidate()
        await self.async_session.close()
        await self.conn.close()


def completion_session_sync(tx: CompletionTx) -> Session:
    """The ``Session`` of completion transaction ``tx`` (opened and made on the first
    call, the same one after): see the module docstring.

    Raises:
        LeaseLost: the engine ended the transaction (the step timed out).
    """
    found = tx.attachment
    if isinstance(found, _SyncCompletion):
        return found.session
    conn = tx.open_sync()
    engine = _engine_for(tx.sync_pool)
    with _lending(conn):
        engine_conn = engine.connect()
    engine_conn.begin()  # the worker's transaction, as SQLAlchemy sees it (no statement)
    session = Session(bind=engine_conn, **_SESSION_OPTIONS)
    tx.attachment = _SyncCompletion(tx, session, engine_conn)
    # its savepoint now, at the transaction's top level: opened lazily inside a block of
    # the handler's own (`with conn.transaction():` on completion_tx()), it would end
    # with that block, and the session's own end would find no savepoint to release
    session.connection()
    return session


async def completion_session_async(tx: CompletionTx) -> AsyncSession:
    """The ``AsyncSession`` of completion transaction ``tx`` (opened and made on the
    first call, the same one after): see the module docstring."""
    found = tx.attachment
    if isinstance(found, _AsyncCompletion):
        return found.async_session
    conn = await tx.open_async()
    engine = _async_engine_for(tx.async_pool)
    async with _lending_async(conn):
        engine_conn = await engine.connect()
    found = tx.attachment
    if isinstance(found, _AsyncCompletion):  # made meanwhile, by a concurrent call
        await engine_conn.invalidate()
        await engine_conn.close()
        return found.async_session
    await engine_conn.begin()
    session = AsyncSession(bind=engine_conn, **_SESSION_OPTIONS)
    tx.attachment = _AsyncCompletion(tx, session, engine_conn)
    await session.connection()  # its savepoint now (see completion_session_sync)
    return session
