"""How ``SyncClient`` performs the calls' scripts, and its ``wait``.

Each call borrows one connection of the client's pool lazily, at its first effect that
needs one, and keeps it to its end. Wakeups are published on that connection right
after the commit of what they announce, in a transaction of their own (a failure is
logged, never raised); a call that borrowed none borrows one to publish.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from cyclone.calls.effects import (
    Announce,
    EnqueueOne,
    Joined,
    Own,
    Script,
    SyncShellBase,
    Track,
    fetch,
)
from cyclone.calls.waiting import WAIT_DOC, Deadline, wait_pause
from cyclone.connections import ConnectionSettings
from cyclone.dbio import run_plan_sync
from cyclone.joins import Join, join_sync
from cyclone.notify import RUN_DONE, runs_in_payload
from cyclone.options import Duration, seconds
from cyclone.producer import enqueue_stmt, enqueued_from_rows
from cyclone.records import Run, RunRef, run_id_of
from cyclone.sql import Q

__all__ = ["SyncShell"]

T = TypeVar("T")

log = logging.getLogger("cyclone.client")


class SyncShell(SyncShellBase):
    """The part of ``SyncClient`` that performs scripts and waits for runs."""

    settings: ConnectionSettings
    poll_interval: float
    _listen_conninfo: str

    if TYPE_CHECKING:

        def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]: ...

        def _publish(
            self, conn: psycopg.Connection[Any], queues: Iterable[str], runs: Iterable[int]
        ) -> None: ...

        def get_run(self, run: RunRef) -> Run: ...

    def _perform(self, script: Script[T]) -> T:
        """Run ``script``, performing each effect it yields (see
        :mod:`cyclone.calls.effects`); its return value."""
        with contextlib.ExitStack() as stack:
            held: list[psycopg.Connection[Any]] = []
            joins: dict[int, Join] = {}  # id of the caller's object -> its transaction

            def borrow() -> psycopg.Connection[Any]:
                if not held:
                    held.append(stack.enter_context(self._connection()))
                return held[0]

            try:
                effect = next(script)
                while True:
                    try:
                        match effect:
                            case Own():
                                result = _own(borrow(), effect)
                            case Joined():
                                join = joins[id(effect.conn)] = join_sync(effect.conn)
                                self.config.check_tx_conn(join.conn, psycopg.Connection)
                                result = run_plan_sync(join.conn, effect.plan)
                            case Track():
                                result = None
                                join = joins[id(effect.conn)]
                                tracked = self.config.track(effect.conn, effect.queues)
                                if not tracked and join.after_commit is not None:
                                    publish = functools.partial(self._publish_later, effect.queues)
                                    join.after_commit(publish)
                            case EnqueueOne():
                                conn = borrow()
                                rows = _own(conn, Own(fetch(enqueue_stmt(effect.request))))
                                self._publish(conn, (effect.request.queue,), ())
                                result = enqueued_from_rows(rows)[0]
                            case Announce():
                                if effect.wakeups.queues or effect.finished:
                                    queues, finished = effect.wakeups.queues, effect.finished
                                    self._publish(borrow(), queues, finished)
                                result = None
                    except BaseException as exc:
                        # the script sees the error where it yielded (its spans and
                        # cleanup run now, in this context); it re-raises it
                        effect = script.throw(exc)
                        continue
                    effect = script.send(result)
            except StopIteration as stop:
                value: T = stop.value
                return value

    def _publish_later(self, queues: Iterable[str]) -> None:
        """Wake ``queues`` after a caller's commit, on a connection of the client's; a
        failure is logged, never raised (the caller's work is committed)."""
        try:
            with self._connection() as conn:
                self._publish(conn, queues, ())
        except Exception as exc:  # e.g. the client was closed before the caller committed
            log.warning(
                "wakeups of %s after a caller's commit not sent (%s: %s); a poll finds the work",
                sorted(queues),
                type(exc).__name__,
                exc,
            )

    def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        deadline: Deadline = None if limit is None else (limit, time.monotonic() + limit)
        listen: psycopg.Connection[Any] | None = None
        try:
            if self.config.notify and self.settings.can_listen:
                try:
                    listen = psycopg.connect(self._listen_conninfo, autocommit=True)
                    listen.execute(Q.notify_listen_done.sql)
                except psycopg.Error:
                    listen = None  # poll only
            while True:
                try:
                    current: Run | None = self.get_run(run_id)
                except psycopg.OperationalError:  # a restart: keep waiting
                    current = None
                if current is not None and current.terminal:
                    return current
                pause = wait_pause(run_id, current, self.poll_interval, deadline, time.monotonic())
                if listen is None:
                    time.sleep(pause)
                    continue
                try:
                    for note in listen.notifies(timeout=pause):
                        if note.channel == RUN_DONE and run_id in runs_in_payload(note.payload):
                            break
                except psycopg.Error:
                    listen.close()
                    listen = None
        finally:
            if listen is not None:
                listen.close()

    wait.__doc__ = WAIT_DOC


def _own(conn: psycopg.Connection[Any], effect: Own[T]) -> T:
    """Perform an :class:`Own` effect on ``conn``."""
    if effect.atomic:
        if not conn.autocommit:  # a caller's pool: end what its connection left open
            conn.commit()
        with conn.transaction():
            return run_plan_sync(conn, effect.plan)
    result = run_plan_sync(conn, effect.plan)
    if not conn.autocommit:
        conn.commit()
    return result
