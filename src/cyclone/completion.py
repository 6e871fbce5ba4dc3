"""The completion transaction of a step, and the slots that bound how many are open.

A handler's business writes on
``ctx.completion_tx()`` commit in the same transaction as the step's completion, or not
at all. The transaction opens on first use, on a connection from the client's own
handler pool (async for ``async def`` handlers, sync for plain ``def`` handlers), after
taking one of ``tx_slots`` slots; it is committed or rolled back by the worker when the
handler returns. The engine's reserve of connections is never lent to it.

An object may be bound to the transaction (:attr:`CompletionTx.attachment`: the
SQLAlchemy session of ``ctx.completion_session()``): it is finished when the handler
returns (its pending writes sent; an error there is the handler's), and released just
before the transaction ends, whichever way. Callbacks in
:attr:`CompletionTx.after_commit` run once the transaction has committed.

A sync handler's thread cannot be stopped when it overruns its timeout, but its
transaction can: :meth:`CompletionTx.end_from_engine` terminates the transaction's
server backend from an engine connection, so that its row locks and its xid are
released at once (the retry can run), and refuses the transaction to the thread from
then on; the connection is closed rather than given back to the pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from cyclone.dbio import Stmt, fetch_async, fetch_sync
from cyclone.errors import ConfigurationError, LeaseLost
from cyclone.sql import Q

__all__ = ["Attachment", "CompletionTx", "TxSlots"]

log = logging.getLogger("cyclone.worker")


class Attachment(Protocol):
    """An object bound to a completion transaction; its methods return ``None`` for a
    sync handler's transaction, an awaitable for an async handler's."""

    def finish(self) -> Awaitable[None] | None:
        """The handler returned: send what it left pending on the transaction.

        Raises:
            Exception: the handler's work cannot be written (the handler failed).
        """

    def release(self) -> Awaitable[None] | None:
        """The transaction ends now (commit or rollback): let go of it, sending no
        statement."""


class TxSlots:
    """A counting semaphore shared by handler threads and the event loop.

    ``tx_slots`` bounds the completion transactions open at once across sync and
    async handlers (docs/design.md, Connections and pools).
    """

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop) -> None:
        self.size = size
        self._free = size
        self._loop = loop
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def free(self) -> int:
        """Slots not taken right now."""
        return self._free

    def acquire_sync(self) -> None:
        """Take a slot, blocking the calling (handler) thread until one is free."""
        with self._freed:
            while self._free == 0:
                self._freed.wait()
            self._free -= 1

    async def acquire_async(self) -> None:
        """Take a slot, waiting on the event loop until one is free."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                    raise
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted just as we were cancelled: give it back
            raise

    def release(self) -> None:
        """Give a slot back, from any thread."""
        with self._freed:
            self._free += 1
            self._freed.notify()
            waiting = bool(self._waiters)
        if waiting:
            self._loop.call_soon_threadsafe(self._grant)

    def _grant(self) -> None:
        with self._lock:
            while self._free > 0 and self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    self._free -= 1
                    waiter.set_result(None)


class CompletionTx:
    """The completion transaction of one step; opened at most once, on first use.

    Opening takes a slot, a connection from the handler pool (waiting for one as long
    as it takes) and enters a psycopg transaction block on it. Inside that block a
    handler's own ``with tx.transaction():`` is a savepoint, and an explicit
    ``commit()`` or ``rollback()`` by the handler is refused by psycopg: only the worker
    ends the transaction, together with the step's completion.

    A connection that broke while it rested in the pool (the server ended its session,
    the network dropped it) fails at that block's BEGIN, before the handler sees it: it
    is discarded and the next one taken, so that a fault the handler had no part in
    does not cost the step an attempt.
    """

    def __init__(
        self,
        slots: TxSlots,
        async_pool: AsyncConnectionPool[Any] | None,
        sync_pool: ConnectionPool[Any] | None,
        *,
        pinned: bool = False,
    ) -> None:
        self._slots = slots
        self._async_pool = async_pool
        self._sync_pool = sync_pool
        self._pinned = pinned
        self.async_conn: psycopg.AsyncConnection[Any] | None = None
        self.sync_conn: psycopg.Connection[Any] | None = None
        self._async_block: psycopg.AsyncTransaction | None = None
        self._sync_block: psycopg.Transaction | None = None
        self._lock = threading.Lock()  # the handler thread against the engine's end
        self._backend: tuple[int, Any] | None = None  # (pid, xact_start) on the server
        self.ended = False
        """True once :meth:`end_from_engine` ran: the transaction is refused."""
        self.attachment: Attachment | None = None
        """An object bound to the transaction (see :class:`Attachment`), or ``None``."""
        self.after_commit: list[Callable[[], None]] = []
        """Callbacks run after the transaction commits (dropped if it does not)."""

    @property
    def sync_pool(self) -> ConnectionPool[Any] | None:
        """The handler pool a sync handler's transaction is taken from."""
        return self._sync_pool

    @property
    def async_pool(self) -> AsyncConnectionPool[Any] | None:
        """The handler pool an async handler's transaction is taken from."""
        return self._async_pool

    def finish_sync(self) -> None:
        """A sync handler returned: finish the attachment, if any.

        Raises:
            Exception: what finishing it raised (the handler's work cannot be written).
        """
        if self.attachment is not None:
            self.attachment.finish()

    async def finish_async(self) -> None:
        """The async twin of :meth:`finish_sync`."""
        if self.attachment is not None:
            finished = self.attachment.finish()
            if finished is not None:
                await finished

    def _release_sync(self) -> None:
        attachment, self.attachment = self.attachment, None
        if attachment is not None:
            try:
                attachment.release()
            except Exception:
                log.exception("releasing %r failed", attachment)

    async def _release_async(self) -> None:
        attachment, self.attachment = self.attachment, None
        if attachment is not None:
            try:
                released = attachment.release()
                if released is not None:
                    await released
            except Exception:
                log.exception("releasing %r failed", attachment)

    def _committed(self, callbacks: list[Callable[[], None]]) -> None:
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a callback after the completion commit failed")

    @property
    def opened(self) -> bool:
        """True while the transaction is open."""
        return self.async_conn is not None or self.sync_conn is not None

    async def open_async(self) -> psycopg.AsyncConnection[Any]:
        """The transaction's connection for an async handler (opened on first call)."""
        if self.async_conn is None:
            pool = self._async_pool
            if pool is None:
                raise ConfigurationError("completion_tx() from an async handler needs its pool")
            await self._slots.acquire_async()
            try:
                for tries_left in range(pool.max_size, -1, -1):
                    conn = await pool.getconn(timeout=_FOREVER)
                    try:
                        block = conn.transaction()
                        await block.__aenter__()  # BEGIN: the connection's first word
                        break
                    except psycopg.OperationalError:
                        broken = conn.broken
                        await pool.putconn(conn)  # a broken one is discarded
                        if not broken or not tries_left:
                            raise
                    except BaseException:
                        await pool.putconn(conn)
                        raise
                if self._pinned:  # the handler's statements see the client's schema
                    try:
                        await fetch_async(conn, Stmt(Q.steps_tx_backend))
                    except BaseException:
                        with contextlib.suppress(psycopg.Error):
                            await block.__aexit__(psycopg.Rollback, psycopg.Rollback(), None)
                        await pool.putconn(conn)
                        raise
            except BaseException:
                self._slots.release()
                raise
            self.async_conn, self._async_block = conn, block
        return self.async_conn

    def open_sync(self) -> psycopg.Connection[Any]:
        """The transaction's connection for a sync handler (opened on first call).

        Raises:
            LeaseLost: the engine ended the transaction (the step timed out).
        """
        if self.ended:
            raise LeaseLost("the step timed out: its completion transaction was ended")
        if self.sync_conn is None:
            pool = self._sync_pool
            if pool is None:
                raise ConfigurationError("completion_tx() from a sync handler needs its pool")
            self._slots.acquire_sync()
            try:
                for tries_left in range(pool.max_size, -1, -1):
                    conn = pool.getconn(timeout=_FOREVER)
                    try:
                        block = conn.transaction()
                        block.__enter__()
                        break
                    except psycopg.OperationalError:
                        broken = conn.broken
                        pool.putconn(conn)
                        if not broken or not tries_left:
                            raise
                    except BaseException:
                        pool.putconn(conn)
                        raise
                try:
                    # The server's own process id and transaction start: behind any
                    # pooler the id a connection reports is the pooler's, and a server
                    # process outlives the transaction (the pooler lends it on).
                    (backend,) = fetch_sync(conn, Stmt(Q.steps_tx_backend))
                except BaseException:
                    with contextlib.suppress(psycopg.Error):
                        block.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
                    pool.putconn(conn)
                    raise
            except BaseException:
                self._slots.release()
                raise
            with self._lock:
                if self.ended:  # ended while it was opening: give it straight back
                    block.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
                    pool.putconn(conn)
                    self._slots.release()
                    raise LeaseLost("the step timed out: its completion transaction was ended")
                self.sync_conn, self._sync_block = conn, block
                self._backend = (backend.pid, backend.xact_start)
        return self.sync_conn

    async def end_from_engine(self, pool: AsyncConnectionPool[Any]) -> bool:
        """End a sync handler's transaction from the engine side (its step timed out).

        From now on the transaction is refused to the handler's thread (opening it
        raises :class:`cyclone.LeaseLost`, a commit becomes a rollback); if it is open,
        its server backend is terminated from a connection of ``pool``, which rolls it
        back and frees its locks now, whatever the thread is doing; the thread's next
        statement on it fails. Only that transaction is ended: the terminate names the
        server process and the transaction's start, so a process the pooler has lent
        to another client since is left alone. Returns whether a backend was terminated.

        Raises:
            psycopg.Error, psycopg_pool.PoolTimeout: the terminate could not be sent (the
                transaction is still refused to the thread; the lease CAS fences it).
        """
        with self._lock:
            self.ended = True
            backend = self._backend if self.sync_conn is not None else None
        if backend is None:
            return False
        pid, started = backend
        async with pool.connection() as conn:
            rows = await fetch_async(
                conn, Stmt(Q.steps_end_tx_backend, {"pid": pid, "xact_start": started})
            )
        return bool(rows and rows[0].terminated)

    async def close_async(self, *, commit: bool) -> None:
        """Commit or roll back (no-op when not open); return the connection and slot.

        Raises:
            psycopg.Error: the commit failed (the transaction is then rolled back).
        """
        conn, block = self.async_conn, self._async_block
        self.async_conn = self._async_block = None
        callbacks, self.after_commit = self.after_commit, []
        if conn is None or block is None or self._async_pool is None:
            return
        try:
            await self._release_async()
            if commit:
                await block.__aexit__(None, None, None)
            else:
                with contextlib.suppress(psycopg.Error):  # a broken connection rolls back
                    await block.__aexit__(psycopg.Rollback, psycopg.Rollback(), None)
        finally:
            await self._async_pool.putconn(conn)
            self._slots.release()
        if commit:
            self._committed(callbacks)

    def close_sync(self, *, commit: bool) -> None:
        """The synchronous twin of :meth:`close_async`.

        Raises:
            psycopg.Error: the commit failed (the transaction is then rolled back).
            LeaseLost: a commit asked after the engine ended the transaction.
        """
        with self._lock:
            conn, block = self.sync_conn, self._sync_block
            self.sync_conn = self._sync_block = None
            ended = self.ended
        callbacks, self.after_commit = self.after_commit, []
        if conn is None or block is None or self._sync_pool is None:
            return
        try:
            self._release_sync()
            if commit and not ended:
                block.__exit__(None, None, None)
            else:
                with contextlib.suppress(psycopg.Error):  # a broken connection rolls back
                    block.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
                if ended:
                    conn.close()  # its backend was terminated: never back into the pool
                    if commit:
                        raise LeaseLost("the step timed out: its completion transaction was ended")
        finally:
            self._sync_pool.putconn(conn)
            self._slots.release()
        if commit:
            self._committed(callbacks)


_FOREVER = 365 * 24 * 3600.0
"""Seconds to wait for a handler pool connection: the slots already bound the waiters."""
