"""The rows the named statements return, one type per shape.

Each statement of :class:`cyclone.sql.Queries` declares the type of its rows; the
shells of :mod:`cyclone.dbio` build them with a psycopg row factory that first checks
the statement's column names against the type's fields (a renamed or reordered column
fails at once, naming both lists), then makes each row positionally. Code outside
``cyclone.sql`` reads rows by attribute only. Statements read as the public records
(``Run``, ``Step``, ``Schedule``, the monitor's statistics) declare those records
instead (see :mod:`cyclone.records`).

Times are aware datetimes; durations named ``*_s`` are seconds, ``*_us`` microseconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

__all__ = [
    "BackendRow",
    "ChildDoneRow",
    "ChildStartRow",
    "ClaimRow",
    "CountRow",
    "DepRow",
    "DiscardRow",
    "EnqueuedRow",
    "FailedFireRow",
    "FanOutRow",
    "FiredRow",
    "GraphRow",
    "HeartbeatRow",
    "IdRow",
    "KeyIdRow",
    "KeyedEnqueuedRow",
    "NowRow",
    "OutputRow",
    "ParentRow",
    "PausedRow",
    "QueueRow",
    "ResumedRow",
    "RetryRow",
    "RunCancelledRow",
    "RunStateRow",
    "RunVersionRow",
    "ScheduleRow",
    "SignalRow",
    "SignalTimeoutRow",
    "SnoozeRow",
    "StateRow",
    "StepNameRow",
    "StepQueueRow",
    "StepRunRow",
    "SubmitKeyRow",
    "SweepRow",
    "TerminatedRow",
    "TextRow",
    "VersionRow",
    "WaitRow",
    "WokenEnqueuedRow",
]


class IdRow(NamedTuple):
    """The id of a row a statement changed or found (a step, a run or a signal)."""

    id: int


class KeyIdRow(NamedTuple):
    """The id of a schedule a statement changed."""

    id: str


class StepRunRow(NamedTuple):
    """A step and its run."""

    id: int
    run_id: int


class StepNameRow(NamedTuple):
    """A step a statement changed, with what a log line names of it."""

    id: int
    run_id: int
    node: str
    kind: str
    queue: str


class StepQueueRow(NamedTuple):
    """A step made claimable again, and its queue (for the wakeup)."""

    id: int
    queue: str


class SnoozeRow(NamedTuple):
    """A step given back by its handler's ``Snooze``, and its snoozes so far."""

    id: int
    snoozes: int


class QueueRow(NamedTuple):
    """A queue that received work."""

    queue: str


class TextRow(NamedTuple):
    """One JSON text (a fan-out's collected outputs)."""

    output: str | None


class StateRow(NamedTuple):
    """A run's state."""

    state: str


class RunStateRow(NamedTuple):
    """A locked run and its state."""

    id: int
    state: str


class NowRow(NamedTuple):
    """The database clock (``now()``: the transaction's start)."""

    now: datetime


class VersionRow(NamedTuple):
    """A schema version (a migration's number)."""

    version: int


class EnqueuedRow(NamedTuple):
    """An enqueued (or found) standalone run and its one step."""

    step_id: int
    run_id: int


class WokenEnqueuedRow(NamedTuple):
    """:class:`EnqueuedRow`, and whether the statement sent the queue's wakeup."""

    step_id: int
    run_id: int
    woke: bool


class KeyedEnqueuedRow(NamedTuple):
    """A run of an enqueue with submit keys: ``ord`` is its input's position (from 1)."""

    ord: int
    step_id: int
    run_id: int


class SubmitKeyRow(NamedTuple):
    """A run that holds ``submit_key``, its def_version, and its step (``None`` for a
    workflow run)."""

    submit_key: str
    step_id: int | None
    run_id: int
    def_version: str


class RunVersionRow(NamedTuple):
    """A workflow run that holds a submit key, and its def_version."""

    id: int
    def_version: str


class ClaimRow(NamedTuple):
    """A claimed step (``steps_claim``).

    ``input`` is the step's input (``None`` for a step with a data edge: assembled by
    the worker); ``run_input`` the run's input as JSON text for a workflow step whose
    input is not the run input, else ``None`` (then the run input is ``input``).
    ``timeout_s`` is seconds or ``None``; ``binding_nodes`` and ``binding_modes`` are a
    workflow step's input bindings in slot order (upstream node, assembly mode), or
    ``None``; ``binding_names`` their input names when they are named. ``fair``:
    whether the queue holds steps with a fairness key; a row whose ``id`` is ``None``
    claimed nothing and only says that the queue's mode is not the one the statement
    was run for (``steps_claim`` or ``steps_claim_fair``).
    """

    id: int
    run_id: int
    node: str
    kind: str
    input: Any
    run_input: str | None
    attempt: int
    max_attempts: int
    lease_generation: int
    timeout_s: float | None
    sequence_key: str | None
    workflow: str
    def_version: str
    input_from: str | None
    has_fan_out: bool
    binding_nodes: list[str] | None
    binding_modes: list[str] | None
    binding_names: list[str] | None
    reclaims: int
    traceparent: str | None
    fairness_key: str | None
    queue_latency_s: float
    fair: bool | None


class HeartbeatRow(NamedTuple):
    """A held step a heartbeat found: ``renewed``, or busy (locked elsewhere)."""

    id: int
    owner: str
    renewed: bool


class GraphRow(NamedTuple):
    """What a statement of the run graph did (``graph_*``, ``steps_complete``,
    ``runs_cancel_children``).

    ``id`` is a step the statement moved (``None`` for a row about the run only);
    ``run_finished`` says the run ``run_id`` ended; ``queues`` received claimable work;
    ``signals``, ``children`` and ``fan_outs`` ask for the wait scanner's parts.
    """

    id: int | None
    run_id: int
    run_finished: bool
    queues: list[str] | None
    signals: bool
    children: bool
    fan_outs: bool


class DiscardRow(NamedTuple):
    """What resolving a discard did: runs failed, runs completed, steps cancelled."""

    runs_failed: int
    runs_completed: int
    steps_cancelled: int


class OutputRow(NamedTuple):
    """An upstream step's output (JSON text)."""

    run_id: int
    node: str
    output: str | None


class SweepRow(NamedTuple):
    """A running step whose lease expired or whose timeout passed."""

    id: int
    run_id: int
    lease_generation: int
    reclaims: int
    timed_out: bool
    node: str
    kind: str
    queue: str


class SignalTimeoutRow(NamedTuple):
    """A signal wait past its timeout (``wait_for_s`` seconds)."""

    id: int
    run_id: int
    node: str
    wait_for_s: float


class FanOutRow(NamedTuple):
    """A reached fan-out node and its items' progress.

    ``over_type`` and ``over_length`` describe the upstream output it fans over;
    ``active`` counts items not finished; ``unfinished`` says an item is still to do.
    """

    id: int
    run_id: int
    node: str
    fan_out_parallel: int
    fan_out_max_bytes: int | None
    fan_out_max_items: int | None
    expanded: bool
    over_type: str | None
    over_length: int | None
    active: int
    unfinished: bool


class ChildStartRow(NamedTuple):
    """A child node whose child run is to be submitted, with its input's sources
    (``binding_names``: the input names of named bindings, else ``None``)."""

    id: int
    run_id: int
    node: str
    def_version: str
    binding_nodes: list[str] | None
    binding_modes: list[str] | None
    binding_names: list[str] | None
    input_from: str | None
    input: Any
    traceparent: str | None


class ChildDoneRow(NamedTuple):
    """A child node whose child run ended (``state``), with its result or error."""

    id: int
    run_id: int
    node: str
    child_needs_result: bool
    child_id: int
    state: str
    result: str | None
    error: str | None


class ParentRow(NamedTuple):
    """The parent of a child run left without its reason to run."""

    parent_run_id: int


class BackendRow(NamedTuple):
    """The server process of a transaction and the transaction's start."""

    pid: int
    xact_start: datetime


class TerminatedRow(NamedTuple):
    """Whether a server process was told to end."""

    terminated: bool


class RunCancelledRow(NamedTuple):
    """A run that a statement ended, and how many of its steps it cancelled."""

    run_id: int
    steps_cancelled: int


class PausedRow(NamedTuple):
    """A paused run and how many of its steps it parked."""

    run_id: int
    steps_paused: int


class ResumedRow(NamedTuple):
    """A resumed run; ``fan_outs``: a fan-out node or item task was restored."""

    run_id: int
    fan_outs: bool


class RetryRow(NamedTuple):
    """What an operator retry found and did (``runs_retry``).

    ``blocked`` are discarded nodes the retry would leave behind; ``node_found`` is
    false for an unknown node; ``child_runs`` are child runs to retry too.
    """

    steps_reset: int
    fan_outs: bool
    run_state: str
    blocked: list[str] | None
    node_found: bool
    child_runs: list[int] | None


class WaitRow(NamedTuple):
    """A signal wait node of a run (``signal_names`` for a wait on several)."""

    id: int
    run_id: int
    node: str
    state: str
    signal_name: str | None
    signal_names: list[str] | None
    wait_count: int | None


class SignalRow(NamedTuple):
    """A signal in a run's mailbox, not yet consumed."""

    id: int
    run_id: int
    name: str
    payload: Any


class ScheduleRow(NamedTuple):
    """A schedule locked for an update or leased to fire (durations in seconds;
    ``input`` JSON text; ``now`` the database clock)."""

    id: str
    kind: str
    def_version: str | None
    input: str
    cron_spec: str
    location: str
    next_run_at: datetime
    queue: str
    priority: int
    max_attempts: int
    timeout_s: float | None
    retention_s: float | None
    enabled: bool
    now: datetime


class FiredRow(NamedTuple):
    """A schedule whose fire was recorded."""

    schedule_id: str


class FailedFireRow(NamedTuple):
    """A schedule's failed fires in a row."""

    consecutive_failures: int


class DepRow(NamedTuple):
    """An edge of a run's graph: ``node`` runs after ``dep_node``."""

    node: str
    dep_node: str


class CountRow(NamedTuple):
    """How many rows a statement counted."""

    total: int
