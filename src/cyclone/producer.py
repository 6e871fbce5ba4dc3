"""Enqueueing standalone runs: validation, parameters and the statements to run.

Pure code shared by ``Client``, ``SyncClient`` and ``Context.enqueue_completion``: each
builds an :class:`EnqueueRequest` (every option validated, the input encoded) and runs
its plan on a connection with the shells of :mod:`cyclone.dbio`. Nothing touches the
database before validation passes, so a rejected call writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from cyclone.dbio import Plan, Stmt
from cyclone.errors import StateError, ValidationError
from cyclone.handlers import Handler
from cyclone.options import (
    Duration,
    JobOptions,
    check_aware,
    check_kind,
    check_text,
    micros,
    seconds,
)
from cyclone.payloads import encode_json
from cyclone.records import Enqueued
from cyclone.sql import Q

__all__ = [
    "EnqueueOptions",
    "EnqueueRequest",
    "KindTarget",
    "ManyOptions",
    "enqueue_many_stmt",
    "enqueue_plan",
    "enqueue_stmt",
    "enqueued_from_rows",
]

KindTarget = Handler | str
"""What ``enqueue`` accepts as its kind: the handler, or the kind's name."""


class ManyOptions(TypedDict, total=False):
    """The keyword options of ``enqueue_many`` (each overrides the kind's default).

    Attributes:
        queue: queue name (at most 256 bytes).
        priority: higher claims first (int32).
        scheduled_at: when it becomes claimable: an aware datetime, or a ``timedelta``
            from the database's now().
        max_attempts: failed executions before the step is discarded (>= 1).
        timeout: limit of one execution (``timedelta`` or seconds).
        sequence_key: steps of one key run one at a time, first in first out.
        retention: how long the finished run is kept (``timedelta`` or seconds).
    """

    queue: str
    priority: int
    scheduled_at: datetime | timedelta
    max_attempts: int
    timeout: Duration
    sequence_key: str
    retention: Duration


class EnqueueOptions(ManyOptions, total=False):
    """The keyword options of ``enqueue``: those of :class:`ManyOptions`, and
    ``unique_key``: at most one active step of the kind holds it; a live duplicate
    returns the existing run."""

    unique_key: str


_UNIQUE_RETRIES = 5


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One validated enqueue: the kind, the queue it goes to, the statement parameters."""

    kind: str
    queue: str
    params: dict[str, Any]
    unique_key: str | None

    @classmethod
    def build(
        cls,
        target: KindTarget,
        input: Any,
        *,
        registry: Mapping[str, Handler],
        default_retention: float | None,
        queue: str | None = None,
        priority: int | None = None,
        scheduled_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        unique_key: str | None = None,
        sequence_key: str | None = None,
        retention: Duration | None = None,
        many: bool = False,
    ) -> EnqueueRequest:
        """Validate everything and encode the input(s).

        ``target`` is a :class:`Handler` or a kind name; a name the registry knows takes
        that kind's defaults. With ``many=True``, ``input`` is a sequence of inputs.

        Raises:
            ValidationError: naming the first bad value.
        """
        handler: Handler | None
        if isinstance(target, Handler):
            kind, handler = target.kind, target
        else:
            kind = check_kind(target)
            handler = registry.get(kind)
        defaults = handler.options if handler else JobOptions()
        options = defaults.override(
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            timeout=timeout,
            retention=retention,
        )
        what = f"input of kind {kind!r}"
        encode = handler.codec.encode if handler else (lambda v: v)
        if many:
            if isinstance(input, str | bytes | Mapping) or not isinstance(input, Sequence):
                raise ValidationError(f"inputs must be a list of inputs, got {input!r}")
            encoded: Any = [
                encode_json(encode(item), f"{what} at index {i}") for i, item in enumerate(input)
            ]
        else:
            encoded = encode_json(encode(input), what)
        at: datetime | None = None
        delay: float = 0.0
        if isinstance(scheduled_at, timedelta):
            delay = seconds(scheduled_at, "scheduled_at delay", allow_zero=True) or 0.0
        elif scheduled_at is not None:
            at = check_aware(scheduled_at, "scheduled_at")
        if unique_key is not None:
            check_text(unique_key, "unique_key")
        if sequence_key is not None:
            check_text(sequence_key, "sequence_key")
        keep = options.retention if options.retention is not None else default_retention
        params: dict[str, Any] = {
            "kind": kind,
            "queue": options.queue,
            "priority": options.priority,
            "max_attempts": options.max_attempts,
            "scheduled_at": at,
            "delay_us": micros(delay),
            "timeout_us": micros(options.timeout),
            "sequence_key": sequence_key,
            "retention_us": micros(keep),
            ("inputs" if many else "input"): encoded,
        }
        if not many:
            params["unique_key"] = unique_key
        return cls(kind=kind, queue=options.queue, params=params, unique_key=unique_key)


def enqueue_plan(request: EnqueueRequest) -> Plan[Enqueued]:
    """Insert the run, or find the live step that holds its ``unique_key``.

    A conflict followed by a lookup that finds nothing means the holder finished in
    between; the insert is tried again, a few times at most.

    Raises:
        StateError: the unique key kept changing hands across every retry.
    """
    for _ in range(_UNIQUE_RETRIES):
        rows = yield Stmt(Q.steps_enqueue, request.params)
        if rows:
            step_id, run_id = rows[0]
            return Enqueued(run_id=run_id, step_id=step_id)
        rows = yield Stmt(
            Q.steps_find_unique, {"kind": request.kind, "unique_key": request.unique_key}
        )
        if rows:
            step_id, run_id = rows[0]
            return Enqueued(run_id=run_id, step_id=step_id, duplicate=True)
    raise StateError(f"unique_key {request.unique_key!r} of kind {request.kind!r} kept changing")


def enqueue_stmt(request: EnqueueRequest) -> Stmt:
    """The one statement of an enqueue without ``unique_key`` (it always inserts)."""
    return Stmt(Q.steps_enqueue, request.params)


def enqueue_many_stmt(request: EnqueueRequest) -> Stmt:
    """The one statement that inserts every run of a ``many`` request."""
    return Stmt(Q.steps_enqueue_many, request.params)


def enqueued_from_rows(rows: Sequence[tuple[Any, ...]]) -> list[Enqueued]:
    """``Enqueued`` handles from ``steps_enqueue_many`` rows, in input order."""
    return [Enqueued(run_id=run_id, step_id=step_id) for step_id, run_id in rows]
