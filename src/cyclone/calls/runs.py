"""Run calls of both clients: inspection, operator control, purge and stats (scripts:
see :mod:`cyclone.calls.effects`; ``wait`` is each shell's own)."""

from __future__ import annotations

from typing import TypeVar

from cyclone.calls.effects import Announce, CallsCore, Own, Script, fetch, fetch_one, twin
from cyclone.config import list_runs_params
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import Plan, Stmt
from cyclone.options import Duration, check_int, check_text, seconds
from cyclone.records import QueueStats, Run, RunRef, Step, run_id_of
from cyclone.scanners.purge import PURGE_BATCH, purge_plan
from cyclone.sql import Q
from cyclone.states import RunState

__all__ = ["RunCalls", "get_run_plan"]

T = TypeVar("T")


def get_run_plan(run_id: int) -> Plan[Run]:
    """Read one run with its result and error.

    Raises:
        NotFoundError: no run has that id.
    """
    return fetch_one(Stmt(Q.runs_get, {"run_id": run_id}), f"run {run_id} does not exist")


def _operate(plan: Plan[Outcome[T]]) -> Script[T]:
    """An operator plan in one transaction on an engine connection; its outcome
    announced after the commit; its value."""
    outcome: Outcome[T] = yield Own(plan, atomic=True, engine=True)
    yield Announce.of(outcome.wakeups, outcome.finished)
    return outcome.value


class RunCalls(CallsCore):
    """Run calls: inspection, operator control, purge and stats."""

    @twin
    def get_run(self, run: RunRef) -> Script[Run]:
        """The run with its result and error.

        Raises:
            NotFoundError: no run has that id.
            ValidationError: not a run id or handle.
        """
        found: Run = yield Own(get_run_plan(run_id_of(run)))
        return found

    @twin
    def list_runs(
        self,
        state: RunState | str | None = None,
        workflow: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> Script[list[Run]]:
        """Runs, newest first; ``before`` pages below a run id.

        Raises:
            ValidationError: an unknown state, a bad limit, ``before`` or workflow.
        """
        params = list_runs_params(state, workflow, limit, before)
        runs: list[Run] = yield Own(fetch(Stmt(Q.runs_list, params)))
        return runs

    @twin
    def list_steps(self, run: RunRef) -> Script[list[Step]]:
        """Every step of a run, in insertion order (empty for an unknown run).

        Raises:
            ValidationError: not a run id or handle.
        """
        steps: list[Step] = yield Own(fetch(Stmt(Q.steps_list, {"run_id": run_id_of(run)})))
        return steps

    @twin
    def get_step(self, step_id: int) -> Script[Step]:
        """One step by its id (the ``step_id`` of a job handle, of ``ctx`` or of an
        engine log line), as :meth:`list_steps` shows it.

        Raises:
            NotFoundError: no step has that id.
            ValidationError: ``step_id`` is not a positive integer.
        """
        check_int(step_id, "step id", 1, 2**63 - 1)
        plan = fetch_one(Stmt(Q.steps_get, {"step_id": step_id}), f"step {step_id} does not exist")
        found: Step = yield Own(plan)
        return found

    @twin
    def cancel(self, run: RunRef) -> Script[None]:
        """Cancel a running or paused run and its active steps.

        A step still in its handler learns it at its next heartbeat; its completion is
        then ignored.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is already completed, failed or cancelled.
        """
        yield from _operate(cancel_plan(run_id_of(run)))

    @twin
    def pause(self, run: RunRef) -> Script[None]:
        """Pause a running run: no new step of it is claimed; running steps finish.

        Pending and available steps become ``paused``; waiting steps keep waiting, and
        their timeouts and the run's deadline move forward by the pause length at
        :meth:`resume`.

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not running.
        """
        yield from _operate(pause_plan(run_id_of(run)))

    @twin
    def resume(self, run: RunRef) -> Script[None]:
        """Resume a paused run (see :meth:`pause`).

        Raises:
            NotFoundError: no run has that id.
            StateError: the run is not paused.
        """
        yield from _operate(resume_plan(run_id_of(run)))

    @twin
    def retry(
        self, run: RunRef, node: str | None = None, *, deadline: Duration | None = None
    ) -> Script[int]:
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
        reset: int = yield from _operate(retry_plan(run_id_of(run), node, limit))
        return reset

    @twin
    def purge(self, older_than: Duration | None = None) -> Script[int]:
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
        total = 0
        while True:  # one transaction per batch
            deleted: int = yield Own(purge_plan(limit, PURGE_BATCH), atomic=True, engine=True)
            total += deleted
            if deleted < PURGE_BATCH:
                return total

    @twin
    def stats(self) -> Script[dict[str, QueueStats]]:
        """Depth, age and pause of every queue with unfinished work or paused
        (``cyclone_queues_v1``).

        Returns:
            queue name -> :class:`QueueStats` (available, running and waiting counts,
            seconds since the oldest claimable step became due, expired leases,
            whether the queue is paused), in name order.
        """
        queues: list[QueueStats] = yield Own(fetch(Stmt(Q.monitor_queues)), engine=True)
        return {q.queue: q for q in queues}
