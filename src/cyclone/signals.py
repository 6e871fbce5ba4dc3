"""Signals and their waits: delivery into the mailbox, and the waits they complete.

docs/design.md, Signals. A signal
``name`` goes to the one wait node of its run that declares it (``wait_signal``,
``wait_n``, ``wait_any``). It is stored only up to that wait's useful capacity (1, or N
for ``wait_n``) and only while the wait has not completed; otherwise ``signal`` returns
False. A wait that is ``waiting_signal`` with enough unconsumed signals completes in the
same transaction: the signals are marked consumed and the wait's output is the payload
(``wait_signal``), the list of payloads in arrival order (``wait_n``), or ``{"name",
"payload"}`` of the first (``wait_any``). Signals sent before the wait is reached stay
in the mailbox until it is (the wait scanner settles them).

The decisions are pure functions; the plans yield the statements (run by the async or
sync shells of :mod:`cyclone.dbio` inside one transaction, after the run row lock).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.dbio import Plan, Stmt, int_array
from cyclone.errors import NotFoundError, ValidationError
from cyclone.graph import Completion, advance_stmts, parse_advanced
from cyclone.sql import Q
from cyclone.sql.rows import GraphRow, RunStateRow, SignalRow, WaitRow
from cyclone.states import TERMINAL_STEP_STATES, RunState, StepState
from cyclone.wakeups import NO_WAKEUPS, Wakeups

__all__ = ["Settled", "SignalWait", "satisfied", "settle_plan", "signal_plan"]


@dataclass(frozen=True, slots=True)
class SignalWait:
    """A wait node that declares signal names (a ``signals_waits`` row)."""

    id: int
    run_id: int
    node: str
    state: str
    names: tuple[str, ...]
    wait_count: int | None  # wait_n's N; None for wait_signal and wait_any
    any_of: bool

    @property
    def capacity(self) -> int:
        """Signals the wait takes (and the mailbox keeps for it)."""
        return self.wait_count or 1

    @classmethod
    def from_row(cls, row: WaitRow) -> SignalWait:
        """Build from a ``signals_waits`` row."""
        return cls(
            id=row.id,
            run_id=row.run_id,
            node=row.node,
            state=row.state,
            names=tuple(row.signal_names) if row.signal_names else (row.signal_name or "",),
            wait_count=row.wait_count,
            any_of=row.signal_names is not None,
        )


@dataclass(frozen=True, slots=True)
class Settled:
    """What settling waits did: runs finished, what to wake, waits completed."""

    finished: frozenset[int] = frozenset()
    wakeups: Wakeups = NO_WAKEUPS
    completed: int = 0


def satisfied(wait: SignalWait, mailbox: Sequence[SignalRow]) -> tuple[list[int], str] | None:
    """If ``wait`` can complete from ``mailbox`` (the unconsumed signals of its run, in
    delivery order): the ids it consumes and its output as JSON text."""
    if wait.state != StepState.WAITING_SIGNAL:
        return None
    mine = [row for row in mailbox if row.name in wait.names][: wait.capacity]
    if len(mine) < wait.capacity:
        return None
    if wait.any_of:
        output: Any = {"name": mine[0].name, "payload": mine[0].payload}
    elif wait.wait_count is None:
        output = mine[0].payload
    else:
        output = [row.payload for row in mine]
    return [row.id for row in mine], json.dumps(output, separators=(",", ":"))


def settle_plan(run_ids: Sequence[int]) -> Plan[Settled]:
    """Complete every ``waiting_signal`` wait of ``run_ids`` (locked) that its mailbox
    satisfies, in the current transaction; a run that completes cancels its active child
    runs (``Settled.finished`` holds them too)."""
    ids = int_array(run_ids)
    wait_rows: list[WaitRow] = yield Stmt(Q.signals_waits, {"run_ids": ids})
    waits = [SignalWait.from_row(row) for row in wait_rows]
    signals: list[SignalRow] = yield Stmt(Q.signals_unconsumed, {"run_ids": ids})
    consumed: list[tuple[int, str]] = []
    items: list[Completion] = []
    for wait in waits:
        taken = {i for i, _ in consumed}
        mailbox = [s for s in signals if s.run_id == wait.run_id and s.id not in taken]
        decision = satisfied(wait, mailbox)
        if decision is None:
            continue
        signal_ids, output = decision
        consumed.extend((i, wait.node) for i in signal_ids)
        items.append(
            Completion(wait.id, wait.run_id, output, waiting=StepState.WAITING_SIGNAL.value)
        )
    if not items:
        return Settled()
    yield Stmt(
        Q.signals_consume,
        {"ids": [i for i, _ in consumed], "nodes": [n for _, n in consumed]},
    )
    rows: list[GraphRow] = []
    for stmt in advance_stmts(items):  # a run that completes cancels its child runs
        rows.extend((yield stmt))
    advanced = parse_advanced(rows)
    return Settled(advanced.finished, advanced.wakeups, len(advanced.done))


def signal_plan(run_id: int, name: str, payload: str) -> Plan[tuple[bool, Settled]]:
    """Deliver one signal (``payload`` is JSON text) in the current transaction.

    Returns whether the mailbox stored it, and what settling the run's waits did.

    Raises:
        NotFoundError: no run has that id.
        ValidationError: no wait node of the run declares ``name``.
    """
    yield Stmt(Q.runs_read_committed)  # a caller's pool may default to another level
    runs: list[RunStateRow] = yield Stmt(Q.signals_run_lock, {"run_id": run_id})
    if not runs:
        raise NotFoundError(f"run {run_id} does not exist")
    run_state = runs[0].state
    wait_rows: list[WaitRow] = yield Stmt(Q.signals_waits, {"run_ids": int_array([run_id])})
    waits = [SignalWait.from_row(row) for row in wait_rows]
    target = next((w for w in waits if name in w.names), None)
    if target is None:
        declared = sorted({n for w in waits for n in w.names})
        raise ValidationError(
            f"run {run_id} has no wait for signal {name!r} (its waits declare {declared})"
        )
    if run_state not in (RunState.RUNNING, RunState.PAUSED) or (
        StepState(target.state) in TERMINAL_STEP_STATES
    ):
        return False, Settled()
    mailbox: list[SignalRow] = yield Stmt(Q.signals_unconsumed, {"run_ids": int_array([run_id])})
    buffered = sum(1 for signal in mailbox if signal.name in target.names)
    if buffered >= target.capacity:
        return False, Settled()
    yield Stmt(Q.signals_insert, {"run_id": run_id, "name": name, "payload": payload})
    if target.state != StepState.WAITING_SIGNAL or buffered + 1 < target.capacity:
        return True, Settled()
    settled = yield from settle_plan([run_id])
    return True, settled
