"""The rows of the web dashboard's statements (``cyclone/sql/dashboard.sql``), one
type per shape, declared beside the engine's in :mod:`cyclone.sql.rows`.

Times are aware datetimes; ages and durations are seconds (float). The dashboard reads
them through :mod:`cyclone.dashboard.queries` only.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

__all__ = [
    "ActiveRunsRow",
    "ChildRunRow",
    "CreatedRow",
    "EdgeRow",
    "FailureRow",
    "ItemCountRow",
    "ItemLineRow",
    "KindFinishedRow",
    "KindLineRow",
    "LiveStatesRow",
    "MailboxRow",
    "MinuteRow",
    "RunLineRow",
    "RunPageRow",
    "ScheduleLineRow",
    "StepLineRow",
    "StepValuesRow",
    "UnservedRow",
    "ValueRow",
    "WorkerRow",
]


class ActiveRunsRow(NamedTuple):
    """How many runs are running and paused."""

    running: int
    paused: int


class MinuteRow(NamedTuple):
    """Steps completed and discarded in one minute (its start, epoch seconds)."""

    minute: float
    completed: int
    failed: int


class UnservedRow(NamedTuple):
    """A kind no running worker serves: its claimable steps and the oldest one's age."""

    kind: str
    available: int
    oldest_available_age: float | None


class FailureRow(NamedTuple):
    """A failed run and its error (cut)."""

    id: int
    workflow: str
    finished_at: datetime | None
    error: str | None


class RunLineRow(NamedTuple):
    """A run as ``/runs`` lists it."""

    id: int
    workflow: str
    state: str
    created_at: datetime
    finished_at: datetime | None
    submit_key: str | None
    parent_run_id: int | None
    error: str | None
    duration: float | None


class CreatedRow(NamedTuple):
    """When a run was created."""

    created_at: datetime


class RunPageRow(NamedTuple):
    """A run as its page shows it, with the database clock."""

    id: int
    workflow: str
    state: str
    def_version: str
    submit_key: str | None
    parent_run_id: int | None
    parent_node_id: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    deadline_at: datetime | None
    paused_at: datetime | None
    error: str | None
    duration: float | None
    db_now: datetime


class StepLineRow(NamedTuple):
    """A step of a run page (its DAG node and its line in the steps table)."""

    id: int
    node: str
    kind: str
    state: str
    queue: str
    attempt: int
    max_attempts: int
    reclaims: int
    created_at: datetime
    scheduled_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    duration: float | None
    lease_owner: str | None
    lease_expiry: datetime | None
    heartbeat_at: datetime | None
    error: str | None
    error_kind: str | None
    signal_name: str | None
    signal_names: list[str] | None
    wait_count: int | None
    wait_for: float | None
    fan_out: bool
    child_workflow: str | None


class ItemCountRow(NamedTuple):
    """Item tasks of one fan-out node in one state."""

    item_of: str
    state: str
    steps: int


class EdgeRow(NamedTuple):
    """An edge of a run's DAG: ``node`` runs after ``dep_node``."""

    node: str
    dep_node: str
    dep_type: str


class ChildRunRow(NamedTuple):
    """The child run a node of a run started."""

    node: str
    id: int
    state: str


class MailboxRow(NamedTuple):
    """Signals of one name in a run's mailbox: received, and not yet consumed."""

    name: str
    received: int
    unread: int


class LiveStatesRow(NamedTuple):
    """What a run page polls: the run's state, ``{node: state}`` and ``{fan-out node:
    "done/total"}``."""

    run_state: str
    nodes: dict[str, str]
    items: dict[str, str]


class StepValuesRow(NamedTuple):
    """A step with its values cut, and each value's full length."""

    id: int
    run_id: int
    node: str
    item_of: str | None
    item_index: int | None
    kind: str
    queue: str
    state: str
    attempt: int
    max_attempts: int
    reclaims: int
    error_kind: str | None
    lease_owner: str | None
    lease_expiry: datetime | None
    started_at: datetime | None
    completed_at: datetime | None
    input: str | None
    input_chars: int | None
    output: str | None
    output_chars: int | None
    error: str | None
    error_chars: int | None
    panic_stack: str | None
    panic_stack_chars: int | None


class ValueRow(NamedTuple):
    """One value of a step, in full."""

    value: str | None


class ItemLineRow(NamedTuple):
    """An item task of a fan-out node."""

    id: int
    node: str
    state: str
    item_index: int | None
    attempt: int
    reclaims: int
    started_at: datetime | None
    completed_at: datetime | None
    duration: float | None
    error: str | None


class KindLineRow(NamedTuple):
    """Steps of one kind in one claimable, running or waiting state."""

    kind: str
    state: str
    steps: int
    oldest_available_age: float | None
    expired_leases: int


class KindFinishedRow(NamedTuple):
    """Steps of one kind completed and discarded over the last minutes."""

    kind: str
    completed: int
    failed: int


class WorkerRow(NamedTuple):
    """A worker as the leases of its running steps show it."""

    owner: str | None
    queues: list[str]
    held: int
    last_heartbeat: datetime | None
    next_expiry: datetime | None
    expired: int


class ScheduleLineRow(NamedTuple):
    """A schedule with the state of its last run."""

    id: str
    target: str
    queue: str
    enabled: bool
    cron: str
    location: str
    next_run_at: datetime
    last_run_id: int | None
    last_run_state: str | None
    last_run_at: datetime | None
    last_error: str | None
    consecutive_failures: int


def as_dict(row: Any) -> dict[str, Any]:
    """A row as a dict of its fields."""
    return dict(row._asdict())
