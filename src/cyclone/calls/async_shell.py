"""How ``Client`` performs the calls' scripts, and its ``wait``.

Each call borrows connections lazily, at its first effect that needs one, and keeps
them to its end: one of the pool the caller gave (else of the engine pool) for producer
and inspection plans, one of the engine pool for plans marked ``engine``. Wakeups go to
the client's announcer, which sends them after the commit through the publisher (a
NOTIFY that fails is logged, never raised); an enqueue at the leading edge of its
queue's wakeup window carries its NOTIFY in the insert itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from cyclone.calls.effects import (
    Announce,
    AsyncShellBase,
    EnqueueOne,
    Joined,
    Own,
    Script,
    Track,
)
from cyclone.calls.waiting import WAIT_DOC, Deadline, wait_pause
from cyclone.connections import ConnectionSettings
from cyclone.dbio import Stmt, fetch_async, run_plan_async
from cyclone.joins import Join, join_async
from cyclone.notify import Listener, Publisher
from cyclone.options import Duration, seconds
from cyclone.producer import EnqueueRequest, enqueue_stmt, enqueued_from_rows
from cyclone.records import Enqueued, Run, RunRef, run_id_of
from cyclone.sql import Q
from cyclone.wakeups import Wakeups

__all__ = ["AsyncShell"]

T = TypeVar("T")

log = logging.getLogger("cyclone.client")


class AsyncShell(AsyncShellBase):
    """The part of ``Client`` that performs scripts and waits for runs."""

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

        async def get_run(self, run: RunRef) -> Run: ...

    async def _perform(self, script: Script[T]) -> T:
        """Run ``script``, performing each effect it yields (see
        :mod:`cyclone.calls.effects`); its return value."""
        async with contextlib.AsyncExitStack() as stack:
            held: dict[bool, psycopg.AsyncConnection[Any]] = {}
            joins: dict[int, Join] = {}  # id of the caller's object -> its transaction

            async def borrow(engine: bool) -> psycopg.AsyncConnection[Any]:
                if engine not in held:
                    await self._open()
                    source = self._engine_connection() if engine else self._connection()
                    held[engine] = await stack.enter_async_context(source)
                return held[engine]

            try:
                effect = next(script)
                while True:
                    try:
                        result = await self._effect(effect, borrow, joins)
                    except BaseException as exc:
                        # the script sees the error where it yielded (its spans and
                        # cleanup run now, in this task); it re-raises it
                        effect = script.throw(exc)
                        continue
                    effect = script.send(result)
            except StopIteration as stop:
                value: T = stop.value
                return value

    async def _effect(
        self,
        effect: Any,
        borrow: Callable[[bool], Awaitable[psycopg.AsyncConnection[Any]]],
        joins: dict[int, Join],
    ) -> Any:
        """Perform one effect of a script; its result."""
        match effect:
            case Own():
                return await _own(await borrow(effect.engine), effect)
            case Joined():
                join = joins[id(effect.conn)] = await join_async(effect.conn)
                self.config.check_tx_conn(join.conn, psycopg.AsyncConnection)
                return await run_plan_async(join.conn, effect.plan)
            case Track():
                await self._open()  # the announcer that sends them after the commit
                join = joins[id(effect.conn)]
                tracked = self.config.track(effect.conn, effect.queues)
                if not tracked and join.after_commit is not None:
                    wakeups = Wakeups.of_queues(effect.queues)
                    join.after_commit(lambda: self._announce(wakeups))
                return None
            case EnqueueOne():
                return await self._enqueue_one(await borrow(False), effect.request)
            case Announce():
                await self._open()
                self._announce(effect.wakeups, effect.finished)
                if effect.flush:
                    assert self._publisher is not None
                    await self._publisher.flush()
                return None
        raise TypeError(f"not an effect: {effect!r}")  # pragma: no cover

    async def _enqueue_one(
        self, conn: psycopg.AsyncConnection[Any], request: EnqueueRequest
    ) -> Enqueued:
        """Insert one run without keys in its own transaction: one statement.

        At the leading edge of the queue's wakeup window the statement carries the
        NOTIFY too (``steps_enqueue_woken``): the commit delivers it, and nothing is
        sent after the commit. Inside the window the publisher sends the trailing
        wakeup. A role that may not NOTIFY gets that statement refused before it writes
        anything: the enqueue is sent again without the wakeup, and this client leaves
        every wakeup to the publisher from then on, which logs that it fails.
        """
        assert self._publisher is not None
        wake = self._publisher.lead(request.queue) if self._inline_wakeups else None
        stmt: Stmt[Any] = enqueue_stmt(request)
        if wake is not None:
            stmt = Stmt(Q.steps_enqueue_woken, {**request.params, "wake": wake})
        try:
            rows = await fetch_async(conn, stmt)
        except psycopg.errors.InsufficientPrivilege:
            if wake is None:
                raise
            if not conn.autocommit:
                await conn.rollback()
            # alone: raises the refusal again when it was not about the NOTIFY
            rows = await fetch_async(conn, enqueue_stmt(request))
            self._inline_wakeups = False
            log.warning("this role may not NOTIFY: enqueues no longer carry their wakeup")
            wake = None
        if not conn.autocommit:
            await conn.commit()
        if wake is None:  # inside the window, or no inline wakeups: after the commit
            self._announce(Wakeups.of_queues((request.queue,)))
        return enqueued_from_rows(rows)[0]

    async def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:  # noqa: ASYNC109
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        await self._open()
        self._ensure_listener()
        loop = asyncio.get_running_loop()
        deadline: Deadline = None if limit is None else (limit, loop.time() + limit)
        event = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(event)
        self._watch_runs()
        try:
            while True:
                event.clear()
                try:
                    current: Run | None = await self.get_run(run_id)
                except psycopg.OperationalError as exc:  # a restart: keep waiting
                    log.info("wait for run %d: database unreachable, retrying: %s", run_id, exc)
                    current = None
                if current is not None and current.terminal:
                    return current
                pause = wait_pause(run_id, current, self.poll_interval, deadline, loop.time())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await event.wait()
        finally:
            events = self._waiters.get(run_id)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[run_id]
            self._watch_runs()

    wait.__doc__ = WAIT_DOC

    def _on_run_done(self, run_ids: list[int]) -> None:
        for run_id in run_ids:
            for event in self._waiters.get(run_id, ()):
                event.set()

    def _wake_waiters(self) -> None:
        """Every pending wait reads its run again: run-done notifications sent before
        the listener's LISTEN (a reconnect, or the first wait in a while) were not heard."""
        for events in self._waiters.values():
            for event in events:
                event.set()

    def _watch_runs(self) -> None:
        """LISTEN on ``cyclone_run_done`` while a wait is pending (notify.Listener)."""
        if self._listener is not None:
            self._listener.want_run_done(bool(self._waiters))


async def _own(conn: psycopg.AsyncConnection[Any], effect: Own[T]) -> T:
    """Perform an :class:`Own` effect on ``conn``."""
    if effect.atomic:
        if not conn.autocommit:  # a caller's pool: end what its connection left open
            await conn.commit()
        async with conn.transaction():
            return await run_plan_async(conn, effect.plan)
    result = await run_plan_async(conn, effect.plan)
    if not conn.autocommit:
        await conn.commit()
    return result
