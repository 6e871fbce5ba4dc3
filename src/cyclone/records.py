"""The records producer and inspection calls return: ``Enqueued``, ``Submitted``,
``Run``, ``Step``, ``Schedule``, and the monitor's ``StepInfo``, ``QueueStats`` and
``KindStats``.

All are frozen dataclasses; those read from the database are the declared row types of
their statements (``runs_get``, ``steps_list``, ``monitor_queues`` ...), built by
``from_row`` from a row keyed by column name. Timestamps are aware datetimes from the
database clock, in UTC whatever the session's time zone (see :func:`utc_times`);
durations are seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cyclone.errors import ValidationError
from cyclone.states import RunState, StepState

__all__ = [
    "Enqueued",
    "KindStats",
    "QueueStats",
    "Run",
    "RunRef",
    "Schedule",
    "Step",
    "StepInfo",
    "Submitted",
    "run_id_of",
    "utc_times",
]


def utc_times(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with every aware datetime moved to UTC (the same instants).

    psycopg gives a timestamptz the session's time zone, and Python compares and
    subtracts two datetimes that share one tzinfo by their wall clocks: across a
    daylight-saving change (a server whose ``timezone`` has one) a duration or an
    "overdue" test would be off by an hour. In UTC the wall clock is the instant.
    """
    return {
        key: value.astimezone(UTC)
        if isinstance(value, datetime) and value.tzinfo is not None
        else value
        for key, value in row.items()
    }


@dataclass(frozen=True, slots=True)
class Enqueued:
    """A standalone run of one step, as returned by ``enqueue``.

    Attributes:
        run_id: the run's id.
        step_id: the id of its one step.
        duplicate: true when a live step of the same kind already held the
            ``unique_key``, or a run of the kind (in any state, until purged) the
            ``submit_key``; ``run_id`` and ``step_id`` are then that run's and step's,
            and nothing was written.
    """

    __module__ = "cyclone"

    run_id: int
    step_id: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Submitted:
    """A workflow run, as returned by ``submit``.

    Attributes:
        run_id: the run's id.
        duplicate: true when a run of the workflow already held the ``submit_key``;
            ``run_id`` is then that run's.
    """

    __module__ = "cyclone"

    run_id: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """A run (``cyclone_runs``) with its result and error.

    Attributes:
        id: run id.
        workflow: the workflow name, or the kind of a standalone run.
        state: a :class:`RunState`.
        def_version: DAG fingerprint; ``"job"`` for a standalone run.
        input: the submitted input (a JSON value).
        result: once completed, the output of the result node (for a standalone run,
            its step's output); otherwise ``None``.
        error: once failed, the error of the first discarded step; otherwise ``None``.
        created_at, updated_at, finished_at, deadline_at, paused_at: timestamps.
        submit_key: the submit-once key, if any.
        parent_run_id, parent_node_id: the parent link of a child run.
    """

    __module__ = "cyclone"

    id: int
    workflow: str
    state: RunState
    def_version: str
    input: Any
    result: Any
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    deadline_at: datetime | None
    paused_at: datetime | None
    submit_key: str | None
    parent_run_id: int | None
    parent_node_id: str | None

    @property
    def terminal(self) -> bool:
        """True once the run is completed, failed or cancelled."""
        return self.state in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Run:
        """Build from a ``runs_get`` / ``runs_list`` row."""
        return cls(**{**utc_times(row), "state": RunState(row["state"])})


@dataclass(frozen=True, slots=True)
class _StepCore:
    """What a step record always shows: what the step is, where, its attempts, its last
    failure, its lease and its times (shared by :class:`Step` and :class:`StepInfo`)."""

    id: int
    run_id: int
    node: str
    kind: str
    state: StepState
    queue: str
    priority: int
    attempt: int
    max_attempts: int
    error: str | None
    error_kind: str | None
    panic_stack: str | None
    reclaims: int
    lease_owner: str | None
    lease_expiry: datetime | None
    heartbeat_at: datetime | None
    scheduled_at: datetime
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None


@dataclass(frozen=True, slots=True)
class Step(_StepCore):
    """A step (``cyclone_steps``) as ``list_steps`` and ``get_step`` return it.

    Attributes:
        id, run_id, node, kind, state, queue, priority: what the step is and where.
        input: the resolved input: the constant or the run's input; for a data edge
            (``input_from``) the upstream output once it exists; ``None`` for a fan-in
            node (``inputs=``), whose input is assembled when it is claimed.
        output: the output once completed.
        attempt, max_attempts, reclaims: attempts used, allowed, and crash reclaims.
        error, error_kind, panic_stack: the last failure, if any.
        lease_owner, lease_expiry, lease_generation, heartbeat_at: the lease.
        scheduled_at, created_at, started_at, completed_at: timestamps.
        unique_key, sequence_key: the enqueue's keys.
        timeout, retention: seconds or ``None``.
        snoozes: times its handler raised :class:`cyclone.Snooze` (never attempts).
    """

    __module__ = "cyclone"

    input: Any
    output: Any
    lease_generation: int
    unique_key: str | None
    sequence_key: str | None
    timeout: float | None
    retention: float | None
    snoozes: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Step:
        """Build from a ``steps_list`` or ``steps_get`` row."""
        values = utc_times(row)
        values["state"] = StepState(values["state"])
        values["timeout"] = values.pop("timeout_s")
        values["retention"] = values.pop("retention_s")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class StepInfo(_StepCore):
    """A step as the monitoring view ``cyclone_v_steps`` shows it.

    Attributes:
        id, run_id, node, kind, state, queue, priority: what the step is and where.
        attempt, max_attempts, reclaims: attempts used, allowed, and crash reclaims.
        error, error_kind, panic_stack: the last failure, if any.
        lease_owner, lease_expiry, lease_expired, heartbeat_at: the lease of a
            running step; ``lease_expired`` is true once a running step's lease ran out.
        signal_name: the signal a wait node waits for.
        item_of, item_index: for an item task of a fan-out, its fan-out node and place.
        scheduled_at, created_at, started_at, completed_at: timestamps.
        child_run_id: for a child node, the child run once started.
    """

    lease_expired: bool
    signal_name: str | None
    item_of: str | None
    item_index: int | None
    child_run_id: int | None

    @property
    def duration(self) -> float | None:
        """Seconds from start to completion, once both are known."""
        if self.started_at is None or self.completed_at is None:
            return None
        return (self.completed_at - self.started_at).total_seconds()

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> StepInfo:
        """Build from a ``monitor_steps`` row."""
        return cls(**{**utc_times(row), "state": StepState(row["state"])})


@dataclass(frozen=True, slots=True)
class QueueStats:
    """The unfinished work of one queue, and its pause (``cyclone_queues_v1``).

    Attributes:
        queue: the queue name.
        available: steps waiting to be claimed (scheduled ones included).
        running: steps held under a lease.
        waiting: steps waiting for a signal, a timer or a child run.
        oldest_available_age: seconds since the oldest claimable step became due;
            ``None`` when nothing is claimable now.
        expired_leases: running steps whose lease has expired (the sweep reclaims them).
        paused: the queue is paused (``Client.pause_queue``): no claim takes its steps
            until it is resumed. A paused queue is listed even with no unfinished step.
    """

    __module__ = "cyclone"

    queue: str
    available: int
    running: int
    waiting: int
    oldest_available_age: float | None
    expired_leases: int
    paused: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> QueueStats:
        """Build from a ``monitor_queues`` row."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class KindStats:
    """The steps of one kind in one state (``cyclone_v_kinds``).

    Attributes:
        kind: the kind name.
        state: a :class:`StepState`.
        count: how many steps of the kind are in that state.
        oldest_available_age: for ``available``, seconds since the oldest claimable
            step became due; otherwise ``None``.
        expired_leases: for ``running``, steps whose lease has expired.
    """

    kind: str
    state: StepState
    count: int
    oldest_available_age: float | None
    expired_leases: int

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> KindStats:
        """Build from a ``monitor_kinds`` row."""
        return cls(**{**row, "state": StepState(row["state"])})


@dataclass(frozen=True, slots=True)
class Schedule:
    """A cron schedule (``cyclone_schedules``) as ``list_schedules`` returns it.

    Attributes:
        id: the schedule's id.
        target: the fired kind, or the workflow's name.
        def_version: the pinned workflow definition; ``None`` for a kind schedule.
        input: the fired run's input (a JSON value).
        cron: the cron expression (a macro stored expanded).
        location: the IANA time zone its slots are computed in.
        next_run_at: the next slot (aware, UTC).
        enabled: whether scanners fire it.
        last_run_id: the run of the last fire (``None`` once that run is purged).
        last_error: the error of the last failed fire, cleared by a good one.
        consecutive_failures: failed fires since the last good one.
        queue, priority, max_attempts: the fired step's routing and attempts.
        timeout, retention: seconds or ``None``.
        lease_owner, lease_expiry: the scanner lease; with no owner, a future
            ``lease_expiry`` is the back-off after a failed fire.
        created_at, updated_at: lifecycle timestamps.
    """

    __module__ = "cyclone"

    id: str
    target: str
    def_version: str | None
    input: Any
    cron: str
    location: str
    next_run_at: datetime
    enabled: bool
    last_run_id: int | None
    last_error: str | None
    consecutive_failures: int
    queue: str
    priority: int
    max_attempts: int
    timeout: float | None
    retention: float | None
    lease_owner: str | None
    lease_expiry: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Schedule:
        """Build from a ``schedules_list`` row."""
        values = utc_times(row)
        values["target"] = values.pop("kind")
        values["cron"] = values.pop("cron_spec")
        values["timeout"] = values.pop("timeout_s")
        values["retention"] = values.pop("retention_s")
        return cls(**values)


RunRef = int | Enqueued | Submitted | Run
"""What run control and ``wait`` accept: a run id or a handle that carries one."""


def run_id_of(ref: Any) -> int:
    """The run id of a :data:`RunRef` (also anything with a ``run_id`` attribute).

    Raises:
        ValidationError: ``ref`` is not a positive int nor a handle with a run id.
    """
    if isinstance(ref, Run):
        return ref.id
    value = getattr(ref, "run_id", ref)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63:
        return value
    raise ValidationError(f"expected a run id or a run handle, got {ref!r}")
