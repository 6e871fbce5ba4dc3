"""Enqueueing standalone runs: validation, parameters and the statements to run.

Pure code shared by ``Client``, ``SyncClient`` and ``Context.enqueue_completion``: each
builds an :class:`EnqueueRequest` (every option validated, the input encoded) and runs
its plan on a connection with the shells of :mod:`cyclone.dbio`. Nothing touches the
database before validation passes, so a rejected call writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypedDict

from cyclone.dbio import Plan, Stmt
from cyclone.errors import StateError, ValidationError
from cyclone.flow import check_flow_key
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
from cyclone.payloads import check_decodes, encode_json
from cyclone.records import Enqueued
from cyclone.sql import Q
from cyclone.sql.rows import EnqueuedRow, KeyedEnqueuedRow, SubmitKeyRow, WokenEnqueuedRow

__all__ = [
    "EnqueueOptions",
    "EnqueueRequest",
    "KindTarget",
    "ManyOptions",
    "enqueue_many_plan",
    "enqueue_many_stmt",
    "enqueue_plan",
    "enqueue_stmt",
    "enqueued_from_rows",
    "keyed_plan",
]

KindTarget = Handler | str
"""What ``enqueue`` accepts as its kind: the handler, or the kind's name."""


class _SharedOptions(TypedDict, total=False):
    """The keyword options ``enqueue`` and ``enqueue_many`` share (each overrides the
    kind's default).

    Attributes:
        queue: queue name (at most 256 bytes).
        priority: higher claims first (int32).
        scheduled_at: when it becomes claimable: an aware datetime, or a ``timedelta``
            (or seconds) from the database's now().
        max_attempts: failed executions before the step is discarded (>= 1).
        timeout: limit of one execution (``timedelta`` or seconds).
        sequence_key: steps of one key run one at a time, first in first out.
        retention: how long the finished run is kept (``timedelta`` or seconds).
        concurrency_key: the group the kind's ``max_concurrency`` counts the step in
            (default: the kind's one group).
        rate_key: the bucket the kind's ``rate_limit`` counts the step's start in
            (default: the kind's one bucket).
        fairness_key: claims rotate across the fairness keys of a queue and priority,
            so that one key's backlog cannot starve the others (default: none).
    """

    queue: str
    priority: int
    scheduled_at: datetime | Duration
    max_attempts: int
    timeout: Duration
    sequence_key: str
    retention: Duration
    concurrency_key: str
    rate_key: str
    fairness_key: str


class ManyOptions(_SharedOptions, total=False):
    """The keyword options of ``enqueue_many``: the shared ones, and ``submit_keys``,
    one submit key per input (``None`` for an input without one); see
    :class:`EnqueueOptions` for what a key does."""

    submit_keys: Sequence[str | None]


class EnqueueOptions(_SharedOptions, total=False):
    """The keyword options of ``enqueue``: the shared ones, and

    Attributes:
        unique_key: at most one active step of the kind holds it; a live duplicate
            returns the existing run (``duplicate=True``). The key is free again when
            that step finishes.
        submit_key: submit-once key: while a run of the kind with this key exists (in
            any state, until it is purged), enqueueing again writes nothing and returns
            that run (``duplicate=True``). Retry an ambiguous failure with the same key.
            Not combined with ``unique_key``.
    """

    unique_key: str
    submit_key: str


_UNIQUE_RETRIES = 5
_KEY_RETRIES = 5


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """One validated enqueue: the kind, the queue it goes to, the statement parameters.

    ``submit_keys`` is ``None`` when no input has a submit key; otherwise one entry per
    input (``None`` for an input without one), and ``params`` holds ``inputs`` and
    ``submit_keys`` for ``steps_enqueue_keyed``, even for a single enqueue.
    """

    kind: str
    queue: str
    params: dict[str, Any]
    unique_key: str | None
    submit_keys: tuple[str | None, ...] | None = None

    def traced(self, traceparent: str | None) -> EnqueueRequest:
        """This request with the run's trace context (a W3C ``traceparent``, or
        ``None``: this request unchanged)."""
        if traceparent is None:
            return self
        return replace(self, params={**self.params, "traceparent": traceparent})

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
        scheduled_at: datetime | Duration | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        unique_key: str | None = None,
        submit_key: str | None = None,
        submit_keys: Sequence[str | None] | None = None,
        sequence_key: str | None = None,
        retention: Duration | None = None,
        concurrency_key: str | None = None,
        rate_key: str | None = None,
        fairness_key: str | None = None,
        many: bool = False,
    ) -> EnqueueRequest:
        """Validate everything and encode the input(s).

        ``target`` is a :class:`Handler` or a kind name; a name the registry knows takes
        that kind's defaults. With ``many=True``, ``input`` is a sequence of inputs.
        When the kind's handler is known and its input is annotated with a dataclass or
        a pydantic model, each input is decoded as the worker will decode it
        (:func:`cyclone.payloads.check_decodes`): a wrong shape is refused here.

        Raises:
            ValidationError: naming the first bad value (an input that does not fit
                the handler's model: naming the kind, the model and the problem).
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
            if handler is not None and handler.codec.model is not None:
                for i, text in enumerate(encoded):
                    check_decodes(handler.codec, text, f"{what} at index {i}")
        else:
            encoded = encode_json(encode(input), what)
            if handler is not None:
                check_decodes(handler.codec, encoded, what)
        at: datetime | None = None
        delay: float = 0.0
        if isinstance(scheduled_at, datetime):
            at = check_aware(scheduled_at, "scheduled_at")
        elif isinstance(scheduled_at, timedelta | int | float) and not isinstance(
            scheduled_at, bool
        ):
            delay = seconds(scheduled_at, "scheduled_at delay", allow_zero=True) or 0.0
        elif scheduled_at is not None:
            raise ValidationError(
                "scheduled_at must be an aware datetime, or a timedelta or seconds from now, "
                f"got {scheduled_at!r}"
            )
        if unique_key is not None:
            check_text(unique_key, "unique_key")
        if sequence_key is not None:
            check_text(sequence_key, "sequence_key")
        keys = _submit_keys(submit_keys, len(encoded)) if many else _submit_key(submit_key)
        if keys is not None and unique_key is not None:
            raise ValidationError(
                f"unique_key {unique_key!r} and submit_key {submit_key!r} cannot be combined: "
                "an enqueue checks one of them; give submit_key to make it submit-once "
                "until the run is purged, or unique_key to deduplicate while a step is active"
            )
        keep = options.retention if options.retention is not None else default_retention
        params: dict[str, Any] = {
            "kind": kind,
            "queue": options.queue,
            "priority": options.priority,
            "max_attempts": options.max_attempts,
            "scheduled_at": at,
            "delay_us": micros(delay),
            "timeout_us": micros(options.timeout),
            "unique_key": unique_key,
            "sequence_key": sequence_key,
            "concurrency_key": check_flow_key(concurrency_key, "concurrency_key"),
            "rate_key": check_flow_key(rate_key, "rate_key"),
            "fairness_key": check_flow_key(fairness_key, "fairness_key"),
            "retention_us": micros(keep),
            "traceparent": None,
        }
        if keys is not None:
            params["inputs"] = encoded if many else [encoded]
            params["submit_keys"] = list(keys)
        elif many:
            params["inputs"] = encoded
        else:
            params["input"] = encoded
        return cls(
            kind=kind,
            queue=options.queue,
            params=params,
            unique_key=unique_key,
            submit_keys=keys,
        )


def _submit_key(key: Any) -> tuple[str | None, ...] | None:
    """The keys of a single enqueue: ``None``, or the one checked key."""
    return None if key is None else (check_text(key, "submit_key"),)


def _submit_keys(keys: Any, count: int) -> tuple[str | None, ...] | None:
    """The checked keys of ``enqueue_many``: one per input, no two alike.

    ``None`` when no key is given at all (or every entry is ``None``).

    Raises:
        ValidationError: not a list, a count other than ``count``, a bad key or a key
            given twice (named).
    """
    if keys is None:
        return None
    if isinstance(keys, str | bytes | Mapping) or not isinstance(keys, Sequence):
        raise ValidationError(f"submit_keys must be a list of keys, got {keys!r}")
    if len(keys) != count:
        raise ValidationError(
            f"submit_keys must give one key (or None) per input: {len(keys)} keys for "
            f"{count} inputs"
        )
    seen: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        check_text(key, f"submit_keys[{i}]")
        if key in seen:
            raise ValidationError(
                f"submit_keys repeats {key!r} (at index {seen[key]} and {i}): "
                "each input needs a key of its own"
            )
        seen[key] = i
    if not seen:
        return None
    return tuple(keys)


def enqueue_plan(request: EnqueueRequest) -> Plan[Enqueued]:
    """Insert the run, or find the run that holds its ``submit_key`` or the live step
    that holds its ``unique_key``.

    A conflict followed by a lookup that finds nothing means the holder finished (or
    was purged) in between; the insert is tried again, a few times at most.

    Raises:
        StateError: the key kept changing hands across every retry, or the submit key
            is held by a workflow run of the same name.
    """
    if request.submit_keys is not None:
        handles = yield from keyed_plan(request)
        return handles[0]
    if request.unique_key is None:
        return enqueued_from_rows((yield enqueue_stmt(request)))[0]
    for _ in range(_UNIQUE_RETRIES):
        rows: list[EnqueuedRow] = yield Stmt(Q.steps_enqueue, request.params)
        if rows:
            return enqueued_from_rows(rows)[0]
        rows = yield Stmt(
            Q.steps_find_unique, {"kind": request.kind, "unique_key": request.unique_key}
        )
        if rows:
            return Enqueued(run_id=rows[0].run_id, step_id=rows[0].step_id, duplicate=True)
    raise StateError(f"unique_key {request.unique_key!r} of kind {request.kind!r} kept changing")


def enqueue_many_plan(request: EnqueueRequest) -> Plan[list[Enqueued]]:
    """Insert every run of a ``many`` request; with submit keys, see :func:`keyed_plan`.

    Raises:
        StateError: as :func:`keyed_plan`.
    """
    if request.submit_keys is not None:
        return (yield from keyed_plan(request))
    rows = yield enqueue_many_stmt(request)
    return enqueued_from_rows(rows)


def keyed_plan(request: EnqueueRequest) -> Plan[list[Enqueued]]:
    """Insert the runs whose submit key is free and find those whose key is taken.

    The insert yields on each taken key (``steps_enqueue_keyed``); the following
    statement finds the runs that hold them (a run committed while the insert waited is
    invisible to the insert's snapshot, not to the lookup's). A key still unaccounted
    for was freed in between (its run purged, or its insert rolled back): those inputs
    are inserted again, a few times at most. Returns one handle per input, in input
    order; ``duplicate=True`` for a key already taken.

    Raises:
        StateError: a key kept changing hands across every retry, or a run of a
            workflow with the kind's name holds it.
    """
    assert request.submit_keys is not None
    keys = request.submit_keys
    inputs: list[Any] = request.params["inputs"]
    handles: list[Enqueued | None] = [None] * len(keys)
    todo = list(range(len(keys)))
    for _ in range(_KEY_RETRIES):
        params = {
            **request.params,
            "inputs": [inputs[i] for i in todo],
            "submit_keys": [keys[i] for i in todo],
        }
        inserted: list[KeyedEnqueuedRow] = yield Stmt(Q.steps_enqueue_keyed, params)
        for row in inserted:
            handles[todo[row.ord - 1]] = Enqueued(run_id=row.run_id, step_id=row.step_id)
        taken = [i for i in todo if handles[i] is None]  # each has a key: NULL always inserts
        if not taken:
            break
        lookup = {"kind": request.kind, "submit_keys": [keys[i] for i in taken]}
        holders: list[SubmitKeyRow] = yield Stmt(Q.steps_find_submit_keys, lookup)
        found: dict[str | None, SubmitKeyRow] = {row.submit_key: row for row in holders}
        for i in taken:
            if keys[i] not in found:
                continue
            holder = found[keys[i]]
            if holder.step_id is None:
                raise StateError(
                    f"submit_key {keys[i]!r} is held by run {holder.run_id}, a run of "
                    f"workflow {request.kind!r} ({holder.def_version}), not a job of that kind"
                )
            handles[i] = Enqueued(run_id=holder.run_id, step_id=holder.step_id, duplicate=True)
        todo = [i for i in taken if handles[i] is None]
        if not todo:
            break
    else:
        raise StateError(
            f"submit_key {keys[todo[0]]!r} of kind {request.kind!r} kept changing hands"
        )
    return [handle for handle in handles if handle is not None]


def enqueue_stmt(request: EnqueueRequest) -> Stmt[EnqueuedRow]:
    """The one statement of an enqueue without keys (it always inserts)."""
    return Stmt(Q.steps_enqueue, request.params)


def enqueue_many_stmt(request: EnqueueRequest) -> Stmt[EnqueuedRow]:
    """The one statement that inserts every run of a ``many`` request without keys."""
    params = {k: v for k, v in request.params.items() if k != "inputs"}
    params["inputs_json"] = "[" + ",".join(request.params["inputs"]) + "]"
    return Stmt(Q.steps_enqueue_many, params)


def enqueued_from_rows(rows: Sequence[EnqueuedRow | WokenEnqueuedRow]) -> list[Enqueued]:
    """``Enqueued`` handles from rows of ``steps_enqueue`` or ``steps_enqueue_many``, in
    input order (the order of their run ids)."""
    ordered = sorted(rows, key=lambda row: row.run_id) if len(rows) > 1 else rows
    return [Enqueued(run_id=row.run_id, step_id=row.step_id) for row in ordered]
