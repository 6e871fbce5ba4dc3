"""Operator calls on a run (cancel, pause, resume, retry) as plans both clients run.

Each plan runs in one transaction that it starts with READ COMMITTED (the advance and
the restore rely on it, and a caller's pool may default to another level), locks the
run (``runs_lock``), changes it, and returns an :class:`Outcome`: its value, and the
wakeups and finished runs to announce after the commit. ``Client`` and ``SyncClient``
drive the same plans (with :func:`cyclone.dbio.run_plan_async` and ``run_plan_sync``)
and only differ in how they announce.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Generic, NoReturn, TypeVar

from cyclone.dbio import Plan, Stmt, int_array
from cyclone.errors import NotFoundError, StateError, ValidationError
from cyclone.graph import parse_advanced, restore_stmt
from cyclone.options import micros
from cyclone.sql import Q
from cyclone.sql.rows import GraphRow, IdRow, ResumedRow, RetryRow, StateRow
from cyclone.wakeups import NO_WAKEUPS, Wakeups

__all__ = [
    "Outcome",
    "cancel_plan",
    "cancel_stmts",
    "pause_plan",
    "resume_plan",
    "retry_plan",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a plan returned (``value``), and what to announce after its commit: the
    ``wakeups`` (queues, scanner passes) and the runs ``finished``."""

    value: T
    wakeups: Wakeups = NO_WAKEUPS
    finished: frozenset[int] = field(default_factory=frozenset)


def _lock(run_id: int) -> Stmt[IdRow]:
    return Stmt(Q.runs_lock, {"run_ids": int_array([run_id])})


def cancel_stmts(run_id: int) -> list[Stmt[Any]]:
    """Cancel a run and its active steps: lock the run, then ``runs_cancel``."""
    return [_lock(run_id), Stmt(Q.runs_cancel, {"run_id": run_id})]


def _refuse(run_id: int, why: str) -> Plan[NoReturn]:
    """Raise the error of an operator call that changed nothing: ``NotFoundError`` for
    no such run, else ``StateError`` with ``why`` formatted with the run's state."""
    rows: list[StateRow] = yield Stmt(Q.runs_state, {"run_id": run_id})
    if not rows:
        raise NotFoundError(f"run {run_id} does not exist")
    raise StateError(why.format(run_id=run_id, state=rows[0].state))


def cancel_plan(run_id: int) -> Plan[Outcome[None]]:
    """Cancel a running or paused run, its active steps and every run below it.

    Raises:
        NotFoundError: no run has that id.
        StateError: the run is already completed, failed or cancelled.
    """
    yield Stmt(Q.runs_read_committed)
    for stmt in cancel_stmts(run_id):
        rows = yield stmt
    if not rows:
        yield from _refuse(run_id, "run {run_id} is already {state}")
    return Outcome(None, finished=frozenset({run_id}))


def pause_plan(run_id: int) -> Plan[Outcome[None]]:
    """Pause a running run (``runs_pause``): nothing to announce (the run goes on).

    Raises:
        NotFoundError: no run has that id.
        StateError: the run is not running.
    """
    yield Stmt(Q.runs_read_committed)
    yield _lock(run_id)
    if not (yield Stmt(Q.runs_pause, {"run_id": run_id})):
        yield from _refuse(run_id, "run {run_id} cannot be paused: it is {state}, not running")
    return Outcome(None)


def resume_plan(run_id: int) -> Plan[Outcome[None]]:
    """Resume a paused run: ``runs_resume`` puts its paused steps back to pending and
    ``graph_restore`` reaches those whose parents all completed.

    Raises:
        NotFoundError: no run has that id.
        StateError: the run is not paused.
    """
    yield Stmt(Q.runs_read_committed)
    yield _lock(run_id)
    rows: list[ResumedRow] = yield Stmt(Q.runs_resume, {"run_id": run_id})
    if not rows:
        yield from _refuse(run_id, "run {run_id} cannot be resumed: it is {state}, not paused")
    restored = parse_advanced((yield restore_stmt(run_id)))
    return Outcome(None, restored.wakeups | Wakeups(fan_outs=rows[0].fan_outs))


def _retry_stmt(run_id: int, node: str | None, deadline: float | None) -> Stmt[RetryRow]:
    return Stmt(Q.runs_retry, {"run_id": run_id, "node": node, "deadline_us": micros(deadline)})


def _retry_row(run_id: int, node: str | None, row: RetryRow) -> tuple[int, bool]:
    """Read the ``runs_retry`` row: the steps reset, and whether a fan-out was.

    Raises:
        NotFoundError: no run has that id.
        ValidationError: ``node`` is not a node of the run.
        StateError: the run is paused, a discarded step would stay behind, or there is
            nothing to retry.
    """
    if row.run_state is None:
        raise NotFoundError(f"run {run_id} does not exist")
    if not row.node_found:
        raise ValidationError(f"run {run_id} has no node {node!r}")
    if row.run_state == "paused":
        raise StateError(f"run {run_id} is paused: resume it, then retry")
    if row.blocked:
        raise StateError(
            f"run {run_id}: discarded node(s) {row.blocked} would stay behind; "
            "retry them too (or the whole run)"
        )
    if not row.steps_reset:
        raise StateError(f"run {run_id} has no discarded or cancelled step to retry")
    return int(row.steps_reset), bool(row.fan_outs)


def retry_plan(run_id: int, node: str | None, deadline: float | None) -> Plan[Outcome[int]]:
    """Operator retry in the current transaction, the whole run tree included: a reset
    child node reopens its existing child run, retried the same way, so its own reset
    child nodes reopen theirs, down to the last level (docs/workflows.md, "Pause,
    resume and operator retry"). A grandchild left failed or cancelled would make its
    parent node fail again at once. ``deadline`` is seconds from now, or ``None``.

    Runs are locked and retried in ascending id order (a min-heap: a child run's id is
    larger than its parent's), the order of every other writer (runs_lock). Each run's
    reset steps go back to pending (``runs_retry``), then ``graph_restore`` reaches
    those whose parents all completed.

    Returns the number of steps reset, with the wakeups of every run reopened.

    Raises:
        NotFoundError, ValidationError, StateError: see :func:`_retry_row` (only for
            ``run_id``; a child run with nothing to retry is left alone).
    """
    yield Stmt(Q.runs_read_committed)
    yield _lock(run_id)
    row: RetryRow = (yield _retry_stmt(run_id, node, deadline))[0]
    reset, fan_outs = _retry_row(run_id, node, row)
    restored: list[GraphRow] = list((yield restore_stmt(run_id)))
    below = list(row.child_runs or ())
    heapq.heapify(below)
    seen = {run_id}
    while below:
        child = heapq.heappop(below)
        if child in seen:
            continue
        seen.add(child)
        yield _lock(child)
        child_row: RetryRow = (yield _retry_stmt(child, None, None))[0]
        if not child_row.steps_reset:
            continue  # a child with nothing to retry (completed, paused) is left alone
        reset += int(child_row.steps_reset)
        fan_outs = fan_outs or bool(child_row.fan_outs)
        restored.extend((yield restore_stmt(child)))
        for grandchild in child_row.child_runs or ():
            heapq.heappush(below, grandchild)
    return Outcome(reset, parse_advanced(restored).wakeups | Wakeups(fan_outs=fan_outs))
