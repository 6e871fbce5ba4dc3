"""What the worker and the sweep write for each step transition, decided in pure code.

Each function returns the statements of one transition (see ``states.STEP_TRANSITIONS``)
for the shells of :mod:`cyclone.dbio` to run. Transitions that may end a run lock the
run rows first (``runs_lock``), so every writer takes locks in one order.
"""

from __future__ import annotations

import traceback
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.dbio import Results, Stmt, int_array, text_array
from cyclone.errors import Discard
from cyclone.graph import (
    Completion,
    advance_stmts,
    cancel_children_stmt,
    completion_params,
)
from cyclone.inputs import bindings_of, names_of
from cyclone.options import micros
from cyclone.payloads import clean_text
from cyclone.retry import RetryPolicy
from cyclone.sql import Q, claim_sql
from cyclone.sql.rows import ClaimRow, HeartbeatRow, StepQueueRow, SweepRow

__all__ = [
    "MISMATCH_DELAY",
    "Claimed",
    "Failure",
    "claim_stmt",
    "complete_stmts",
    "decide_failure",
    "failure_applied",
    "failure_stmts",
    "heartbeat_stmt",
    "mismatch_stmt",
    "parse_claimed",
    "parse_heartbeat",
    "reclaim_stmts",
    "release_stmt",
    "sequence_recheck_stmts",
]

_MAX_ERROR_CHARS = 8_000
_MAX_STACK_CHARS = 32_000


@dataclass(frozen=True, slots=True)
class Claimed:
    """A step this worker holds: what ``steps_claim`` returned for it.

    ``owner`` (the ``lease_owner`` written by the claim: the client's id and the
    claim's serial number within the client) and ``generation`` (the lease generation
    of the claim) form the fencing token every later transition compares; an owner is
    never reused, even if a claim is lost in a server crash and its generation issued
    again. ``timeout`` is seconds or ``None``. ``input_from`` and ``bindings`` (pairs
    of upstream node and assembly mode, in slot order) are a workflow step's data
    edges, ``names`` the bindings' input names when they are named (the input is then
    a dict); ``input_error`` says why its input could not be assembled.
    ``run_input_json`` is the run's input as JSON text when the step's input is not the
    run input (a workflow step with a constant input, an item or a data edge), else
    ``None``: ``input`` as claimed is the run input. ``has_children``
    is true when the run's definition (as this worker registers it) has child nodes:
    then a transaction that may end the run also cancels its active child runs.
    ``reclaims`` counts the step's reclaims so far, ``traceparent`` is its run's W3C
    trace context (or ``None``), ``queue_latency`` the seconds from ready to claimed.
    """

    # the step, its run and the definition it belongs to
    id: int
    kind: str
    queue: str
    run_id: int
    workflow: str
    def_version: str
    node: str
    # the lease (the fencing token) and the attempt
    owner: str
    generation: int
    attempt: int
    max_attempts: int
    timeout: float | None
    sequence_key: str | None
    # the input: a value, or the data edges to assemble it from
    input: Any
    input_from: str | None = None
    bindings: tuple[tuple[str, str], ...] | None = None
    names: tuple[str, ...] | None = None
    input_error: str | None = None
    run_input_json: str | None = None
    # what the run's definition has (a transaction that may end it does more)
    has_fan_out: bool = False
    has_children: bool = False
    # what its trace span and metrics show
    reclaims: int = 0
    traceparent: str | None = None
    queue_latency: float = 0.0

    @property
    def has_data_edge(self) -> bool:
        """True when the input comes from upstream outputs."""
        return self.input_from is not None or bool(self.bindings)


def claim_stmt(
    *,
    queue: str,
    kinds: Sequence[str],
    owner: str,
    ttl: float,
    limit: int,
    timeouts: Sequence[float | None] | None = None,
    foreign: Sequence[str] = (),
    latency: bool = False,
    after: str = "",
    fair: bool = False,
) -> Stmt[ClaimRow]:
    """Claim up to ``limit`` steps of ``queue`` and ``kinds`` under a ``ttl``-second lease.

    ``limit`` must be one of :data:`cyclone.sql.CLAIM_LIMITS` (:func:`claim_limit` picks
    one). ``timeouts`` (seconds, aligned with ``kinds``) are the kinds' declared
    timeouts, applied to a claimed step that has none. Steps of runs whose def_version
    is in ``foreign`` are skipped. With ``latency``, a workflow step's queue latency
    counts from its last upstream completion (a few index probes per dependency);
    without, from its ``scheduled_at``. ``after``: the fairness key the last claim of
    the queue ended its turn with (claims rotate across fairness keys from the next).
    ``fair``: ``steps_claim_fair``, for a queue that holds steps with a fairness key.
    """
    return Stmt(
        claim_sql(limit, fair),
        {
            "queue": queue,
            "kinds": list(kinds),
            "timeouts_us": [micros(t) for t in (timeouts or [None] * len(kinds))],
            "owner": owner,
            "ttl_us": micros(ttl),
            "foreign": list(foreign),
            "latency": latency,
            "limit": limit,
            "after": after,
        },
    )


def parse_claimed(
    rows: Sequence[ClaimRow], queue: str, owner: str, parents: Container[str] = ()
) -> list[Claimed]:
    """The rows of ``steps_claim`` (claimed as ``owner``) as :class:`Claimed` records;
    ``parents`` are the def_versions whose definition has child nodes."""
    return [
        Claimed(
            id=row.id,
            kind=row.kind,
            queue=queue,
            run_id=row.run_id,
            workflow=row.workflow,
            def_version=row.def_version,
            node=row.node,
            owner=owner,
            generation=row.lease_generation,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            timeout=row.timeout_s,
            sequence_key=row.sequence_key,
            input=row.input,
            input_from=row.input_from,
            bindings=bindings_of(row.binding_nodes, row.binding_modes),
            names=names_of(row.binding_names),
            run_input_json=row.run_input,
            has_fan_out=row.has_fan_out,
            has_children=row.def_version in parents,
            reclaims=row.reclaims,
            traceparent=row.traceparent,
            queue_latency=max(row.queue_latency_s, 0.0),
        )
        for row in rows
    ]


def heartbeat_stmt(steps: Sequence[Claimed], *, ttl: float) -> Stmt[HeartbeatRow]:
    """Renew the leases of ``steps`` for ``ttl`` seconds, all in one statement
    (``steps_heartbeat``); read its rows with :func:`parse_heartbeat`.

    The ids, owners and generations travel as three aligned array literals, one text
    parameter each.
    """
    return Stmt(
        Q.steps_heartbeat,
        {
            "ids": int_array((s.id for s in steps), keep_order=True),
            "owners": text_array(s.owner for s in steps),
            "generations": int_array((s.generation for s in steps), keep_order=True),
            "ttl_us": micros(ttl),
        },
    )


def parse_heartbeat(
    rows: Sequence[HeartbeatRow],
) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    """The ``(step id, lease owner)`` pairs that :func:`heartbeat_stmt` renewed, and
    those it found busy (locked by another transaction: neither renewed nor lost).

    A step sent and in neither set lost its lease (reclaimed, cancelled, timed out).
    """
    renewed: set[tuple[int, str]] = set()
    busy: set[tuple[int, str]] = set()
    for row in rows:
        (renewed if row.renewed else busy).add((row.id, row.owner))
    return renewed, busy


def _held(step: Claimed, output: str | None) -> Completion:
    return Completion(
        step.id,
        step.run_id,
        output,
        owner=step.owner,
        generation=step.generation,
        fan_out=step.has_fan_out,
        children=step.has_children,
    )


def complete_stmts(items: Sequence[tuple[Claimed, str | None]]) -> list[Stmt[Any]]:
    """Complete held steps with their outputs (JSON text or ``None``): lock runs, then
    CAS each one on its lease.

    Each output is JSON text made by ``encode_json``; a batch travels as aligned arrays
    (:func:`cyclone.graph.completion_params`). Steps of standalone runs take the lean
    ``steps_complete``; workflow steps take :func:`cyclone.graph.advance_stmts`, which
    also advance their runs (expanding fan-out nodes only for runs whose definition has
    them, cancelling child runs only for runs whose definition has child nodes); a mixed
    batch runs both in the one transaction.

    Returns the statements for one transaction; read its results with
    :func:`cyclone.graph.parse_advanced`.
    """
    jobs = [_held(step, output) for step, output in items if step.def_version == "job"]
    dag = [_held(step, output) for step, output in items if step.def_version != "job"]
    stmts: list[Stmt[Any]] = [
        Stmt(Q.runs_lock, {"run_ids": int_array({step.run_id for step, _ in items})})
    ]
    if jobs:
        stmts.append(Stmt(Q.steps_complete, completion_params(jobs, prefix="job_")))
    if dag:
        stmts.extend(advance_stmts(dag))
    return stmts


@dataclass(frozen=True, slots=True)
class Failure:
    """How a failed execution is recorded.

    ``discard`` false means a retry after ``delay`` seconds; true means the step is
    dead-lettered and its run resolved.
    """

    error: str
    error_kind: str
    panic_stack: str | None
    discard: bool
    delay: float


def decide_failure(
    step: Claimed,
    exc: BaseException,
    *,
    retry: RetryPolicy,
    no_retry: tuple[type[BaseException], ...],
    error_kind: str | None = None,
) -> Failure:
    """Decide what a failed execution of ``step`` becomes.

    ``Discard`` and the kind's ``no_retry`` classes discard at once; otherwise the step
    is retried with backoff until ``attempt + 1`` reaches ``max_attempts``.
    ``error_kind`` overrides the classification (``"timeout"``).
    """
    immediate = isinstance(exc, (Discard, *no_retry))
    kind = error_kind or ("discard" if immediate else "exception")
    try:
        text = str(exc)
    except Exception:  # a __str__ that fails
        text = ""
    message = clean_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
    stack = clean_text("".join(traceback.format_exception(exc)))
    failures = step.attempt + 1
    discard = immediate or failures >= step.max_attempts
    return Failure(
        error=message[:_MAX_ERROR_CHARS],
        error_kind=kind,
        panic_stack=stack[-_MAX_STACK_CHARS:] if error_kind != "timeout" else None,
        discard=discard,
        delay=0.0 if discard else retry.delay(failures),
    )


def failure_stmts(step: Claimed, failure: Failure) -> tuple[list[Stmt[Any]], bool]:
    """The statements recording ``failure``, and whether they form one transaction.

    A retry is one CAS statement. A discard locks the run, CAS-discards the step and
    resolves the run (graph_resolve_discard: fail fast, or cancel the branch), in one
    transaction; when the run's definition has child nodes, ``runs_cancel_children``
    follows (the run, or the branch of a child node, may have ended). Read the results
    with :func:`failure_applied`.
    """
    params = {
        "id": step.id,
        "owner": step.owner,
        "generation": step.generation,
        "error": failure.error,
        "error_kind": failure.error_kind,
        "panic_stack": failure.panic_stack,
    }
    if not failure.discard:
        return [Stmt(Q.steps_retry, {**params, "delay_us": micros(failure.delay)})], False
    stmts: list[Stmt[Any]] = [
        Stmt(Q.runs_lock, {"run_ids": int_array([step.run_id])}),
        Stmt(Q.steps_discard, params),
        Stmt(Q.graph_resolve_discard, {"run_id": step.run_id, "step_id": step.id}),
    ]
    if step.has_children:
        stmts.append(cancel_children_stmt([step.run_id]))
    return stmts, True


def failure_applied(failure: Failure, results: Results) -> bool:
    """Whether the CAS among :func:`failure_stmts` changed the step (``False``: a stale
    failure, the lease was lost before it)."""
    return bool(results.of(Q.steps_discard if failure.discard else Q.steps_retry))


def _held_params(steps: Sequence[Claimed]) -> dict[str, Any]:
    return {
        "ids": [s.id for s in steps],
        "generations": [s.generation for s in steps],
        "owners": [s.owner for s in steps],
    }


MISMATCH_DELAY = 1.0
"""Seconds a step given back for a def_version mismatch waits before it is claimable."""


def mismatch_stmt(steps: Sequence[Claimed], known: dict[str, list[str]]) -> Stmt[StepQueueRow]:
    """Give back steps whose run's def_version this worker does not have.

    ``known`` maps workflow names to the def_versions this worker registers; the error
    written names both sides (docs/design.md, Who claims what).
    """
    errors = [
        f"def_version mismatch: run has {s.def_version} of workflow {s.workflow!r}, "
        f"worker has {', '.join(known.get(s.workflow, [])) or 'none'}"
        for s in steps
    ]
    return Stmt(
        Q.steps_release_mismatch,
        {**_held_params(steps), "errors": errors, "delay_us": micros(MISMATCH_DELAY)},
    )


def release_stmt(steps: Sequence[Claimed]) -> Stmt[StepQueueRow]:
    """Give held steps back with no attempt and no reclaim counted (``steps_release``)."""
    return Stmt(Q.steps_release, _held_params(steps))


def sequence_recheck_stmts(steps: Sequence[Claimed]) -> list[Stmt[Any]]:
    """Lock the sequence keys of fresh claims, then give back those not at their head."""
    return [
        Stmt(Q.steps_sequence_lock, {"keys": [s.sequence_key for s in steps]}),
        Stmt(Q.steps_sequence_release, _held_params(steps)),
    ]


def reclaim_stmts(step: SweepRow, *, max_reclaims: int) -> tuple[list[Stmt[Any]], bool]:
    """What the sweep writes for one expired step, and whether it is a discard.

    Below ``max_reclaims`` the step goes back to ``available`` (``steps_reclaim``);
    past it, the step is discarded with ``reclaim_limit``, its run resolved and, if the
    run (or a child node's branch) ended, its active child runs cancelled (the sweep does
    not know the definition; a rare path).
    """
    reason = "timeout passed" if step.timed_out else "lease expired"
    if step.reclaims + 1 <= max_reclaims:
        return [
            Stmt(
                Q.steps_reclaim,
                {
                    "id": step.id,
                    "generation": step.lease_generation,
                    "error": f"reclaimed: {reason}",
                    "error_kind": "timeout" if step.timed_out else "lease_expired",
                },
            )
        ], False
    error = f"{reason}; reclaimed {step.reclaims} times, max_reclaims is {max_reclaims}"
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([step.run_id])}),
        Stmt(
            Q.steps_reclaim_discard,
            {"id": step.id, "generation": step.lease_generation, "error": error},
        ),
        Stmt(Q.graph_resolve_discard, {"run_id": step.run_id, "step_id": step.id}),
        cancel_children_stmt([step.run_id]),
    ], True
