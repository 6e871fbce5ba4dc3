"""Run and step states, and every legal move between them.

The values are the strings stored in ``cyclone_runs.state`` and ``cyclone_steps.state``.
:data:`STEP_TRANSITIONS` lists each move the engine makes and which part of the engine
makes it; every move is a CAS-guarded ``UPDATE`` in ``cyclone/sql``. The property-based
state-machine test checks the database against this table."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ACTIVE_STEP_STATES",
    "RUN_TRANSITIONS",
    "STEP_TRANSITIONS",
    "TERMINAL_RUN_STATES",
    "TERMINAL_STEP_STATES",
    "RunState",
    "StepState",
]


class RunState(StrEnum):
    """State of a run (``cyclone_runs.state``).

    A run starts ``running``; there is no persisted pending run state.
    """

    __module__ = "cyclone"

    RUNNING = "running"
    """Inserted by enqueue or submit; left by completion, failure, cancel or pause."""
    PAUSED = "paused"
    """Entered by ``pause``; left by ``resume`` or ``cancel``."""
    COMPLETED = "completed"
    """Entered when the last step of the run completes (terminal)."""
    FAILED = "failed"
    """Entered when a discard is fatal to the run (terminal; operator retry reopens)."""
    CANCELLED = "cancelled"
    """Entered by ``cancel`` (terminal)."""


class StepState(StrEnum):
    """State of a step (``cyclone_steps.state``)."""

    __module__ = "cyclone"

    PENDING = "pending"
    """Waiting for its dependencies; moved to ``available`` by the DAG advance."""
    AVAILABLE = "available"
    """Claimable once ``scheduled_at <= now()``; moved to ``running`` by a claim."""
    RUNNING = "running"
    """Held under a lease by one worker; left by completion, failure, sweep or release."""
    WAITING_SIGNAL = "waiting_signal"
    """A signal wait; completed by a signal or failed by its timeout."""
    WAITING_TIMER = "waiting_timer"
    """A timer wait; completed by the wait scanner at ``scheduled_at``."""
    WAITING_CHILD = "waiting_child"
    """A child node waiting for its child run."""
    PAUSED = "paused"
    """Held by a run pause; restored by ``resume``."""
    COMPLETED = "completed"
    """Finished with its output (terminal)."""
    DISCARDED = "discarded"
    """Failed for good: attempts, reclaims, snoozes or a ``Discard`` (terminal)."""
    CANCELLED = "cancelled"
    """Cancelled with its run or branch (terminal)."""


TERMINAL_STEP_STATES: frozenset[StepState] = frozenset(
    {StepState.COMPLETED, StepState.DISCARDED, StepState.CANCELLED}
)
"""States a step leaves only by an operator retry."""

ACTIVE_STEP_STATES: frozenset[StepState] = frozenset(StepState) - TERMINAL_STEP_STATES
"""'Active' for ``unique_key`` and ``sequence_key``: every state but the terminal ones."""

TERMINAL_RUN_STATES: frozenset[RunState] = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED}
)
"""States in which a run is finished (``finished_at`` set)."""

S = StepState
_CANCEL = "cancel of the run (or of its parent)"
_RETRY = (
    "operator retry: the steps it resets (graph_restore then reaches those with no "
    "unmet dependency)"
)

STEP_TRANSITIONS: dict[tuple[StepState, StepState], str] = {
    (S.PENDING, S.AVAILABLE): (
        "DAG advance: its last parent completed (completion transaction); graph_restore "
        "after a resume or an operator retry"
    ),
    (S.PENDING, S.WAITING_TIMER): "DAG advance or graph_restore reached a sleep node",
    (S.PENDING, S.WAITING_SIGNAL): "DAG advance or graph_restore reached a signal wait",
    (S.PENDING, S.WAITING_CHILD): "DAG advance or graph_restore reached a child node",
    (S.PENDING, S.COMPLETED): (
        "fan-out scanner: every item of the fan-out node completed (or its list was empty)"
    ),
    (S.PENDING, S.DISCARDED): (
        "fan-out scanner: the node's input is not a list, or over max_items or max_bytes; "
        "an item of the node discarded (discard transaction)"
    ),
    (S.WAITING_CHILD, S.COMPLETED): "child scanner: the child run completed",
    (S.WAITING_CHILD, S.DISCARDED): (
        "child scanner: the child run failed or was cancelled, or its input cannot be built"
    ),
    (S.WAITING_TIMER, S.COMPLETED): "wait scanner: scheduled_at passed",
    (S.WAITING_SIGNAL, S.COMPLETED): "signal delivery or wait scanner: the mailbox holds enough",
    (S.WAITING_SIGNAL, S.DISCARDED): "wait scanner: the wait's timeout passed (signal_timeout)",
    (S.PENDING, S.PAUSED): "pause of the run; the advance parks a node it reaches in a paused run",
    (S.AVAILABLE, S.PAUSED): "pause of the run",
    (S.RUNNING, S.PAUSED): "failed attempt, snooze, reclaim or release while the run is paused",
    (S.PAUSED, S.PENDING): (
        "resume: every paused step, in the resume transaction (graph_restore then reaches "
        "those with no unmet dependency)"
    ),
    (S.PAUSED, S.DISCARDED): "an item of a paused run's fan-out node discarded",
    (S.DISCARDED, S.PENDING): _RETRY,
    (S.CANCELLED, S.PENDING): _RETRY,
    (S.AVAILABLE, S.RUNNING): "claim (worker)",
    (S.RUNNING, S.COMPLETED): "completion (worker, in the completion transaction)",
    (S.RUNNING, S.AVAILABLE): (
        "failed attempt with retries left (worker, backoff via scheduled_at); "
        "Snooze raised under the kind's max_snoozes (worker, snoozes + 1, due at "
        "scheduled_at, no attempt); "
        "recovery sweep (lease expired or timeout passed, reclaims + 1); "
        "release at graceful shutdown, sequence-gate recheck or def_version mismatch "
        "(no count)"
    ),
    (S.RUNNING, S.DISCARDED): (
        "last attempt failed, Discard raised, or Snooze raised past max_snoozes "
        "(worker, snooze_limit); reclaim limit (sweep)"
    ),
    (S.RUNNING, S.CANCELLED): f"{_CANCEL}, or fail-fast of its run",
    (S.AVAILABLE, S.CANCELLED): f"{_CANCEL}, or fail-fast of its run",
    (S.PENDING, S.CANCELLED): (f"{_CANCEL} or fail-fast; cancel_branch below a discard"),
    **{
        (state, S.CANCELLED): _CANCEL
        for state in (S.PAUSED, S.WAITING_SIGNAL, S.WAITING_TIMER, S.WAITING_CHILD)
    },
}
"""Every legal step move, with the part of the engine that makes it."""

R = RunState
RUN_TRANSITIONS: dict[tuple[RunState, RunState], str] = {
    (R.RUNNING, R.COMPLETED): (
        "no active step left: its last step completed (completion transaction) or a "
        "contained discard cancelled the rest (discard transaction)"
    ),
    (R.RUNNING, R.CANCELLED): (
        "cancel; a child run whose parent run ended (or cancelled its child node), in the "
        "transaction that ended it (runs_cancel_children), or by the orphan scanner"
    ),
    (R.RUNNING, R.FAILED): (
        "a fatal discard, or a contained one that lost the result node (worker, sweep or "
        "wait scanner, under the run row lock); deadline_at passed (wait scanner)"
    ),
    (R.PAUSED, R.CANCELLED): "cancel; a paused child run whose parent run ended",
    (R.RUNNING, R.PAUSED): "pause",
    (R.PAUSED, R.RUNNING): "resume",
    (R.PAUSED, R.COMPLETED): "its last step finished during the pause",
    (R.PAUSED, R.FAILED): "a fatal discard during the pause",
    (R.FAILED, R.RUNNING): "operator retry",
    (R.CANCELLED, R.RUNNING): "operator retry",
    (R.COMPLETED, R.RUNNING): "operator retry of a contained failure",
}
"""Every legal run move, with the part of the engine that makes it."""

del S, R
