"""Wakeups: publishing NOTIFY, and the one LISTEN connection per client.

Two channels:

* ``cyclone_available``, payload ``{"queue": "<name>"}``: work became claimable in a
  queue. Each worker wakes only for the queues it serves.
* ``cyclone_run_done``, payload ``{"runs": [<id>, ...]}``: runs became terminal; wakes
  ``wait``. A client listens to it only while one of its waits is pending.

A notification is sent in its own transaction after the work it announces has committed,
never in the same message as that work's ``COMMIT``: a NOTIFY that fails (no right to
``pg_notify``, an I/O error on the notification queue) is logged and nothing else, so a
caller never sees an error raised after its transaction committed. The one exception is
an enqueue at the leading edge of its queue's window (:meth:`Publisher.lead`), whose own
statement carries the NOTIFY, delivered by its commit: if it fails, nothing committed.
Publication is best effort: polling at ``poll_interval`` is the correctness
floor, so a lost or failed NOTIFY delays work by one poll, never loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, fetch_async, fetch_sync
from cyclone.sql import Q

__all__ = [
    "AVAILABLE",
    "RUN_DONE",
    "RUN_DONE_LINGER",
    "Listener",
    "ListenerHooks",
    "Publisher",
    "available_payload",
    "publish_sync",
    "runs_in_payload",
    "wakeup_statement",
]

log = logging.getLogger("cyclone.notify")

AVAILABLE = "cyclone_available"
RUN_DONE = "cyclone_run_done"
_MAX_PAYLOAD = 7000  # bytes; PostgreSQL refuses payloads of 8,000 bytes and more
_RECONNECT_CAP = 5.0  # seconds between listener reconnects, at most
RUN_DONE_LINGER = 1.0
"""Seconds ``cyclone_run_done`` stays listened to after the last wait ended."""


def available_payload(queue: str) -> str:
    """The ``cyclone_available`` payload that announces ``queue``."""
    return json.dumps({"queue": queue}, separators=(",", ":"))


def wakeup_statement(queues: Iterable[str], run_ids: Iterable[int]) -> Stmt[None] | None:
    """One ``notify_publish`` statement for the given queues and finished runs.

    Returns ``None`` when there is nothing to announce. Run ids are packed into as few
    payloads as fit under the NOTIFY payload limit.
    """
    queues = sorted(set(queues))
    run_ids = sorted(set(run_ids))
    if len(queues) == 1 and not run_ids:
        return Stmt(Q.notify_available, {"payload": available_payload(queues[0])})
    channels: list[str] = []
    payloads: list[str] = []
    for queue in queues:
        channels.append(AVAILABLE)
        payloads.append(available_payload(queue))
    chunk: list[int] = []
    for run_id in run_ids:
        chunk.append(run_id)
        if len(chunk) * 21 + 16 > _MAX_PAYLOAD:
            channels.append(RUN_DONE)
            payloads.append(json.dumps({"runs": chunk}, separators=(",", ":")))
            chunk = []
    if chunk:
        channels.append(RUN_DONE)
        payloads.append(json.dumps({"runs": chunk}, separators=(",", ":")))
    if not channels:
        return None
    return Stmt(Q.notify_publish, {"channels": channels, "payloads": payloads})


def runs_in_payload(payload: str) -> list[int]:
    """The run ids of a ``cyclone_run_done`` payload (empty if it is malformed)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return []
    runs = data.get("runs") if isinstance(data, dict) else None
    if not isinstance(runs, list):
        return []
    return [r for r in runs if isinstance(r, int) and not isinstance(r, bool)]


def publish_sync(
    conn: psycopg.Connection[Any], queues: Iterable[str], run_ids: Iterable[int]
) -> None:
    """Send wakeups now, in a transaction of their own, after the caller's commit.

    ``conn`` must be idle (autocommit, or its transaction committed). A failure is
    logged, never raised: what the wakeup announces has committed already. On a
    connection in transaction mode the wakeup is committed (or rolled back) here.
    """
    stmt = wakeup_statement(queues, run_ids)
    if stmt is None:
        return
    try:
        fetch_sync(conn, stmt)
        if not conn.autocommit:
            conn.commit()
    except psycopg.Error as exc:
        log.warning("wakeup not published (polling will find the work): %s", exc)
        if not conn.autocommit and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()


class Publisher:
    """Sends wakeups from a background task: at most one per queue per window.

    ``coalesce`` seconds is the window. A queue not announced within the last window is
    announced at once (the leading edge: the task sends it as soon as it is asked);
    requests inside the window fold into one wakeup at its end (the trailing edge).
    Callers ask only after the commit of what they announce, so every NOTIFY the task
    sends follows that commit, on a connection of its own (an enqueue at the leading
    edge sends its own, inside its statement: :meth:`lead`). A lone enqueue therefore wakes
    workers at once, and a busy producer sends a few NOTIFYs per window instead of one
    per job. Requests that arrive while a NOTIFY is in flight also fold into the next
    one. :meth:`available` and :meth:`run_done` never block and never fail; a NOTIFY
    that fails is logged (polling finds the work).
    """

    def __init__(self, pool: AsyncConnectionPool[Any], *, coalesce: float = 0.0) -> None:
        self._pool = pool
        self._coalesce = coalesce
        self._last: dict[str, float] = {}  # loop time of the latest wakeup per queue
        self._queues: set[str] = set()  # to send now
        self._later: set[str] = set()  # to send at the end of their window
        self._timer: asyncio.TimerHandle | None = None
        self._runs: set[int] = set()
        self._pending = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the sending task on the running loop."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="cyclone-publisher")

    def available(self, queues: Iterable[str]) -> None:
        """Announce (after commit) that work became claimable in ``queues``."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        soonest: float | None = None
        for queue in queues:
            wait = self._last.get(queue, -math.inf) + self._coalesce - now
            if wait <= 0:
                self._last[queue] = now
                self._queues.add(queue)
            else:
                self._later.add(queue)
                soonest = wait if soonest is None else min(soonest, wait)
        if soonest is not None and self._timer is None:
            self._idle.clear()
            self._timer = loop.call_later(soonest, self._window_over)
        self._kick()

    def lead(self, queue: str) -> str | None:
        """The payload of a wakeup of ``queue`` that the caller sends itself, in the
        transaction that writes the work (``None``: the publisher sends it).

        At the leading edge of the queue's window the wakeup is the caller's (marked sent
        now): one statement carries the work and its NOTIFY, which the commit delivers.
        Inside the window the caller asks :meth:`available` after its commit, as every
        caller does, and the wakeup folds into the trailing one.
        """
        now = asyncio.get_running_loop().time()
        if self._last.get(queue, -math.inf) + self._coalesce - now <= 0:
            self._last[queue] = now
            return available_payload(queue)
        return None

    def _window_over(self) -> None:
        self._timer = None
        later, self._later = self._later, set()
        self.available(later)

    def run_done(self, run_ids: Iterable[int]) -> None:
        """Announce (after commit) that runs became terminal (not coalesced: ``wait``
        callers wake on them)."""
        self._runs.update(run_ids)
        self._kick()

    def _kick(self) -> None:
        if self._queues or self._runs:
            self._idle.clear()
            self._pending.set()

    async def flush(self) -> None:
        """Wait until every request made so far has been sent (or given up)."""
        if self._task is None:
            await self._send_pending()
            return
        await self._idle.wait()

    async def close(self) -> None:
        """Send what is pending (trailing wakeups included) and stop the task."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._queues |= self._later
            self._later = set()
            self._kick()
        if self._task is not None:
            await self.flush()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await self._pending.wait()
            self._pending.clear()
            await self._send_pending()
            if not self._pending.is_set() and self._timer is None:
                self._idle.set()

    async def _send_pending(self) -> None:
        queues, self._queues = self._queues, set()
        runs, self._runs = self._runs, set()
        stmt = wakeup_statement(queues, runs)
        if stmt is None:
            return
        try:
            async with self._pool.connection() as conn:
                await fetch_async(conn, stmt)
        except Exception as exc:  # best effort: polling finds the work
            log.warning("wakeup not published (polling will find the work): %s", exc)


@dataclass(frozen=True, slots=True)
class ListenerHooks:
    """What a :class:`Listener` calls.

    Attributes:
        on_available: with the queue of each ``cyclone_available`` notification
            (``None`` for a payload without one).
        on_run_done: with the run ids of each ``cyclone_run_done`` notification.
        on_connect: after every (re)connection and its LISTENs (notifications sent
            while it was away are lost: the callers poll once).
        on_run_done_listen: after each later ``LISTEN cyclone_run_done`` (waits that
            began before it read their run again).
    """

    on_available: Callable[[str | None], None]
    on_run_done: Callable[[list[int]], None]
    on_connect: Callable[[], None]
    on_run_done_listen: Callable[[], None] = lambda: None


class Listener:
    """The client's one LISTEN connection, reconnected with capped backoff.

    ``cyclone_available`` is listened to for the whole connection by a client with
    workers (``available``); ``cyclone_run_done`` only while :meth:`want_run_done` says
    a wait is pending, so that no worker decodes run-done notifications nobody waits
    for. After the last wait ends the channel stays listened to for ``linger`` seconds
    before its ``UNLISTEN``: a loop of waits does not send a LISTEN and an UNLISTEN per
    wait. Calls ``on_available(queue)`` for each ``cyclone_available`` notification,
    ``on_run_done(run_ids)`` for each ``cyclone_run_done`` one, ``on_connect()`` after
    every (re)connection and its LISTENs (notifications sent while it was away are lost:
    the callers poll once), and ``on_run_done_listen()`` after each later
    ``LISTEN cyclone_run_done`` (waits that began before it read their run again).

    ``connected`` is set while the connection is up; ``connects`` counts successful
    connections and ``failures`` the consecutive failed ones; :attr:`channels` are the
    channels listened to on the connection now and :attr:`received` counts the
    notifications dispatched, by channel.
    """

    def __init__(
        self,
        conninfo: str,
        hooks: ListenerHooks,
        *,
        available: bool = True,
        linger: float = RUN_DONE_LINGER,
    ) -> None:
        self._conninfo, self._hooks = conninfo, hooks
        self._available, self._linger = available, linger
        self._wanted = False  # a wait is pending
        self._unwanted_at = 0.0  # loop time the last wait ended
        self._reading: asyncio.Timeout | None = None  # while notifications are read
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.failures = 0
        self.connects = 0
        self.channels: frozenset[str] = frozenset()
        """The channels listened to on the current connection (empty while it is down)."""
        self.received = {AVAILABLE: 0, RUN_DONE: 0}
        """Notifications dispatched so far, by channel."""

    def start(self) -> None:
        """Start listening in a background task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="cyclone-listener")

    async def close(self) -> None:
        """Stop listening and close the connection."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def want_run_done(self, wanted: bool) -> None:
        """Whether a wait is pending: LISTEN on ``cyclone_run_done`` now, or UNLISTEN
        once none has been pending for ``linger`` seconds. Never blocks."""
        if wanted == self._wanted:
            return
        self._wanted = wanted
        if not wanted:
            self._unwanted_at = asyncio.get_running_loop().time()
        reading = self._reading
        if reading is not None and not reading.expired():
            reading.reschedule(self._change_at())

    def _change_at(self) -> float | None:
        """Loop time at which the channels must change (``None``: they are right)."""
        listening = RUN_DONE in self.channels
        if self._wanted and not listening:
            return asyncio.get_running_loop().time()
        if not self._wanted and listening:
            return self._unwanted_at + self._linger
        return None

    async def _run(self) -> None:
        while True:
            try:
                await self._listen()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("LISTEN connection lost (polling carries on): %s", exc)
            self.connected.clear()
            self.failures += 1
            await asyncio.sleep(min(_RECONNECT_CAP, 0.05 * 2 ** min(self.failures, 10)))

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
        try:
            if self._available:
                await conn.execute(Q.notify_listen.sql)
                self.channels = frozenset({AVAILABLE})
            await self._match(conn, announce=False)
            self.connected.set()
            self.failures = 0
            self.connects += 1
            self._hooks.on_connect()
            while True:
                await self._read(conn)
                await self._match(conn, announce=True)
        finally:
            self.channels = frozenset()
            self.connected.clear()
            await conn.close()

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Dispatch notifications until the channels must change (:meth:`want_run_done`
        moves that moment). Notifications that arrive while a LISTEN or UNLISTEN runs
        wait in psycopg's backlog for the next read."""
        try:
            async with asyncio.timeout_at(self._change_at()) as reading:
                self._reading = reading
                try:
                    async for note in conn.notifies():
                        self._dispatch(note.channel, note.payload)
                finally:
                    self._reading = None
        except TimeoutError:
            if not reading.expired():
                raise
            return
        raise psycopg.OperationalError("the notification stream ended")

    async def _match(self, conn: psycopg.AsyncConnection[Any], *, announce: bool) -> None:
        """LISTEN on ``cyclone_run_done`` while a wait is pending; UNLISTEN once none
        has been for ``linger`` seconds."""
        loop = asyncio.get_running_loop()
        while True:
            listening = RUN_DONE in self.channels
            if self._wanted and not listening:
                await conn.execute(Q.notify_listen_done.sql)
                self.channels |= {RUN_DONE}
                if announce:
                    self._hooks.on_run_done_listen()
            elif not self._wanted and listening and loop.time() >= self._unwanted_at + self._linger:
                self.channels -= {RUN_DONE}
                await conn.execute(Q.notify_unlisten_done.sql)
            else:
                return

    def _dispatch(self, channel: str, payload: str) -> None:
        if channel in self.received:
            self.received[channel] += 1
        if channel == AVAILABLE:
            try:
                data = json.loads(payload)
            except ValueError:
                data = None
            queue = data.get("queue") if isinstance(data, dict) else None
            self._hooks.on_available(queue if isinstance(queue, str) else None)
        elif channel == RUN_DONE:
            self._hooks.on_run_done(runs_in_payload(payload))
