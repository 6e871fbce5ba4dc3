"""The step state machine, explored with Hypothesis against the real database.

:class:`StepMachine` drives the engine's own statements (``cyclone.transitions``,
``cyclone.producer``, the client's cancel transaction and the sweep's logic) on
autocommit psycopg connections, exactly as the worker, the sweep and the client send
them: one connection per worker owner, one for the sweep, one for producer and control
calls. Jobs are enqueued (one by one with unique and sequence keys, timeouts and
delays, or many at once); two owners claim, heartbeat, complete (batched), fail (retry
or discard), snooze (or discard past ``max_snoozes``), release, crash, and stall past
their lease TTL; the sweep reclaims expired
or timed-out leases (or discards them past ``max_reclaims``), possibly acting on a
stale read; runs are cancelled. The database clock is moved by shifting timestamps
(``scheduled_at``, ``lease_expiry``, ``started_at``) into the past, never by sleeping.

The machine keeps a model of what each owner *believes* it holds (the ``Claimed`` of
its claim, with the lease generation): an owner only learns that a lease is gone when
a heartbeat, completion, failure or release of it matches no row, so stale beliefs
survive sweeps and cancels and are used for late completions and failures, by their
owner or by the other one.

After every rule the whole database is read and checked against the design rules
(docs/design.md: Guarantees, Claims, leases and heartbeats, Failure propagation,
Jobs; ``cyclone.states``): every state is a known value; every observed
change of a step or run state is listed in ``STEP_TRANSITIONS`` / ``RUN_TRANSITIONS``;
lease columns are set exactly while a step runs; ``lease_generation``, ``attempt``,
``reclaims`` and ``snoozes`` never decrease, a reclaim or a snooze never counts an
attempt and only a claim bumps the generation; ``attempt <= max_attempts``,
``reclaims <= max_reclaims`` and ``snoozes <= max_snoozes``;
terminal steps and runs carry their timestamps; a standalone run mirrors its one step;
a unique key has at most one active holder; a sequence key has at most one step in
progress; at most one owner believes it holds a step under its current generation.
Each rule also checks its own outcome and that nothing else changed: a stale or
foreign transition changes no row at all; a claim takes only due available steps, in
FIFO order per sequence key, and a claim with room to spare leaves nothing claimable
behind (every sequence key whose steps all wait, due, moves on).

A sequence key's order puts a step started before (retried, waiting out its backoff,
reclaimed or snoozed) first, then the others by ``(scheduled_at, id)``
(docs/decisions.md, ``sequence_key``).
:func:`test_sequence_key_moves_on` pins the two ways a key used to stall for ever
when that started step came after a waiting one by ``(scheduled_at, id)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from psycopg.pq import TransactionStatus

from cyclone import Discard, RetryPolicy, RunState, StepState
from cyclone.config import ClientConfig
from cyclone.control import cancel_stmts
from cyclone.dbio import Stmt, batch_sync, fetch_sync, run_plan_sync
from cyclone.graph import parse_advanced
from cyclone.producer import enqueue_many_stmt, enqueue_plan, enqueued_from_rows
from cyclone.snoozing import Snoozed, snooze_limit_stmts, snooze_stmt
from cyclone.sql import Q
from cyclone.sql.rows import SweepRow
from cyclone.states import (
    ACTIVE_STEP_STATES,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    TERMINAL_RUN_STATES,
    TERMINAL_STEP_STATES,
)
from cyclone.transitions import (
    Claimed,
    claim_stmt,
    complete_stmts,
    decide_failure,
    failure_stmts,
    heartbeat_stmt,
    parse_claimed,
    parse_heartbeat,
    reclaim_stmts,
    release_stmt,
    sequence_recheck_stmts,
)

KIND = "sm_job"
QUEUE = "default"
OWNERS = ("worker-a", "worker-b")
LEASE_TTL = 3600.0
"""Long enough that no lease expires by itself while an example runs."""
STEP_TIMEOUT = 3600.0
"""The per-step timeout of timed steps; the ``clock`` rule moves ``started_at`` past it."""
BACKOFF = RetryPolicy(base=3600.0, factor=1.0, cap=3600.0, jitter=0.0)
"""One hour: a retried step is due only after the ``clock`` rule, never by chance."""
LIMITS = st.sampled_from([1, 2, 3, 4])
"""How many steps one poll may claim."""
SHIFT = "2 hours"
"""How far the ``clock`` rule moves timestamps into the past."""

SETTINGS = settings(max_examples=100, stateful_step_count=40, deadline=None)
"""About 15-20 s on 2 cores. Fewer examples rarely reach the deeper races (a stale
sweep read, a late handler of a stalled owner under a newer claim of its own)."""

S = StepState
R = RunState
ACTIVE = {s.value for s in ACTIVE_STEP_STATES}
TERMINAL = {s.value for s in TERMINAL_STEP_STATES}
TERMINAL_RUNS = {s.value for s in TERMINAL_RUN_STATES}

_STEPS_SNAPSHOT = """
SELECT id, run_id, state, attempt, max_attempts, reclaims, snoozes, lease_owner, lease_expiry,
       lease_generation, heartbeat_at, scheduled_at, started_at, completed_at, output,
       error_kind, unique_key, sequence_key, timeout IS NOT NULL,
       scheduled_at <= now(),
       coalesce(lease_expiry < now(), false),
       coalesce(started_at + timeout <= now(), false)
FROM cyclone_steps
ORDER BY id
"""
_RUNS_SNAPSHOT = "SELECT id, state, finished_at FROM cyclone_runs ORDER BY id"


@dataclass(frozen=True, slots=True)
class StepRow:
    """One ``cyclone_steps`` row; the clock-derived flags are left out of equality."""

    id: int
    run_id: int
    state: str
    attempt: int
    max_attempts: int
    reclaims: int
    snoozes: int
    lease_owner: str | None
    lease_expiry: datetime | None
    lease_generation: int
    heartbeat_at: datetime | None
    scheduled_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    output: Any
    error_kind: str | None
    unique_key: str | None
    sequence_key: str | None
    has_timeout: bool
    due: bool = field(compare=False)
    """``scheduled_at <= now()`` when read."""
    expired: bool = field(compare=False)
    """``lease_expiry < now()`` when read."""
    timed_out: bool = field(compare=False)
    """``started_at + timeout <= now()`` when read."""

    @property
    def sweepable(self) -> bool:
        """What ``steps_sweep_candidates`` and the reclaim guard select."""
        return self.state == S.RUNNING and (self.expired or self.timed_out)

    @property
    def started_before(self) -> bool:
        """The engine's 'in progress' for a sequence key: running, failed, reclaimed or
        snoozed."""
        return self.state == S.RUNNING or self.attempt > 0 or self.reclaims > 0 or self.snoozes > 0

    def held_by(self, owner: str, generation: int) -> bool:
        """Whether a worker transition of ``owner`` at ``generation`` passes the CAS."""
        return (
            self.state == S.RUNNING
            and self.lease_owner == owner
            and self.lease_generation == generation
        )


@dataclass(frozen=True, slots=True)
class RunRow:
    """One ``cyclone_runs`` row, as far as the step machine concerns it."""

    id: int
    state: str
    finished_at: datetime | None


Snapshot = tuple[dict[int, StepRow], dict[int, RunRow]]


@dataclass(frozen=True, slots=True)
class Job:
    """The options of one enqueue."""

    max_attempts: int
    timed: bool
    """With a per-step timeout (``STEP_TIMEOUT``)."""
    start: str
    """``now``; ``later``: an hour ahead, due only after the ``clock`` rule; ``past``:
    backdated by a day (an absolute ``scheduled_at``), ahead of older work of its key."""
    unique_key: str | None
    """Ignored by ``enqueue_many`` (``copies > 1``), which has no unique key."""
    sequence_key: str | None
    copies: int
    """More than one: that many runs in one ``enqueue_many``."""


JOBS = st.builds(
    Job,
    max_attempts=st.sampled_from([3, 1, 2]),
    timed=st.booleans(),
    start=st.sampled_from(["now", "later", "past"]),
    unique_key=st.sampled_from([None, None, "u1", "u2"]),
    sequence_key=st.sampled_from([None, None, "s1", "s2"]),
    copies=st.sampled_from([1, 1, 2, 3]),
)


def _scheduled_at(start: str) -> datetime | timedelta | None:
    """The ``scheduled_at`` option of an enqueue starting ``start`` (see :class:`Job`)."""
    if start == "later":
        return timedelta(hours=1)
    if start == "past":
        return datetime.now(UTC) - timedelta(days=1)
    return None


def snapshot(conn: psycopg.Connection[Any]) -> Snapshot:
    """Every step and run, keyed by id (one round trip)."""
    with conn.pipeline():
        step_rows = conn.execute(_STEPS_SNAPSHOT)
        run_rows = conn.execute(_RUNS_SNAPSHOT)
    steps = {row[0]: StepRow(*row) for row in step_rows.fetchall()}
    runs = {row[0]: RunRow(*row) for row in run_rows.fetchall()}
    return steps, runs


def _order(row: StepRow) -> tuple[datetime, int]:
    """The FIFO order of a sequence key."""
    return row.scheduled_at, row.id


def _by_key(steps: Iterable[StepRow]) -> dict[str, list[StepRow]]:
    """The active steps of each sequence key."""
    keys: dict[str, list[StepRow]] = {}
    for row in steps:
        if row.sequence_key is not None and row.state in ACTIVE:
            keys.setdefault(row.sequence_key, []).append(row)
    return keys


def _sweep_candidates(conn: psycopg.Connection[Any]) -> list[Any]:
    """The sweep's read (``steps_sweep_candidates``)."""
    return fetch_sync(conn, Stmt(Q.steps_sweep_candidates, {"limit": 500}))


def _first_per_step(candidates: list[Any]) -> Iterator[SweepRow]:
    """The sweep's de-duplication: a step both expired and timed out is taken once."""
    seen: set[int] = set()
    for candidate in candidates:
        if candidate[0] not in seen:
            seen.add(candidate[0])
            yield candidate


class StepMachine(RuleBasedStateMachine):
    """Random interleavings of every step transition, checked against the design rules."""

    def __init__(self, conns: dict[str, psycopg.Connection[Any]]) -> None:
        super().__init__()
        self.conns = conns
        self.client = conns["client"]
        self.sweeper = conns["sweep"]
        for conn in conns.values():
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")  # left by a failing example
        self.client.execute("TRUNCATE cyclone_runs CASCADE")
        self.config = ClientConfig(handlers=[], schema="public", retention=None, notify=False)
        self.held: dict[str, dict[tuple[int, int], Claimed]] = {owner: {} for owner in OWNERS}
        """What each owner believes it holds, by (step id, lease generation)."""
        self.max_reclaims = 1
        self.max_snoozes = 1
        self.pending_scan: list[Any] | None = None
        self.inputs = 0
        self.steps, self.runs = snapshot(self.client)

    # -- helpers -------------------------------------------------------------------

    def _snapshot(self) -> Snapshot:
        return snapshot(self.client)

    def _beliefs(self, owner: str | None = None) -> list[tuple[str, Claimed]]:
        owners = OWNERS if owner is None else (owner,)
        return [(o, c) for o in owners for _, c in sorted(self.held[o].items())]

    def _assert_frame(
        self,
        after: Snapshot,
        *,
        steps: Iterable[int] = (),
        runs: Iterable[int] = (),
        before: Snapshot | None = None,
    ) -> None:
        """Every step and run other than the given ones is exactly as it was."""
        old_steps, old_runs = before if before is not None else (self.steps, self.runs)
        new_steps, new_runs = after
        skip_steps, skip_runs = set(steps), set(runs)
        assert set(old_steps) <= set(new_steps), "a step vanished"
        assert set(old_runs) <= set(new_runs), "a run vanished"
        assert set(new_steps) - set(old_steps) <= skip_steps, "an unexpected step appeared"
        assert set(new_runs) - set(old_runs) <= skip_runs, "an unexpected run appeared"
        for step_id, row in old_steps.items():
            if step_id not in skip_steps:
                assert new_steps[step_id] == row, f"step {step_id} changed: {new_steps[step_id]}"
        for run_id, run in old_runs.items():
            if run_id not in skip_runs:
                assert new_runs[run_id] == run, f"run {run_id} changed: {new_runs[run_id]}"

    def _token(self, data: st.DataObject) -> tuple[str, str, Claimed] | None:
        """A belief (its owner and claim) and who acts on it: usually its owner.

        Half of the time a stale belief is preferred (a late handler), when there is one.
        """
        beliefs = self._beliefs()
        if not beliefs:
            return None
        current = [t for t in beliefs if self.steps[t[1].id].held_by(t[0], t[1].generation)]
        stale = [t for t in beliefs if t not in current]
        late = data.draw(st.booleans(), label="late")
        pool = stale if (late and stale) or not current else current
        believer, claimed = data.draw(st.sampled_from(pool), label="belief")
        foreign = data.draw(st.sampled_from([False, False, False, True]), label="foreign")
        actor = next(o for o in OWNERS if o != believer) if foreign else believer
        return believer, actor, claimed

    def _batch(
        self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None
    ) -> tuple[str, list[tuple[str, Claimed]]] | None:
        """Up to three beliefs, and who sends them in one statement.

        Usually the owner of the first belief sends its own beliefs; a foreign batch is
        sent by the other owner and may mix both owners' beliefs. An owner may hold a
        stale and a current claim of one step (a handler still running after a reclaim),
        and both may land in one batch. ``token`` forces the first belief and the sender.
        """
        token = token or self._token(data)
        if token is None:
            return None
        believer, actor, first = token
        pool = [t for t in self._beliefs(believer if actor == believer else None) if t[1] != first]
        more = (
            data.draw(
                st.lists(
                    st.sampled_from(pool),
                    max_size=2,
                    unique_by=lambda t: (t[1].id, t[1].generation),
                ),
                label="more",
            )
            if pool
            else []
        )
        return actor, [(believer, first), *more]

    def _forget(self, owner: str, claimed: Claimed) -> None:
        """The owner is done with this claim (finished it, or learnt that it is lost)."""
        self.held[owner].pop((claimed.id, claimed.generation), None)

    def _claim(self, owner: str, limit: int) -> tuple[list[Claimed], set[int]]:
        """The worker's ``_claim``: claim, then recheck the sequenced claims."""
        conn = self.conns[owner]
        stmt = claim_stmt(queue=QUEUE, kinds=[KIND], owner=owner, ttl=LEASE_TTL, limit=limit)
        claimed = parse_claimed(fetch_sync(conn, stmt), QUEUE, owner)
        sequenced = [c for c in claimed if c.sequence_key is not None]
        given_back: set[int] = set()
        if sequenced:
            rows = batch_sync(conn, sequence_recheck_stmts(sequenced), transaction=True)
            given_back = {row.id for row in rows.of(Q.steps_sequence_release)}
        return claimed, given_back

    def _apply_sweep(self, before: Snapshot, candidates: list[Any]) -> None:
        """Run the sweep's per-step transactions and check each against ``before``."""
        old_steps, old_runs = before
        touched_steps: set[int] = set()
        touched_runs: set[int] = set()
        outcomes = []
        for candidate in _first_per_step(candidates):
            step_id, run_id, generation, reclaims, timed_out = candidate[:5]
            stmts, is_discard = reclaim_stmts(candidate, max_reclaims=self.max_reclaims)
            rows = batch_sync(self.sweeper, stmts, transaction=is_discard)
            changed: list[Any] = (
                rows.of(Q.steps_reclaim_discard) if is_discard else rows.of(Q.steps_reclaim)
            )
            prev = old_steps[step_id]
            ok = prev.state == S.RUNNING and prev.lease_generation == generation and prev.sweepable
            assert bool(changed) == ok, f"sweep of step {step_id}: {changed} vs {prev}"
            if ok:
                assert prev.reclaims == reclaims, "a running generation changed its reclaims"
                touched_steps.add(step_id)
                touched_runs.add(run_id)
            if is_discard:
                resolved = rows.of(Q.graph_resolve_discard)
                assert resolved == [(1, 0, 0) if ok else (0, 0, 0)], resolved  # run failed
            outcomes.append((step_id, run_id, timed_out, is_discard, ok))
        after = self._snapshot()
        self._assert_frame(after, steps=touched_steps, runs=touched_runs, before=before)
        new_steps, new_runs = after
        for step_id, run_id, timed_out, is_discard, ok in outcomes:
            if not ok:
                continue
            prev, row = old_steps[step_id], new_steps[step_id]
            # a reclaim counts one; the discard past the limit is not a reclaim
            assert row.reclaims == prev.reclaims + (0 if is_discard else 1)
            assert row.attempt == prev.attempt, "a reclaim counted an attempt"
            assert row.lease_generation == prev.lease_generation
            assert row.scheduled_at == prev.scheduled_at, "a reclaim moved scheduled_at"
            assert row.lease_owner is None
            assert row.lease_expiry is None
            if is_discard:
                assert prev.reclaims + 1 > self.max_reclaims
                assert row.state == S.DISCARDED
                assert row.error_kind == "reclaim_limit"
                assert new_runs[run_id].state == R.FAILED
            else:
                assert prev.reclaims + 1 <= self.max_reclaims
                assert row.state == S.AVAILABLE
                assert row.error_kind == ("timeout" if timed_out else "lease_expired")
                assert new_runs[run_id] == old_runs[run_id]

    # -- setup ---------------------------------------------------------------------

    @initialize(
        max_reclaims=st.sampled_from([2, 1, 0]),
        max_snoozes=st.sampled_from([1, 0, 2]),
        jobs=st.lists(JOBS, min_size=1, max_size=4),
        polls=st.lists(st.tuples(st.sampled_from(OWNERS), LIMITS), max_size=2),
    )
    def configure(
        self, max_reclaims: int, max_snoozes: int, jobs: list[Job], polls: list[tuple[str, int]]
    ) -> None:
        """Pick the sweep's ``max_reclaims`` (one for every client) and the kind's
        ``max_snoozes``; enqueue, claim a first time."""
        self.max_reclaims = max_reclaims
        self.max_snoozes = max_snoozes
        for job in jobs:
            self.enqueue(job)
            self.database_obeys_the_spec()
        for owner, limit in polls:
            self._poll(owner, limit)
            self.database_obeys_the_spec()

    # -- producer ------------------------------------------------------------------

    @rule(job=JOBS)
    def enqueue(self, job: Job) -> None:
        """Enqueue a standalone job; a live ``unique_key`` returns the holder instead."""
        if job.copies > 1:
            self._enqueue_many(job)
            return
        self.inputs += 1
        request = self.config.request(
            KIND,
            {"n": self.inputs},
            max_attempts=job.max_attempts,
            timeout=STEP_TIMEOUT if job.timed else None,
            scheduled_at=_scheduled_at(job.start),
            unique_key=job.unique_key,
            sequence_key=job.sequence_key,
        )
        enqueued = run_plan_sync(self.client, enqueue_plan(request))
        after = self._snapshot()
        holders = [
            row
            for row in self.steps.values()
            if job.unique_key is not None
            and row.unique_key == job.unique_key
            and row.state in ACTIVE
        ]
        if holders:
            assert enqueued.duplicate
            assert (enqueued.step_id, enqueued.run_id) == (holders[0].id, holders[0].run_id)
            self._assert_frame(after)
            return
        assert not enqueued.duplicate
        self._assert_frame(after, steps=[enqueued.step_id], runs=[enqueued.run_id])
        self._check_new_job(after, enqueued.step_id, enqueued.run_id)
        row = after[0][enqueued.step_id]
        assert (row.max_attempts, row.has_timeout) == (job.max_attempts, job.timed)
        assert (row.unique_key, row.sequence_key) == (job.unique_key, job.sequence_key)
        assert row.due == (job.start != "later")

    def _enqueue_many(self, job: Job) -> None:
        """``enqueue_many``: ``job.copies`` runs with shared options, in one statement."""
        inputs = [{"n": self.inputs + i} for i in range(job.copies)]
        self.inputs += job.copies
        request = self.config.request(
            KIND,
            inputs,
            many=True,
            max_attempts=job.max_attempts,
            timeout=STEP_TIMEOUT if job.timed else None,
            scheduled_at=_scheduled_at(job.start),
            sequence_key=job.sequence_key,
        )
        inserted: list[Any] = fetch_sync(self.client, enqueue_many_stmt(request))
        enqueued = enqueued_from_rows(inserted)
        assert len(enqueued) == job.copies
        assert [e.run_id for e in enqueued] == sorted(e.run_id for e in enqueued)
        after = self._snapshot()
        self._assert_frame(
            after, steps=[e.step_id for e in enqueued], runs=[e.run_id for e in enqueued]
        )
        for e in enqueued:
            self._check_new_job(after, e.step_id, e.run_id)
            row = after[0][e.step_id]
            assert (row.max_attempts, row.has_timeout) == (job.max_attempts, job.timed)
            assert (row.unique_key, row.sequence_key) == (None, job.sequence_key)
            assert row.due == (job.start != "later")

    def _check_new_job(self, after: Snapshot, step_id: int, run_id: int) -> None:
        assert step_id not in self.steps
        assert run_id not in self.runs
        row = after[0][step_id]
        assert row.run_id == run_id
        assert row.state == S.AVAILABLE
        assert (row.attempt, row.reclaims, row.lease_generation) == (0, 0, 0)
        assert after[1][run_id].state == R.RUNNING

    # -- worker --------------------------------------------------------------------

    @rule(poll=st.tuples(st.sampled_from(OWNERS), LIMITS))
    def claim(self, poll: tuple[str, int]) -> None:
        """A worker polls: it claims up to ``limit`` due steps."""
        self._poll(*poll)

    def _poll(self, owner: str, limit: int) -> None:
        """Claim with the sequence recheck, and check what was taken and what was left."""
        claimed, given_back = self._claim(owner, limit)
        assert len(claimed) <= limit
        after = self._snapshot()
        self._assert_frame(after, steps=[c.id for c in claimed])
        old, new = self.steps, after[0]
        for c in claimed:
            prev, row = old[c.id], new[c.id]
            assert prev.state == S.AVAILABLE, f"claimed a {prev.state} step"
            assert prev.due, "claimed a step before its scheduled_at"
            assert c.generation == prev.lease_generation + 1 == row.lease_generation
            assert c.attempt == prev.attempt == row.attempt
            assert c.max_attempts == row.max_attempts
            assert row.reclaims == prev.reclaims
            assert row.scheduled_at == prev.scheduled_at
            if c.id in given_back:
                assert row.state == S.AVAILABLE
                assert (row.lease_owner, row.lease_expiry) == (None, None)
                continue
            assert row.state == S.RUNNING
            assert row.lease_owner == owner
            assert row.started_at is not None
            self.held[owner][(c.id, c.generation)] = c
            if c.sequence_key is not None and not prev.started_before:
                # FIFO per key: nothing of the key in progress, nothing earlier waiting.
                for other in _by_key(old.values()).get(c.sequence_key, []):
                    if other.id != c.id:
                        assert not other.started_before, "a sequenced step overtook one in progress"
                        assert _order(other) > _order(prev), "a sequenced step overtook FIFO"
        if given_back or len(claimed) == limit:
            return
        # A claim with room to spare left nothing claimable behind.
        for row in new.values():
            if row.state == S.AVAILABLE and row.due and row.sequence_key is None:
                raise AssertionError(f"claim with room left due step {row.id} behind")
        taken = {c.id for c in claimed}
        for key, active in _by_key(new.values()).items():
            if any(r.state != S.AVAILABLE or not r.due for r in active):
                continue
            if any(r.id in taken for r in active):
                continue
            raise AssertionError(f"sequence key {key!r} is stuck: {active}")

    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None) -> None:
        """Renew a believed lease; a lost lease (or a foreign owner) changes nothing."""
        token = token or self._token(data)
        if token is None:
            return
        believer, actor, c = token
        prev = self.steps[c.id]
        stmt = heartbeat_stmt([replace(c, owner=actor)], ttl=LEASE_TTL)
        renewed, busy = parse_heartbeat(fetch_sync(self.conns[actor], stmt))
        after = self._snapshot()
        ok = prev.held_by(actor, c.generation) and not prev.timed_out
        assert not busy, f"heartbeat {actor}: {busy} busy with nothing else running"
        assert bool(renewed) == ok, f"heartbeat {actor} gen {c.generation}: {renewed} vs {prev}"
        if not ok:
            self._assert_frame(after)
            if actor == believer:
                self._forget(believer, c)
            return
        self._assert_frame(after, steps=[c.id])
        row = after[0][c.id]
        assert row.state == S.RUNNING
        assert not row.expired
        assert (row.lease_owner, row.lease_generation) == (actor, c.generation)
        assert (row.attempt, row.reclaims, row.started_at) == (
            prev.attempt,
            prev.reclaims,
            prev.started_at,
        )

    @rule(data=st.data())
    def complete(self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None) -> None:
        """Complete a batch of believed steps in one transaction (the completer)."""
        batch = self._batch(data, token)
        if batch is None:
            return
        actor, tokens = batch
        outputs = [
            data.draw(st.sampled_from([None, '{"n": 1}', '"done"']), label="output") for _ in tokens
        ]
        items = [(c, out) for (_, c), out in zip(tokens, outputs, strict=True)]
        rows = batch_sync(
            self.conns[actor],
            complete_stmts([(replace(c, owner=actor), out) for c, out in items]),
            transaction=True,
        )
        advanced = parse_advanced(rows)
        done, finished = set(advanced.done), set(advanced.finished)
        after = self._snapshot()
        expected = {c.id: out for c, out in items if self.steps[c.id].held_by(actor, c.generation)}
        assert done == set(expected), f"completed {done}, expected {set(expected)}"
        runs = {self.steps[i].run_id for i in done}
        assert finished == runs, "a standalone run did not finish with its step"
        self._assert_frame(after, steps=done, runs=runs)
        for step_id, out in expected.items():
            prev, row = self.steps[step_id], after[0][step_id]
            assert row.state == S.COMPLETED
            assert row.output == (None if out is None else json.loads(out))
            assert (row.lease_owner, row.lease_expiry) == (None, None)
            assert (row.attempt, row.reclaims, row.lease_generation) == (
                prev.attempt,
                prev.reclaims,
                prev.lease_generation,
            )
            assert after[1][prev.run_id].state == R.COMPLETED
        for owner, c in tokens:
            if owner == actor:
                self._forget(owner, c)

    @rule(data=st.data())
    def fail(self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None) -> None:
        """Record a failed attempt: a retry with backoff, or a discard that fails the run."""
        token = token or self._token(data)
        if token is None:
            return
        believer, actor, c = token
        discard = data.draw(st.booleans(), label="discard")
        exc: Exception = Discard("not worth retrying") if discard else RuntimeError("boom")
        failure = decide_failure(c, exc, retry=BACKOFF, no_retry=())
        stmts, transaction = failure_stmts(replace(c, owner=actor), failure)
        rows = batch_sync(self.conns[actor], stmts, transaction=transaction)
        changed: list[Any] = rows.of(Q.steps_discard) if transaction else rows.of(Q.steps_retry)
        after = self._snapshot()
        prev = self.steps[c.id]
        ok = prev.held_by(actor, c.generation)
        assert bool(changed) == ok, f"failure {actor} gen {c.generation}: {changed} vs {prev}"
        if actor == believer:
            self._forget(believer, c)
        if not ok:
            self._assert_frame(after)
            return
        assert failure.discard == (discard or prev.attempt + 1 >= prev.max_attempts)
        row, run = after[0][c.id], after[1][c.run_id]
        self._assert_frame(after, steps=[c.id], runs=[c.run_id])
        assert row.attempt == prev.attempt + 1
        assert (row.reclaims, row.lease_generation) == (prev.reclaims, prev.lease_generation)
        assert (row.lease_owner, row.lease_expiry) == (None, None)
        assert row.error_kind == ("discard" if discard else "exception")
        if failure.discard:
            assert row.state == S.DISCARDED
            assert run.state == R.FAILED
            # the run failed once, nothing else to cancel
            assert rows.of(Q.graph_resolve_discard) == [(1, 0, 0)]
        else:
            assert row.state == S.AVAILABLE
            assert not row.due, "a retry ignored its backoff"
            assert run == self.runs[c.run_id]

    @rule(data=st.data())
    def snooze(self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None) -> None:
        """The handler raises ``Snooze``: given back for later with no attempt counted, or,
        past ``max_snoozes``, discarded with ``snooze_limit`` and its run failed."""
        token = token or self._token(data)
        if token is None:
            return
        believer, actor, c = token
        delay = data.draw(st.sampled_from([0.0, 3600.0]), label="delay")
        snoozed = Snoozed(delay, self.max_snoozes, "stack")
        held = replace(c, owner=actor)
        conn = self.conns[actor]
        given_back = batch_sync(conn, [snooze_stmt(held, snoozed)], transaction=False)
        rows = given_back.of(Q.steps_snooze)
        discarded: list[Any] = []
        if not rows:
            limit = batch_sync(conn, snooze_limit_stmts(held, snoozed), transaction=True)
            discarded = limit.of(Q.steps_snooze_discard)
            resolved = limit.of(Q.graph_resolve_discard)
            assert resolved == ([(1, 0, 0)] if discarded else [(0, 0, 0)]), resolved
        after = self._snapshot()
        prev = self.steps[c.id]
        ok = prev.held_by(actor, c.generation)
        at_limit = prev.snoozes >= self.max_snoozes
        assert bool(rows) == (ok and not at_limit), f"snooze {actor}: {rows} vs {prev}"
        assert bool(discarded) == (ok and at_limit), f"snooze limit {actor}: {prev}"
        if actor == believer:
            self._forget(believer, c)
        if not ok:
            self._assert_frame(after)
            return
        row, run = after[0][c.id], after[1][c.run_id]
        assert (row.reclaims, row.lease_generation) == (prev.reclaims, prev.lease_generation)
        assert (row.lease_owner, row.lease_expiry) == (None, None)
        if at_limit:
            self._assert_frame(after, steps=[c.id], runs=[c.run_id])
            assert (row.state, row.error_kind) == (S.DISCARDED, "snooze_limit")
            assert (row.attempt, row.snoozes) == (prev.attempt + 1, prev.snoozes)
            assert run.state == R.FAILED
            return
        self._assert_frame(after, steps=[c.id])
        assert rows == [(c.id, prev.snoozes + 1)]
        assert (row.state, row.snoozes) == (S.AVAILABLE, prev.snoozes + 1)
        assert (row.attempt, row.error_kind) == (prev.attempt, prev.error_kind)
        assert row.due == (delay == 0), "a snooze ignored its delay"

    @rule(data=st.data())
    def release(self, data: st.DataObject, token: tuple[str, str, Claimed] | None = None) -> None:
        """Give believed steps back at shutdown: no attempt, no reclaim, same schedule."""
        batch = self._batch(data, token)
        if batch is None:
            return
        actor, tokens = batch
        rows = fetch_sync(
            self.conns[actor], release_stmt([replace(c, owner=actor) for _, c in tokens])
        )
        after = self._snapshot()
        released = {row[0] for row in rows}
        expected = {c.id for _, c in tokens if self.steps[c.id].held_by(actor, c.generation)}
        assert released == expected, f"released {released}, expected {expected}"
        self._assert_frame(after, steps=released)
        for step_id in released:
            prev, row = self.steps[step_id], after[0][step_id]
            assert row.state == S.AVAILABLE
            assert (row.lease_owner, row.lease_expiry) == (None, None)
            assert (row.attempt, row.reclaims, row.lease_generation, row.scheduled_at) == (
                prev.attempt,
                prev.reclaims,
                prev.lease_generation,
                prev.scheduled_at,
            )
        for owner, c in tokens:
            if owner == actor:
                self._forget(owner, c)

    @rule(owner=st.sampled_from(OWNERS))
    def crash(self, owner: str) -> None:
        """The owner's process dies: it forgets its leases, which stay until the sweep."""
        self.held[owner].clear()

    # -- the database clock --------------------------------------------------------

    @rule(data=st.data())
    def clock(self, data: st.DataObject) -> None:
        """Time passes on the database clock, by shifting timestamps into the past.

        Either every ``scheduled_at`` moves (backoffs and delays are over), or some
        running timed steps pass ``started_at + timeout``. Then, maybe, every owner's
        heartbeat loop fires once for each claim it believes it holds.
        """
        timed = sorted(i for i, r in self.steps.items() if r.state == S.RUNNING and r.has_timeout)
        if bool(timed) and data.draw(st.booleans(), label="time out"):
            ids = data.draw(st.lists(st.sampled_from(timed), min_size=1, unique=True), label="ids")
            self.client.execute(
                f"UPDATE cyclone_steps SET started_at = started_at - interval '{SHIFT}' "
                "WHERE id = ANY(%s)",
                (ids,),
            )
        else:
            self.client.execute(
                f"UPDATE cyclone_steps SET scheduled_at = scheduled_at - interval '{SHIFT}'"
            )
        if data.draw(st.booleans(), label="heartbeats"):
            self._heartbeats(data)

    def _heartbeats(self, data: st.DataObject) -> None:
        """Every owner's heartbeat loop fires once for each claim it believes it holds."""
        self.database_obeys_the_spec()
        for owner, c in self._beliefs():
            self.heartbeat(data, token=(owner, owner, c))
            self.database_obeys_the_spec()

    def _expire(self, ids: list[int]) -> None:
        """Let the leases of these running steps lapse, on the database clock."""
        self.client.execute(
            "UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second' "
            "WHERE id = ANY(%s) AND state = 'running'",
            (ids,),
        )

    # -- sweep ---------------------------------------------------------------------

    @rule(data=st.data())
    def sweep(self, data: st.DataObject) -> None:
        """Some leases expire, then a sweeper reads its candidates and reclaims each one.

        Every client runs a sweep, and a sweeper's read races with its writes: a
        ``scan`` only reads, and a later ``apply`` reclaims what that read found, after
        other rules (and other sweepers' full ``pass``-es) ran, maybe right after the
        owners' heartbeats. A step that moved on in between (renewed, finished, or
        reclaimed and claimed again, even if that new lease expired too) must be left
        alone.
        """
        modes = ["pass", "scan"] if self.pending_scan is None else ["pass", "apply"]
        mode = data.draw(st.sampled_from(modes), label="mode")
        if mode == "apply":
            candidates, self.pending_scan = self.pending_scan or [], None
            if data.draw(st.booleans(), label="heartbeats first"):
                self._heartbeats(data)
            # Maybe leases lapse again: any, or those of the steps the scan read (renewed
            # since, or reclaimed and claimed again since).
            read = {c[0] for c in candidates}
            running = sorted(i for i, r in self.steps.items() if r.state == S.RUNNING)
            lapse = data.draw(st.sampled_from(["none", "read", "any"]), label="lapse")
            pool = [i for i in running if i in read] if lapse == "read" else running
            if pool and lapse != "none":
                expire = st.lists(st.sampled_from(pool), min_size=1, unique=True)
                self._expire(data.draw(expire, label="expire"))
            self._apply_sweep(self._snapshot(), candidates)
            return
        running = sorted(i for i, r in self.steps.items() if r.state == S.RUNNING)
        if running:
            expire = st.lists(st.sampled_from(running), min_size=1, unique=True)
            self._expire(data.draw(expire, label="expire"))
        if mode == "scan":
            self.pending_scan = self._scan()[1]
        else:
            self._apply_sweep(*self._scan())

    def _scan(self) -> tuple[Snapshot, list[Any]]:
        """The sweep's read: exactly the running steps past their lease or timeout."""
        before = self._snapshot()
        candidates = _sweep_candidates(self.sweeper)
        expected = {i for i, r in before[0].items() if r.sweepable}
        assert {c[0] for c in candidates} == expected, "sweep candidates"
        return before, candidates

    @rule(data=st.data())
    def stall(self, data: st.DataObject) -> None:
        """An owner stalls past its lease TTL (a long pause) while its handlers run on.

        Its leases lapse, a sweep reclaims them and the owner's next poll may take the
        same steps back under new generations; then its old handlers resume and each
        heartbeats, completes, fails or releases with its stale claim, while the row may
        run under the owner's name again (the ABA case that only the generation fences).
        """
        owners = sorted({r.lease_owner for r in self.steps.values() if r.lease_owner})
        if not owners:
            return
        owner = data.draw(st.sampled_from(owners), label="owner")
        mine = sorted(
            i for i, r in self.steps.items() if r.state == S.RUNNING and r.lease_owner == owner
        )
        self._expire(mine)
        self._apply_sweep(*self._scan())
        self.database_obeys_the_spec()
        self._poll(owner, 3)
        self.database_obeys_the_spec()
        late = [
            c for _, c in self._beliefs(owner) if not self.steps[c.id].held_by(owner, c.generation)
        ]
        aba = [
            c for c in late if self.steps[c.id].held_by(owner, self.steps[c.id].lease_generation)
        ]
        for claimed in aba + [c for c in late if c not in aba]:
            act = data.draw(st.sampled_from(["complete", "fail", "heartbeat", "release", "snooze"]))
            getattr(self, act)(data, token=(owner, owner, claimed))
            self.database_obeys_the_spec()

    # -- control -------------------------------------------------------------------

    @rule(data=st.data())
    def client_cancel(self, data: st.DataObject) -> None:
        """The client cancels a run (its cancel transaction); a finished run is left alone.

        The run is picked among those whose step runs, or is available, or among all.
        """
        if not self.runs:
            return
        target = data.draw(st.sampled_from([S.RUNNING, S.AVAILABLE, None]), label="target")
        pool = sorted(r.run_id for r in self.steps.values() if r.state == target)
        run_id = data.draw(st.sampled_from(pool or sorted(self.runs)), label="run")
        rows = batch_sync(self.client, cancel_stmts(run_id), transaction=True)
        after = self._snapshot()
        prev = self.runs[run_id]
        if prev.state not in (R.RUNNING, R.PAUSED):
            assert rows.of(Q.runs_cancel) == []
            self._assert_frame(after)
            return
        active = [i for i, r in self.steps.items() if r.run_id == run_id and r.state in ACTIVE]
        assert rows.of(Q.runs_cancel) == [(run_id, len(active))]
        self._assert_frame(after, steps=active, runs=[run_id])
        assert after[1][run_id].state == R.CANCELLED
        for step_id in active:
            prev_row, row = self.steps[step_id], after[0][step_id]
            assert row.state == S.CANCELLED
            assert (row.lease_owner, row.lease_expiry) == (None, None)
            assert (row.attempt, row.reclaims, row.lease_generation) == (
                prev_row.attempt,
                prev_row.reclaims,
                prev_row.lease_generation,
            )

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def database_obeys_the_spec(self) -> None:
        """Read everything; check each row, each change since the last read, the model."""
        steps, runs = self._snapshot()
        for row in steps.values():
            self._check_step(row)
        of_run: dict[int, list[StepRow]] = {run_id: [] for run_id in runs}
        for row in steps.values():
            of_run[row.run_id].append(row)
        for run in runs.values():
            self._check_run(run, of_run[run.id])
        self._check_changes(steps, runs)
        self._check_keys(steps)
        self._check_beliefs(steps)
        self.steps, self.runs = steps, runs

    def _check_step(self, row: StepRow) -> None:
        assert row.state in set(StepState), f"unknown step state {row.state!r}"
        if row.state == S.RUNNING:
            assert row.lease_owner in OWNERS, f"running step {row.id} without a lease owner"
            assert row.lease_expiry is not None, f"running step {row.id} without lease_expiry"
            assert row.started_at is not None
            assert row.heartbeat_at is not None
            assert row.lease_generation >= 1
        else:
            assert row.lease_owner is None, f"{row.state} step {row.id} keeps a lease owner"
            assert row.lease_expiry is None, f"{row.state} step {row.id} keeps a lease expiry"
        if row.state in TERMINAL:
            assert row.completed_at is not None, f"{row.state} step {row.id} has no completed_at"
        assert 0 <= row.attempt <= row.max_attempts, f"step {row.id}: attempt {row.attempt}"
        assert 0 <= row.reclaims <= self.max_reclaims, f"step {row.id}: {row.reclaims}"
        assert 0 <= row.snoozes <= self.max_snoozes, f"step {row.id}: {row.snoozes} snoozes"

    def _check_run(self, run: RunRow, steps: list[StepRow]) -> None:
        assert run.state in set(RunState), f"unknown run state {run.state!r}"
        assert (run.finished_at is not None) == (run.state in TERMINAL_RUNS)
        assert len(steps) == 1, f"standalone run {run.id} has {len(steps)} steps"
        step = steps[0].state
        mirrors: dict[RunState, set[str]] = {
            R.COMPLETED: {S.COMPLETED},
            R.FAILED: {S.DISCARDED},
            R.CANCELLED: {S.CANCELLED},
            R.RUNNING: ACTIVE,
            R.PAUSED: ACTIVE,
        }
        assert step in mirrors[RunState(run.state)], f"run {run.state}, its step {step}"

    def _check_changes(self, steps: dict[int, StepRow], runs: dict[int, RunRow]) -> None:
        assert set(self.steps) <= set(steps), "a step vanished"
        assert set(self.runs) <= set(runs), "a run vanished"
        for step_id, row in steps.items():
            prev = self.steps.get(step_id)
            if prev is None:
                assert row.state == S.AVAILABLE, f"new step {step_id} is {row.state}"
                continue
            move = (StepState(prev.state), StepState(row.state))
            assert move[0] == move[1] or move in STEP_TRANSITIONS, f"step {step_id}: {move}"
            assert (row.run_id, row.max_attempts) == (prev.run_id, prev.max_attempts)
            bump = row.lease_generation - prev.lease_generation
            attempts = row.attempt - prev.attempt
            reclaims = row.reclaims - prev.reclaims
            snoozes = row.snoozes - prev.snoozes
            assert bump in (0, 1), f"step {step_id}: lease_generation moved by {bump}"
            assert attempts in (0, 1), f"step {step_id}: attempt moved by {attempts}"
            assert reclaims in (0, 1), f"step {step_id}: reclaims moved by {reclaims}"
            if bump:
                assert prev.state == S.AVAILABLE, f"step {step_id}: generation bumped off a claim"
            if move == (S.AVAILABLE, S.RUNNING):
                assert bump == 1, f"step {step_id} claimed without a new generation"
            if attempts or reclaims:
                assert prev.state == S.RUNNING
                assert row.state in (S.AVAILABLE, S.DISCARDED)
                assert not (attempts and reclaims), "a reclaim counted an attempt"
            assert snoozes in (0, 1), f"step {step_id}: snoozes moved by {snoozes}"
            if snoozes:
                assert (prev.state, row.state) == (S.RUNNING, S.AVAILABLE), f"snooze {step_id}"
                assert not (attempts or reclaims), "a snooze counted an attempt or a reclaim"
        for run_id, run in runs.items():
            prev_run = self.runs.get(run_id)
            if prev_run is None:
                assert run.state == R.RUNNING, f"new run {run_id} is {run.state}"
                continue
            moved = (RunState(prev_run.state), RunState(run.state))
            assert moved[0] == moved[1] or moved in RUN_TRANSITIONS, f"run {run_id}: {moved}"

    def _check_keys(self, steps: dict[int, StepRow]) -> None:
        holders: dict[str, list[int]] = {}
        for row in steps.values():
            if row.unique_key is not None and row.state in ACTIVE:
                holders.setdefault(row.unique_key, []).append(row.id)
        for key, ids in holders.items():
            assert len(ids) == 1, f"unique_key {key!r} held by {ids}"
        for key, active in _by_key(steps.values()).items():
            in_progress = [r.id for r in active if r.started_before]
            assert len(in_progress) <= 1, f"sequence key {key!r} runs {in_progress} at once"

    def _check_beliefs(self, steps: dict[int, StepRow]) -> None:
        current: dict[int, list[str]] = {}
        for owner, c in self._beliefs():
            row = steps[c.id]
            assert c.generation <= row.lease_generation, "a belief from the future"
            if c.generation == row.lease_generation:
                current.setdefault(c.id, []).append(owner)
                if row.state == S.RUNNING:
                    assert row.lease_owner == owner, f"{owner} and {row.lease_owner} hold {c.id}"
        for step_id, owners in current.items():
            assert len(owners) <= 1, f"{owners} all believe they hold step {step_id}"


@pytest.fixture
def conns(dsn: str) -> Iterator[dict[str, psycopg.Connection[Any]]]:
    """Autocommit connections: one per owner, one for the sweep, one for the client."""
    opened = {name: psycopg.connect(dsn, autocommit=True) for name in (*OWNERS, "sweep", "client")}
    try:
        yield opened
    finally:
        for conn in opened.values():
            conn.close()


@pytest.mark.parametrize(
    "examples",
    [pytest.param(20, id="quick"), pytest.param(100, id="full", marks=pytest.mark.slow)],
)
def test_step_state_machine(conns: dict[str, psycopg.Connection[Any]], examples: int) -> None:
    """No interleaving of step transitions reaches a state the rules forbid (a quick
    search in the fast tier, the full one in the full suite)."""

    class BoundStepMachine(StepMachine):
        """:class:`StepMachine` on this test's connections (hypothesis makes it with no
        arguments)."""

        def __init__(self) -> None:
            super().__init__(conns)

    run_state_machine_as_test(BoundStepMachine, settings=settings(SETTINGS, max_examples=examples))


@pytest.mark.parametrize("trigger", ["retry", "reclaim", "snooze"])
def test_sequence_key_moves_on(conns: dict[str, psycopg.Connection[Any]], trigger: str) -> None:
    """docs/decisions.md, ``sequence_key``: a step started before keeps the head of its key.

    A of key ``k`` is claimed. B of ``k`` is enqueued while A runs and ends up before A
    by ``(scheduled_at, id)``: ``retry``: A fails and its backoff schedules it after B;
    ``snooze``: A's handler snoozes for an hour, after B; ``reclaim``: B is backdated,
    A's lease expires and the sweep reclaims A. B must not
    overtake A, and once A is due again A is claimed (the key once stalled here for
    ever: each of the two blocked the other's claim).
    """
    client, worker = conns["client"], conns[OWNERS[0]]
    config = ClientConfig(handlers=[], schema="public", retention=None, notify=False)

    def enqueue(**options: Any) -> int:
        request = config.request(KIND, {}, sequence_key="k", max_attempts=3, **options)
        return run_plan_sync(client, enqueue_plan(request)).step_id

    def claim(limit: int) -> list[Claimed]:
        stmt = claim_stmt(queue=QUEUE, kinds=[KIND], owner=OWNERS[0], ttl=LEASE_TTL, limit=limit)
        return parse_claimed(fetch_sync(worker, stmt), QUEUE, OWNERS[0])

    a = enqueue()
    [held] = claim(1)
    assert held.id == a
    if trigger == "retry":
        b = enqueue()
        failure = decide_failure(held, RuntimeError("boom"), retry=BACKOFF, no_retry=())
        stmts, transaction = failure_stmts(held, failure)
        written: list[Any] = batch_sync(worker, stmts, transaction=transaction).of(Q.steps_retry)
        assert claim(2) == [], "B overtook A while A waits out its backoff"
        client.execute(f"UPDATE cyclone_steps SET scheduled_at = scheduled_at - interval '{SHIFT}'")
    elif trigger == "snooze":
        b = enqueue()
        stmt = snooze_stmt(held, Snoozed(3600.0, 5))
        written = batch_sync(worker, [stmt], transaction=False).of(Q.steps_snooze)
        assert claim(2) == [], "B overtook A while A is snoozed"
        client.execute(f"UPDATE cyclone_steps SET scheduled_at = scheduled_at - interval '{SHIFT}'")
    else:
        b = enqueue(scheduled_at=datetime.now(UTC) - timedelta(days=1))
        client.execute("UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second'")
        [candidate] = _sweep_candidates(conns["sweep"])
        stmts, _ = reclaim_stmts(candidate, max_reclaims=3)
        written = batch_sync(conns["sweep"], stmts, transaction=False).of(Q.steps_reclaim)
    assert [row[0] for row in written] == [a]
    assert [c.id for c in claim(2)] == [a], f"B ({b}) overtook A, or the key is stuck"
