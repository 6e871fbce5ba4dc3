"""The run graph: completing steps of workflow runs and moving their runs along.

Every part of the engine that completes a step of a workflow run (the worker's
completion transaction, the timer, fan-out and child parts of the wait scanner, signal
delivery) describes it as a :class:`Completion`, builds its statements with
:func:`advance_stmts` and reads what happened as an :class:`Advanced` with
:func:`parse_advanced`; resume and operator retry reach their restored steps with
:func:`restore_stmt`. The SQL is ``cyclone/sql/graph.sql``, built on the functions and
the view of migration 5: the state a reached node enters and which dependencies are
unmet are written once there.

What an advance asks of the engine after its commit is a
:class:`cyclone.wakeups.Wakeups`: the queues that received work, and whether the wait
scanner has something to do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.dbio import Results, Stmt, int_array
from cyclone.sql import Q
from cyclone.sql.rows import GraphRow
from cyclone.wakeups import NO_WAKEUPS, Wakeups

__all__ = [
    "Advanced",
    "Completion",
    "advance_stmts",
    "cancel_children_stmt",
    "completion_params",
    "expand_stmt",
    "parse_advanced",
    "restore_stmt",
]


@dataclass(frozen=True, slots=True)
class Completion:
    """One step to complete with its ``output`` (JSON text; ``None`` stores NULL).

    A held step names its lease (``owner``, ``generation``): the CAS completes it only
    while that lease holds. A wait completed by a scanner or by a signal names instead
    the state its CAS expects (``waiting``: ``waiting_timer``, ``waiting_signal``,
    ``waiting_child``, or ``pending`` for a fan-out node). ``fan_out`` and ``children``
    say whether the run's definition may have fan-out or child nodes (``True`` when
    unknown): then the same transaction expands the fan-out nodes the completion reached
    and, if the run ended, cancels its active child runs.
    """

    step_id: int
    run_id: int
    output: str | None = None
    owner: str | None = None
    generation: int | None = None
    waiting: str | None = None
    fan_out: bool = True
    children: bool = True


@dataclass(frozen=True, slots=True)
class Advanced:
    """What completing steps did: the ids of the steps ``done``, the runs ``finished``
    (child runs cancelled with them included), and the :class:`Wakeups` to send."""

    done: frozenset[int] = frozenset()
    finished: frozenset[int] = frozenset()
    wakeups: Wakeups = NO_WAKEUPS


def completion_params(completions: Sequence[Completion], prefix: str = "") -> dict[str, Any]:
    """The completions as the aligned array parameters of ``graph_advance`` (``ids``,
    ``generations``, ``owners``, ``outputs``, ``waiting``), or with ``prefix="job_"``
    those of ``steps_complete`` for held steps of standalone runs (no ``waiting``)."""
    params: dict[str, Any] = {
        f"{prefix}ids": [c.step_id for c in completions],
        f"{prefix}generations": [c.generation for c in completions],
        f"{prefix}owners": [c.owner for c in completions],
        f"{prefix}outputs": [c.output for c in completions],
    }
    if not prefix:
        params["waiting"] = [c.waiting for c in completions]
    return params


def advance_stmts(completions: Sequence[Completion]) -> list[Stmt[GraphRow]]:
    """The statements that complete ``completions`` and advance their runs, for a
    transaction that holds the runs' row locks (``runs_lock``, or SKIP LOCKED).

    ``graph_advance``; then ``graph_expand_fan_outs`` for runs that may have fan-out
    nodes; then ``runs_cancel_children`` for runs that may have child nodes. Read all
    their results with :func:`parse_advanced`.
    """
    stmts = [Stmt(Q.graph_advance, completion_params(completions))]
    fan_out_runs = {c.run_id for c in completions if c.fan_out}
    if fan_out_runs:
        stmts.append(expand_stmt(fan_out_runs))
    parents = {c.run_id for c in completions if c.children}
    if parents:
        stmts.append(cancel_children_stmt(parents))
    return stmts


def expand_stmt(run_ids: Iterable[int]) -> Stmt[GraphRow]:
    """Insert the item tasks of fan-out nodes of ``run_ids`` reached by the completions
    before it in the transaction (``graph_expand_fan_outs``)."""
    return Stmt(Q.graph_expand_fan_outs, {"fan_out_runs": int_array(run_ids)})


def cancel_children_stmt(run_ids: Iterable[int]) -> Stmt[GraphRow]:
    """Cancel the active child runs (and all active below them) of ``run_ids``, locked
    runs that ended, or whose child node ended, in this transaction
    (``runs_cancel_children``); :func:`parse_advanced` reads its rows as finished runs."""
    return Stmt(Q.runs_cancel_children, {"ended_runs": int_array(run_ids)})


def restore_stmt(run_id: int) -> Stmt[GraphRow]:
    """Reach again the pending steps of ``run_id`` whose parents all completed
    (``graph_restore``), after resume or retry put them back to pending."""
    return Stmt(Q.graph_restore, {"run_id": run_id})


def parse_advanced(results: Results | Iterable[GraphRow]) -> Advanced:
    """Read what statements of the run graph did: ``steps_complete``, ``graph_advance``,
    ``graph_expand_fan_outs``, ``graph_restore`` and ``runs_cancel_children``, whose
    rows are all :class:`GraphRow` (a row with no id moved no step of its own).

    ``results`` is a batch's :class:`Results` (its graph rows are read, whatever else
    it holds) or the rows themselves.
    """
    rows = results.typed(GraphRow) if isinstance(results, Results) else results
    done: set[int] = set()
    finished: set[int] = set()
    queues: set[str] = set()
    signals = children = fan_outs = False
    for row in rows:
        if row.id is not None:
            done.add(row.id)
        if row.run_finished:
            finished.add(row.run_id)
        if row.queues:
            queues.update(row.queues)
        signals |= row.signals
        children |= row.children
        fan_outs |= row.fan_outs
    return Advanced(
        frozenset(done),
        frozenset(finished),
        Wakeups(frozenset(queues), signals, children, fan_outs),
    )
