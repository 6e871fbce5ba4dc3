"""What the parts of the wait scanner share: settling steps of runs they hold locked.

Each part of a pass (timers, signals, deadlines, fan-outs, children) works in its own
transaction on runs it locked with ``SKIP LOCKED``, completes or discards steps there
through the statements of the run graph, and gathers in a :class:`Settlement` what to
announce once that transaction commits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cyclone.dbio import Stmt, batch_async, fetch_async
from cyclone.graph import Advanced, Completion, advance_stmts, cancel_children_stmt, parse_advanced
from cyclone.observability.logs import step_log
from cyclone.sql import Q
from cyclone.states import StepState
from cyclone.wakeups import NO_WAKEUPS, Wakeups

__all__ = ["Settlement", "StepOfRun", "advance", "end_children"]

log = logging.getLogger("cyclone.waits")


@dataclass(slots=True)
class Settlement:
    """What a part of a pass changed (``changed``: steps completed, discarded, started
    or released), the runs it ``finished`` and the ``wakeups`` to send after its
    commit."""

    changed: int = 0
    finished: set[int] = field(default_factory=set)
    wakeups: Wakeups = NO_WAKEUPS

    def add(self, advanced: Advanced) -> None:
        """Count what an advance did."""
        self.changed += len(advanced.done)
        self.finished |= advanced.finished
        self.wakeups |= advanced.wakeups

    async def discard(
        self, conn: Any, step: StepOfRun, waiting: StepState, error_kind: str, error: str
    ) -> None:
        """Discard ``step`` of a locked run, which waits in state ``waiting``
        (``steps_discard_waiting``), then resolve its run (``graph_resolve_discard``)
        and cancel the child runs of what that ended; counted when the CAS held."""
        params = {"id": step.id, "waiting": waiting.value, "error_kind": error_kind, "error": error}
        changed = await fetch_async(conn, Stmt(Q.steps_discard_waiting, params))
        if not changed:
            return
        step_log(log, changed[0]).warning("discarded: %s", error)
        resolve = Stmt(Q.graph_resolve_discard, {"run_id": step.run_id, "step_id": step.id})
        (outcome,) = await fetch_async(conn, resolve)
        if outcome.runs_failed or outcome.runs_completed:
            self.finished.add(step.run_id)
        if any(outcome):  # the run, or a branch (a child node's), ended
            self.finished |= await end_children(conn, [step.run_id])
        self.changed += 1


class StepOfRun(Protocol):
    """A row naming a step (``id``) and its run (``run_id``)."""

    @property
    def id(self) -> int: ...

    @property
    def run_id(self) -> int: ...


async def advance(conn: Any, completions: Sequence[Completion]) -> Advanced:
    """Complete waits (or fan-out nodes) of locked runs and advance the runs, in the
    current transaction (:func:`cyclone.graph.advance_stmts`)."""
    return parse_advanced(await batch_async(conn, advance_stmts(completions), transaction=False))


async def end_children(conn: Any, run_ids: Iterable[int]) -> set[int]:
    """Cancel the active child runs of ``run_ids`` (locked in this transaction) whose
    parent run or child node ended; the ids of the runs cancelled."""
    ids = set(run_ids)
    if not ids:
        return set()
    cancelled = parse_advanced(await fetch_async(conn, cancel_children_stmt(ids))).finished
    if cancelled:
        log.info("child runs %s cancelled: their parent ended", sorted(cancelled))
    return set(cancelled)
