"""The records producer and inspection calls return: ``Enqueued``, ``Run``, ``Step``,
``Schedule``.

All are frozen dataclasses built from rows of ``runs_get``, ``runs_list`` and
``steps_list`` (python-api.md, Client). Timestamps are aware datetimes from the
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
    "Run",
    "RunRef",
    "Schedule",
    "Step",
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
class Step:
    """A step (``cyclone_steps``) as ``list_steps`` returns it.

    ``timeout`` and ``retention`` are seconds or ``None``; ``input`` is the resolved
    input: the constant or the run's input; for a data edge (``input_from``) the
    upstream output once it exists; ``None`` for a fan-in node (``inputs=``), whose
    input is assembled from its upstream steps' outputs when it is claimed.
    """

    __module__ = "cyclone"

    id: int
    run_id: int
    node: str
    kind: str
    state: StepState
    queue: str
    priority: int
    input: Any
    output: Any
    attempt: int
    max_attempts: int
    error: str | None
    error_kind: str | None
    panic_stack: str | None
    reclaims: int
    lease_owner: str | None
    lease_expiry: datetime | None
    lease_generation: int
    heartbeat_at: datetime | None
    scheduled_at: datetime
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    unique_key: str | None
    sequence_key: str | None
    timeout: float | None
    retention: float | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Step:
        """Build from a ``steps_list`` row."""
        values = utc_times(row)
        values["state"] = StepState(values["state"])
        values["timeout"] = values.pop("timeout_s")
        values["retention"] = values.pop("retention_s")
        return cls(**values)


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
