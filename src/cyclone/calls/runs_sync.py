"""Run calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.runs`."""

from __future__ import annotations

import time
from typing import Any, TypeVar

import psycopg

from cyclone.calls.base import SyncCalls, wait_pause
from cyclone.config import list_runs_params
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import Plan, Stmt, fetch_dicts_sync, run_plan_sync
from cyclone.errors import (
    NotFoundError,
)
from cyclone.monitor import QueueStats, queue_stats_sync
from cyclone.notify import RUN_DONE, runs_in_payload
from cyclone.options import Duration, check_text, seconds
from cyclone.records import Run, RunRef, Step, run_id_of
from cyclone.scanners.purge import purge_sync
from cyclone.sql import Q
from cyclone.states import RunState

__all__ = ["SyncRunCalls"]

T = TypeVar("T")


class SyncRunCalls(SyncCalls):
    """Run calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.runs`."""

    def get_run(self, run: RunRef) -> Run:
        """The run with its result and error (see ``Client.get_run``).

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.runs_get, {"run_id": run_id}))
        if not rows:
            raise NotFoundError(f"run {run_id} does not exist")
        return Run.from_row(rows[0])

    def list_runs(
        self,
        state: RunState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[Run]:
        """Runs, newest first; ``before`` pages below a run id.

        Raises:
            ValidationError: an unknown state, a bad limit, ``before`` or workflow.
        """
        params = list_runs_params(state, workflow, limit, before)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.runs_list, params))
        return [Run.from_row(row) for row in rows]

    def list_steps(self, run: RunRef) -> list[Step]:
        """Every step of a run, in insertion order (empty for an unknown run).

        Raises:
            ValidationError: not a run id or handle.
        """
        run_id = run_id_of(run)
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.steps_list, {"run_id": run_id}))
        return [Step.from_row(row) for row in rows]

    def cancel(self, run: RunRef) -> None:
        """Cancel a running or paused run and its active steps (see ``Client.cancel``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is already completed, failed or cancelled.
        """
        self._operate(cancel_plan(run_id_of(run)))

    def pause(self, run: RunRef) -> None:
        """Pause a running run (see ``Client.pause``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not running.
        """
        self._operate(pause_plan(run_id_of(run)))

    def resume(self, run: RunRef) -> None:
        """Resume a paused run (see ``Client.resume``).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not paused.
        """
        self._operate(resume_plan(run_id_of(run)))

    def retry(
        self, run: RunRef, node: str | None = None, *, deadline: Duration | None = None
    ) -> int:
        """Operator retry of discarded and cancelled steps (see ``Client.retry``).

        Raises:
            NotFoundError: no run has that id.
            StateError: nothing to retry.
            ValidationError: a bad node or deadline.
        """
        if node is not None:
            check_text(node, "node")
        limit = seconds(deadline, "deadline")
        return self._operate(retry_plan(run_id_of(run), node, limit))

    def _operate(self, plan: Plan[Outcome[T]]) -> T:
        """Run an operator plan in one transaction; after the commit, publish its
        wakeups and finished runs on the same connection; its value. A sync client runs
        no scanner: the scanner passes an outcome asks for come from the engines'
        polling."""
        with self._connection() as conn:
            if not conn.autocommit:
                conn.commit()
            with conn.transaction():
                outcome = run_plan_sync(conn, plan)
            if outcome.wakeups.queues or outcome.finished:
                self._publish(conn, outcome.wakeups.queues, outcome.finished)
        return outcome.value

    def purge(self, older_than: Duration | None = None) -> int:
        """Delete terminal runs past their retention now (see ``Client.purge``).

        Raises:
            ValidationError: a negative ``older_than``.
        """
        limit = seconds(older_than, "older_than", allow_zero=True)
        with self._connection() as conn:
            return purge_sync(conn, limit)

    def stats(self) -> dict[str, QueueStats]:
        """Depth and age of every queue with unfinished work (see ``Client.stats``)."""
        with self._connection() as conn:
            return {q.queue: q for q in queue_stats_sync(conn)}

    def wait(self, run: RunRef, timeout: Duration | None = None) -> Run:
        """Block until the run is terminal (see ``Client.wait``).

        Listens on ``cyclone_run_done`` on a connection of its own while it waits (unless
        ``notify=False``), and polls every ``poll_interval`` in any case.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: a bad run reference or timeout.
            WaitTimeout: not terminal within ``timeout`` seconds.
        """
        run_id = run_id_of(run)
        limit = seconds(timeout, "timeout", allow_zero=True)
        deadline = None if limit is None else (limit, time.monotonic() + limit)
        listen: psycopg.Connection[Any] | None = None
        try:
            if self.config.notify and self.settings.can_listen:
                try:
                    listen = psycopg.connect(self._listen_conninfo, autocommit=True)
                    listen.execute(Q.notify_listen_done)
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
