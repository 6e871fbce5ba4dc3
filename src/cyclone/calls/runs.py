"""Run calls of ``Client``: inspection, wait, operator control, purge and stats."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TypeVar

import psycopg

from cyclone.calls.base import AsyncCalls, wait_pause
from cyclone.config import list_runs_params
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import (
    Plan,
    Stmt,
    fetch_dicts_async,
    run_plan_async,
)
from cyclone.errors import (
    NotFoundError,
)
from cyclone.monitor import QueueStats, queue_stats_async
from cyclone.options import Duration, check_text, seconds
from cyclone.records import Run, RunRef, Step, run_id_of
from cyclone.scanners.purge import purge_async
from cyclone.sql import Q
from cyclone.states import RunState

__all__ = ["RunCalls"]

T = TypeVar("T")

log = logging.getLogger("cyclone.client")


class RunCalls(AsyncCalls):
    """Run calls of ``Client``: inspection, wait, operator control, purge and stats."""

    async def get_run(self, run: RunRef) -> Run:
        """The run with its result and error.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.runs_get, {"run_id": run_id}))
        if not rows:
            raise NotFoundError(f"run {run_id} does not exist")
        return Run.from_row(rows[0])

    async def list_runs(
        self,
        state: RunState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[Run]:
        """Runs, newest first; ``before`` pages below a run id.

        Raises:
            ValidationError: an unknown state or a bad limit.
        """
        params = list_runs_params(state, workflow, limit, before)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.runs_list, params))
        return [Run.from_row(row) for row in rows]

    async def list_steps(self, run: RunRef) -> list[Step]:
        """Every step of a run, in insertion order (empty for an unknown run).

        Raises:
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        async with self._connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.steps_list, {"run_id": run_id}))
        return [Step.from_row(row) for row in rows]

    async def cancel(self, run: RunRef) -> None:
        """Cancel a running or paused run and its active steps.

        A step still in its handler learns it at its next heartbeat; its completion is
        then ignored.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is already completed, failed or cancelled.
        """
        await self._operate(cancel_plan(run_id_of(run)))

    async def pause(self, run: RunRef) -> None:
        """Pause a running run: no new step of it is claimed; running steps finish.

        Pending and available steps become ``paused``; waiting steps keep waiting, and
        their timeouts and the run's deadline move forward by the pause length at
        :meth:`resume`.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not running.
        """
        await self._operate(pause_plan(run_id_of(run)))

    async def resume(self, run: RunRef) -> None:
        """Resume a paused run (see :meth:`pause`).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not paused.
        """
        await self._operate(resume_plan(run_id_of(run)))

    async def retry(
        self, run: RunRef, node: str | None = None, *, deadline: Duration | None = None
    ) -> int:
        """Operator retry: reset the run's discarded and cancelled steps (all, or ``node``
        and those below it) and reopen the run.

        Each reset step has ``attempt`` and ``reclaims`` at 0 and no error; it is
        claimable again when its parents all completed, else pending. The run returns to
        ``running``; its deadline is cleared unless ``deadline`` (from now) is given. A
        reset child node reopens its child run (retried the same way).

        Returns:
            The number of steps reset.

        Raises:
            NotFoundError: no run has that id.
            StateError: nothing to retry, the run is paused, or (with ``node``) a
                discarded step outside the retried part would stay behind.
            ValidationError: a bad or unknown node, or a bad deadline.
        """
        if node is not None:
            check_text(node, "node")
        limit = seconds(deadline, "deadline")
        return await self._operate(retry_plan(run_id_of(run), node, limit))

    async def _operate(self, plan: Plan[Outcome[T]]) -> T:
        """Run an operator plan in one transaction; announce its outcome after the
        commit; its value."""
        async with self._engine_connection() as conn, conn.transaction():
            outcome = await run_plan_async(conn, plan)
        self._announce(outcome.wakeups, outcome.finished)
        return outcome.value

    async def purge(self, older_than: Duration | None = None) -> int:
        """Delete terminal runs past their retention now, in batches; how many went.

        Args:
            older_than: ``timedelta`` or seconds; given, every terminal run that
                finished at least that long ago goes, whatever its retention.

        Returns:
            The number of runs deleted (their steps, deps, signals and fires with them).

        Raises:
            ValidationError: a negative ``older_than``.
        """
        limit = seconds(older_than, "older_than", allow_zero=True)
        async with self._engine_connection() as conn:
            return await purge_async(conn, limit)

    async def stats(self) -> dict[str, QueueStats]:
        """Depth and age of every queue with unfinished work (``cyclone_v_queues``).

        Returns:
            queue name -> :class:`QueueStats` (available, running and waiting counts,
            seconds since the oldest claimable step became due, expired leases).
        """
        async with self._engine_connection() as conn:
            return {q.queue: q for q in await queue_stats_async(conn)}

    async def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:  # noqa: ASYNC109
        """Block until the run is terminal; the terminal :class:`Run`.

        Wakes on ``cyclone_run_done`` when LISTEN is available, and polls every
        ``poll_interval`` in any case; a database that goes away meanwhile (a restart)
        is waited for too. The client's listener LISTENs on that channel only while a
        wait is pending; the run is read again once the LISTEN is in place, so a run
        that ends meanwhile is not missed.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: a bad run reference or timeout.
            WaitTimeout: not terminal within ``timeout`` seconds.
        """
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        await self._open()
        self._ensure_listener()
        loop = asyncio.get_running_loop()
        deadline = None if limit is None else (limit, loop.time() + limit)
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

    # -- waiters: what wait() listens for -----------------------------------------

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
