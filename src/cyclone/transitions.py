"""What the worker and the sweep write for each step transition, decided in pure code.

Each function returns the statements of one transition (see ``states.STEP_TRANSITIONS``)
for the shells of :mod:`cyclone.dbio` to run. Transitions that may end a run lock the
run rows first (``runs_lock``), so every writer takes locks in one order.
"""

from __future__ import annotations

import heapq
import json
import traceback
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cyclone.dbio import Plan, Rows, Stmt, int_array, text_array
from cyclone.errors import Discard, NotFoundError, StateError, ValidationError
from cyclone.inputs import parse_bindings
from cyclone.options import micros
from cyclone.payloads import clean_text
from cyclone.retry import RetryPolicy
from cyclone.sql import Q, claim_sql

__all__ = [
    "MISMATCH_DELAY",
    "Claimed",
    "Failure",
    "cancel_children_stmt",
    "cancel_stmts",
    "claim_stmt",
    "complete_stmts",
    "decide_failure",
    "expand_stmt",
    "failure_stmts",
    "heartbeat_stmt",
    "mismatch_stmt",
    "parse_claimed",
    "parse_completed",
    "parse_heartbeat",
    "pause_stmts",
    "reclaim_stmts",
    "release_stmt",
    "resume_stmts",
    "retry_outcome",
    "retry_plan",
    "retry_stmts",
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
    edges; ``input_error`` says why its input could not be assembled. ``has_children``
    is true when the run's definition (as this worker registers it) has child nodes:
    then a transaction that may end the run also cancels its active child runs.
    """

    id: int
    run_id: int
    node: str
    kind: str
    input: Any
    attempt: int
    max_attempts: int
    generation: int
    timeout: float | None
    sequence_key: str | None
    workflow: str
    def_version: str
    queue: str
    owner: str
    input_from: str | None = None
    bindings: tuple[tuple[str, str], ...] | None = None
    input_error: str | None = None
    has_fan_out: bool = False
    has_children: bool = False

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
) -> Stmt:
    """Claim up to ``limit`` steps of ``queue`` and ``kinds`` under a ``ttl``-second lease.

    ``limit`` must be one of :data:`cyclone.sql.CLAIM_LIMITS` (:func:`claim_limit` picks
    one). ``timeouts`` (seconds, aligned with ``kinds``) are the kinds' declared
    timeouts, applied to a claimed step that has none. Steps of runs whose def_version
    is in ``foreign`` are skipped.
    """
    return Stmt(
        claim_sql(limit),
        {
            "queue": queue,
            "kinds": list(kinds),
            "timeouts_us": [micros(t) for t in (timeouts or [None] * len(kinds))],
            "owner": owner,
            "ttl_us": micros(ttl),
            "foreign": list(foreign),
        },
    )


def parse_claimed(
    rows: Rows, queue: str, owner: str, parents: Container[str] = ()
) -> list[Claimed]:
    """The rows of ``steps_claim`` (claimed as ``owner``) as :class:`Claimed` records;
    ``parents`` are the def_versions whose definition has child nodes."""
    return [
        Claimed(
            id=row[0],
            run_id=row[1],
            node=row[2],
            kind=row[3],
            input=row[4],
            attempt=row[5],
            max_attempts=row[6],
            generation=row[7],
            timeout=row[8],
            sequence_key=row[9],
            workflow=row[10],
            def_version=row[11],
            queue=queue,
            owner=owner,
            input_from=row[12],
            has_fan_out=bool(row[13]),
            bindings=parse_bindings(row[14]),
            has_children=row[11] in parents,
        )
        for row in rows
    ]


def heartbeat_stmt(steps: Sequence[Claimed], *, ttl: float) -> Stmt:
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


def parse_heartbeat(rows: Rows) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
    """The ``(step id, lease owner)`` pairs that :func:`heartbeat_stmt` renewed, and
    those it found busy (locked by another transaction: neither renewed nor lost).

    A step sent and in neither set lost its lease (reclaimed, cancelled, timed out).
    """
    renewed: set[tuple[int, str]] = set()
    busy: set[tuple[int, str]] = set()
    for step_id, owner, done in rows:
        (renewed if done else busy).add((step_id, owner))
    return renewed, busy


def _completions(items: Sequence[tuple[Claimed, str | None]]) -> str:
    rows = ",".join(
        f"[{step.id},{step.generation},{json.dumps(step.owner)},"
        f"{'null' if output is None else output}]"
        for step, output in items
    )
    return f"[{rows}]"


def complete_stmts(items: Sequence[tuple[Claimed, str | None]]) -> list[Stmt]:
    """Complete steps with their outputs (JSON text or ``None``): lock runs, then CAS.

    Each output is JSON text made by ``encode_json``; a batch travels as one JSON text
    of ``[id, generation, owner, output]`` quadruples. Steps of standalone runs take the
    lean ``steps_complete``; workflow steps take ``steps_complete_dag``, which also
    advances their runs; a mixed batch runs both in the one transaction. A run whose
    definition has child nodes adds ``runs_cancel_children`` (a run that ends cancels
    its active child runs); jobs and other workflows never pay for it.

    Returns the statements for one transaction; pass all their results to
    :func:`parse_completed`.
    """
    jobs = [item for item in items if item[0].def_version == "job"]
    dag = [item for item in items if item[0].def_version != "job"]
    stmts = [Stmt(Q.runs_lock, {"run_ids": int_array({step.run_id for step, _ in items})})]
    if jobs:
        stmts.append(Stmt(Q.steps_complete, {"steps": _completions(jobs)}))
    if dag:
        stmts.append(Stmt(Q.steps_complete_dag, {"dag_steps": _completions(dag)}))
        fan_out_runs = {step.run_id for step, _ in dag if step.has_fan_out}
        if fan_out_runs:
            stmts.append(expand_stmt(fan_out_runs))
        parents = {step.run_id for step, _ in dag if step.has_children}
        if parents:
            stmts.append(cancel_children_stmt(parents))
    return stmts


def cancel_children_stmt(run_ids: Iterable[int]) -> Stmt:
    """Cancel the active child runs (and all active below them) of ``run_ids``, locked
    runs that ended, or whose child node ended, in this transaction
    (``runs_cancel_children``); :func:`parse_completed` reads its rows as finished runs."""
    return Stmt(Q.runs_cancel_children, {"ended_runs": int_array(run_ids)})


def expand_stmt(run_ids: Iterable[int]) -> Stmt:
    """Insert the item tasks of fan-out nodes of ``run_ids`` reached by the completions
    before it in the transaction (``steps_expand_fan_outs``)."""
    return Stmt(Q.steps_expand_fan_outs, {"fan_out_runs": int_array(run_ids)})


def parse_completed(results: Sequence[Rows]) -> tuple[set[int], set[int], set[str]]:
    """From the results of :func:`complete_stmts`: ids of steps completed, of runs
    finished (child runs cancelled by ``runs_cancel_children`` included), and the queues
    where the advance made steps available."""
    done: set[int] = set()
    finished: set[int] = set()
    woken: set[str] = set()
    for rows in results[1:]:  # after runs_lock
        for row in rows:
            if row[0] is None:  # a row of steps_expand_fan_outs or runs_cancel_children
                woken.update(row[3] or ())
                if row[2]:
                    finished.add(row[1])
                continue
            done.add(row[0])
            if row[2]:
                finished.add(row[1])
            woken.update(row[3] or ())
    return done, finished, woken


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


def failure_stmts(step: Claimed, failure: Failure) -> tuple[list[Stmt], bool]:
    """The statements recording ``failure``, and whether they form one transaction.

    A retry is one CAS statement. A discard locks the run, CAS-discards the step and
    resolves the run (runs_resolve_discard: fail fast, or cancel the branch), in one
    transaction; when the run's definition has child nodes, ``runs_cancel_children``
    follows (the run, or the branch of a child node, may have ended). Either way the CAS
    is the statement at index :data:`FAILURE_CAS`.
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
    stmts = [
        Stmt(Q.runs_lock, {"run_ids": int_array([step.run_id])}),
        Stmt(Q.steps_discard, params),
        Stmt(Q.runs_resolve_discard, {"run_id": step.run_id, "step_id": step.id}),
    ]
    if step.has_children:
        stmts.append(cancel_children_stmt([step.run_id]))
    return stmts, True


def _held_params(steps: Sequence[Claimed]) -> dict[str, Any]:
    return {
        "ids": [s.id for s in steps],
        "generations": [s.generation for s in steps],
        "owners": [s.owner for s in steps],
    }


FAILURE_CAS = {False: 0, True: 1}
"""Index of the CAS statement among :func:`failure_stmts`, by ``transaction``."""


MISMATCH_DELAY = 1.0
"""Seconds a step given back for a def_version mismatch waits before it is claimable."""


def mismatch_stmt(steps: Sequence[Claimed], known: dict[str, list[str]]) -> Stmt:
    """Give back steps whose run's def_version this worker does not have.

    ``known`` maps workflow names to the def_versions this worker registers; the error
    written names both sides (decisions.md, def_version).
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


def release_stmt(steps: Sequence[Claimed]) -> Stmt:
    """Give held steps back with no attempt and no reclaim counted (``steps_release``)."""
    return Stmt(Q.steps_release, _held_params(steps))


def sequence_recheck_stmts(steps: Sequence[Claimed]) -> list[Stmt]:
    """Lock the sequence keys of fresh claims, then give back those not at their head."""
    return [
        Stmt(Q.steps_sequence_lock, {"keys": [s.sequence_key for s in steps]}),
        Stmt(Q.steps_sequence_release, _held_params(steps)),
    ]


def reclaim_stmts(
    *, step_id: int, run_id: int, generation: int, reclaims: int, timed_out: bool, max_reclaims: int
) -> tuple[list[Stmt], bool]:
    """What the sweep writes for one expired step, and whether it is a discard.

    Below ``max_reclaims`` the step goes back to ``available`` (``steps_reclaim``);
    past it, the step is discarded with ``reclaim_limit``, its run resolved and, if the
    run (or a child node's branch) ended, its active child runs cancelled (the sweep does
    not know the definition; a rare path). The discard's CAS is the statement at index 1.
    """
    reason = "timeout passed" if timed_out else "lease expired"
    if reclaims + 1 <= max_reclaims:
        return [
            Stmt(
                Q.steps_reclaim,
                {
                    "id": step_id,
                    "generation": generation,
                    "error": f"reclaimed: {reason}",
                    "error_kind": "timeout" if timed_out else "lease_expired",
                },
            )
        ], False
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([run_id])}),
        Stmt(
            Q.steps_reclaim_discard,
            {
                "id": step_id,
                "generation": generation,
                "error": f"{reason}; reclaimed {reclaims} times, max_reclaims is {max_reclaims}",
            },
        ),
        Stmt(Q.runs_resolve_discard, {"run_id": run_id, "step_id": step_id}),
        cancel_children_stmt([run_id]),
    ], True


def cancel_stmts(run_id: int) -> list[Stmt]:
    """Cancel a run and its active steps: lock the run, then ``runs_cancel``."""
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([run_id])}),
        Stmt(Q.runs_cancel, {"run_id": run_id}),
    ]


def pause_stmts(run_id: int) -> list[Stmt]:
    """Pause a running run: lock it, then ``runs_pause``."""
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([run_id])}),
        Stmt(Q.runs_pause, {"run_id": run_id}),
    ]


def resume_stmts(run_id: int) -> list[Stmt]:
    """Resume a paused run: lock it, then ``runs_resume``."""
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([run_id])}),
        Stmt(Q.runs_resume, {"run_id": run_id}),
    ]


def retry_stmts(run_id: int, node: str | None, deadline: float | None) -> list[Stmt]:
    """Operator retry: lock the run, then ``runs_retry`` (``deadline`` in seconds)."""
    return [
        Stmt(Q.runs_lock, {"run_ids": int_array([run_id])}),
        Stmt(
            Q.runs_retry,
            {"run_id": run_id, "node": node, "deadline_us": micros(deadline)},
        ),
    ]


def retry_outcome(run_id: int, node: str | None, row: tuple[Any, ...]) -> tuple[int, set[str]]:
    """Read the ``runs_retry`` row: the steps reset and the queues to wake.

    Raises:
        NotFoundError: no run has that id.
        ValidationError: ``node`` is not a node of the run.
        StateError: the run is paused, a discarded step would stay behind, or there is
            nothing to retry.
    """
    reset, woken, run_state, blocked, node_found, _ = row
    if run_state is None:
        raise NotFoundError(f"run {run_id} does not exist")
    if not node_found:
        raise ValidationError(f"run {run_id} has no node {node!r}")
    if run_state == "paused":
        raise StateError(f"run {run_id} is paused: resume it, then retry")
    if blocked:
        raise StateError(
            f"run {run_id}: discarded node(s) {blocked} would stay behind; "
            "retry them too (or the whole run)"
        )
    if not reset:
        raise StateError(f"run {run_id} has no discarded or cancelled step to retry")
    return int(reset), set(woken or ())


def retry_plan(
    run_id: int, node: str | None, deadline: float | None
) -> Plan[tuple[int, set[str], list[int]]]:
    """Operator retry in the current transaction, the whole run tree included: a reset
    child node reopens its existing child run, retried the same way, so its own reset
    child nodes reopen theirs, down to the last level (docs/workflows.md, "Pause,
    resume and operator retry"). A grandchild left failed or cancelled would make its
    parent node fail again at once.

    Runs are locked and retried in ascending id order (a min-heap: a child run's id is
    larger than its parent's), the order of every other writer (runs_lock).

    Returns the steps reset, the queues to wake (of every run reopened), and every run
    reopened, in the order they were retried.

    Raises:
        NotFoundError, ValidationError, StateError: see :func:`retry_outcome` (only for
            ``run_id``; a child run with nothing to retry is left alone).
    """
    yield Stmt(Q.runs_read_committed)
    results: list[Rows] = []
    for stmt in retry_stmts(run_id, node, deadline):
        results.append((yield stmt))
    row = results[-1][0]
    reset, woken = retry_outcome(run_id, node, row)
    runs = [run_id]
    below = list(row[5] or ())
    heapq.heapify(below)
    seen = {run_id}
    while below:
        child = heapq.heappop(below)
        if child in seen:
            continue
        seen.add(child)
        for stmt in retry_stmts(child, None, None):
            child_rows = yield stmt
        if not child_rows or not child_rows[0][0]:
            continue  # a child with nothing to retry (completed, paused) is left alone
        reset += int(child_rows[0][0])
        woken |= set(child_rows[0][1] or ())
        runs.append(child)
        for grandchild in child_rows[0][5] or ():
            heapq.heappush(below, grandchild)
    return reset, woken, runs
