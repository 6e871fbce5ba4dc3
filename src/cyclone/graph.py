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

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cyclone.dbio import Rows, Stmt, int_array
from cyclone.sql import Q
from cyclone.wakeups import NO_WAKEUPS, Wakeups

__all__ = [
    "Advanced",
    "Completion",
    "advance_stmts",
    "cancel_children_stmt",
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

    def json(self) -> str:
        """``[id, generation, owner, output, waiting]``, the element graph_advance reads."""
        generation = "null" if self.generation is None else self.generation
        owner = "null" if self.owner is None else json.dumps(self.owner)
        output = "null" if self.output is None else self.output
        waiting = "null" if self.waiting is None else json.dumps(self.waiting)
        return f"[{self.step_id},{generation},{owner},{output},{waiting}]"


@dataclass(frozen=True, slots=True)
class Advanced:
    """What completing steps did: the ids of the steps ``done``, the runs ``finished``
    (child runs cancelled with them included), and the :class:`Wakeups` to send."""

    done: frozenset[int] = frozenset()
    finished: frozenset[int] = frozenset()
    wakeups: Wakeups = NO_WAKEUPS


def completions_json(completions: Iterable[Completion]) -> str:
    """The completions as the one JSON text parameter of ``graph_advance`` (and, for
    held steps of standalone runs, ``steps_complete``)."""
    return f"[{','.join(c.json() for c in completions)}]"


def advance_stmts(completions: Sequence[Completion]) -> list[Stmt]:
    """The statements that complete ``completions`` and advance their runs, for a
    transaction that holds the runs' row locks (``runs_lock``, or SKIP LOCKED).

    ``graph_advance``; then ``graph_expand_fan_outs`` for runs that may have fan-out
    nodes; then ``runs_cancel_children`` for runs that may have child nodes. Read all
    their results with :func:`parse_advanced`.
    """
    stmts = [Stmt(Q.graph_advance, {"completions": completions_json(completions)})]
    fan_out_runs = {c.run_id for c in completions if c.fan_out}
    if fan_out_runs:
        stmts.append(expand_stmt(fan_out_runs))
    parents = {c.run_id for c in completions if c.children}
    if parents:
        stmts.append(cancel_children_stmt(parents))
    return stmts


def expand_stmt(run_ids: Iterable[int]) -> Stmt:
    """Insert the item tasks of fan-out nodes of ``run_ids`` reached by the completions
    before it in the transaction (``graph_expand_fan_outs``)."""
    return Stmt(Q.graph_expand_fan_outs, {"fan_out_runs": int_array(run_ids)})


def cancel_children_stmt(run_ids: Iterable[int]) -> Stmt:
    """Cancel the active child runs (and all active below them) of ``run_ids``, locked
    runs that ended, or whose child node ended, in this transaction
    (``runs_cancel_children``); :func:`parse_advanced` reads its rows as finished runs."""
    return Stmt(Q.runs_cancel_children, {"ended_runs": int_array(run_ids)})


def restore_stmt(run_id: int) -> Stmt:
    """Reach again the pending steps of ``run_id`` whose parents all completed
    (``graph_restore``), after resume or retry put them back to pending."""
    return Stmt(Q.graph_restore, {"run_id": run_id})


def parse_advanced(results: Iterable[Rows]) -> Advanced:
    """Read the results of statements that return graph rows: ``steps_complete``,
    ``graph_advance``, ``graph_expand_fan_outs``, ``graph_restore`` and
    ``runs_cancel_children``, all of the shape ``(id, run_id, run_finished, queues,
    signals, children, fan_outs)`` (a row with no id moved no step of its own)."""
    done: set[int] = set()
    finished: set[int] = set()
    queues: set[str] = set()
    signals = children = fan_outs = False
    for rows in results:
        for row in rows:
            step_id, run_id, run_finished, woken, signal, child, fan_out = row
            if step_id is not None:
                done.add(step_id)
            if run_finished:
                finished.add(run_id)
            if woken:
                queues.update(woken)
            signals |= signal
            children |= child
            fan_outs |= fan_out
    return Advanced(
        frozenset(done),
        frozenset(finished),
        Wakeups(frozenset(queues), signals, children, fan_outs),
    )
