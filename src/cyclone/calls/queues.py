"""Queue calls of both clients: pause and resume a queue (scripts: see
:mod:`cyclone.calls.effects`).

A queue is paused while ``cyclone_queue_pauses`` holds a row for it (migration 9);
every claim statement checks for that row, so a claim that starts after
:meth:`QueueCalls.pause_queue` returns takes no step of the queue. Steps already
claimed run to their end; steps keep arriving (``available``) and wait. Statistics
show the pause: ``stats()``, ``cyclone queues`` and the view ``cyclone_queues_v1``.
"""

from __future__ import annotations

from cyclone.calls.effects import Announce, CallsCore, Own, Script, fetch, twin
from cyclone.dbio import Stmt
from cyclone.options import check_queue
from cyclone.sql import Q
from cyclone.sql.rows import QueueRow
from cyclone.wakeups import Wakeups

__all__ = ["QueueCalls"]


class QueueCalls(CallsCore):
    """Queue calls: pause and resume a queue."""

    def _pauser(self) -> str | None:
        """Who pauses, as written to ``paused_by``: a ``Client``'s ``owner`` id
        (host:pid:random), ``None`` for a ``SyncClient``, which has none."""
        owner = getattr(self, "owner", None)
        return owner if isinstance(owner, str) else None

    @twin
    def pause_queue(self, name: str) -> Script[bool]:
        """Pause queue ``name``: no claim that starts after this call returns takes a
        step of it, on any worker, until :meth:`resume_queue`.

        The pause is a row of ``cyclone_queue_pauses`` (``paused_by``: this
        client's ``owner`` id, ``NULL`` from a ``SyncClient``), committed before the
        call returns: it outlives every client, and every worker with migration 9's
        claim honours it (older workers do not know pauses). A claim statement
        already running may still take steps; steps running now finish (their
        completions, retries and the sweep go on as usual); new steps are enqueued
        as usual and stay ``available``. A queue with no step can be paused (work
        that arrives later waits). Pausing a paused queue changes nothing: its
        first ``paused_at`` and ``paused_by`` stay.

        Args:
            name: the queue name (non-empty, no NUL, at most 256 UTF-8 bytes).

        Returns:
            ``True`` when this call paused the queue, ``False`` when it was paused
            already.

        Raises:
            ValidationError: a bad queue name (naming it); nothing is written.
        """
        check_queue(name)
        params = {"queue": name, "paused_by": self._pauser()}
        rows: list[QueueRow] = yield Own(fetch(Stmt(Q.queues_pause, params)), engine=True)
        return bool(rows)

    @twin
    def resume_queue(self, name: str) -> Script[bool]:
        """Resume queue ``name`` (see :meth:`pause_queue`): claims take its steps
        again.

        After the commit a wakeup is published for the queue, so that idle workers
        serving it claim at once rather than at their next poll. Resuming a queue
        that is not paused changes nothing and wakes no one.

        Args:
            name: the queue name (non-empty, no NUL, at most 256 UTF-8 bytes).

        Returns:
            ``True`` when this call resumed the queue, ``False`` when it was not
            paused.

        Raises:
            ValidationError: a bad queue name (naming it); nothing is written.
        """
        check_queue(name)
        rows: list[QueueRow] = yield Own(fetch(Stmt(Q.queues_resume, {"queue": name})), engine=True)
        if rows:
            yield Announce.of(Wakeups.of_queues((name,)))
        return bool(rows)
