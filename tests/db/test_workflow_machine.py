"""The run graph's state machine, explored with Hypothesis against the real database.

:class:`WorkflowMachine` submits runs of a few workflow shapes (a diamond whose
downstream nodes fail the run or only cancel their branch, a fan-out with or without a
parallelism cap, a timer, a signal wait with a timeout, some with a run deadline) and
drives them with the engine's own code: claims and completions and failures as the
worker writes them (``cyclone.transitions``, ``cyclone.graph``), pause, resume, retry
and cancel as both clients run them (``cyclone.control``), signals
(``cyclone.signals``), and passes of the real wait scanner (timers, signal timeouts,
deadlines, fan-out releases and completions). Time moves by shifting timestamps into
the past, never by sleeping.

Every database test runs under the transition guard (``tests/guard.py``): any state
change not in ``STEP_TRANSITIONS`` / ``RUN_TRANSITIONS``, or a claim of a step whose
parent is not completed, fails the statement that made it. After every rule the
machine also reads everything and checks the run graph's own invariants: a step is
reached only when its dependencies completed; a run is not finished exactly while it
has an active step (none is stranded, none finishes early); in a run that is not
finished, a pending node (other than fan-out nodes and item tasks) has a dependency
that is not completed, which is what resume and retry rely on; a paused run has no
available step; a fan-out never has more items at work than its ``max_parallel``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool

import cyclone
from cyclone import Discard, RetryPolicy
from cyclone.config import ClientConfig
from cyclone.control import Outcome, cancel_plan, pause_plan, resume_plan, retry_plan
from cyclone.dbio import Plan, batch_sync, fetch_sync, run_plan_sync
from cyclone.errors import NotFoundError, StateError, ValidationError
from cyclone.scanners.waits import WaitScanner
from cyclone.signals import signal_plan
from cyclone.states import ACTIVE_STEP_STATES
from cyclone.submit import submit_plan
from cyclone.transitions import (
    Claimed,
    claim_stmt,
    complete_stmts,
    decide_failure,
    failure_stmts,
    parse_claimed,
)
from cyclone.wakeups import Announcer

KIND = "wm_step"
QUEUE = "default"
OWNERS = ("worker-a", "worker-b")
BACKOFF = RetryPolicy(base=3600.0, factor=1.0, cap=3600.0, jitter=0.0)
"""A retried step is due only after the ``clock`` rule."""
ACTIVE = {s.value for s in ACTIVE_STEP_STATES}
WORKING = {"available", "running", "waiting_timer", "waiting_signal", "waiting_child"}
"""States a step is in only once it was reached."""
SETTINGS = settings(max_examples=40, stateful_step_count=30, deadline=None)


@cyclone.step(KIND, max_attempts=2)
def work(ctx: cyclone.Context, inp: Any) -> Any:
    """Never run: the machine writes each outcome itself."""
    return inp


def _diamond(policy: str) -> cyclone.Workflow:
    wf = cyclone.Workflow(f"wm_diamond_{policy}")
    a = wf.node("a", work)
    b = wf.node("b", work, after=[a], on_dep_failure=policy)  # type: ignore[arg-type]
    c = wf.node("c", work, after=[a], on_dep_failure=policy)  # type: ignore[arg-type]
    wf.result(wf.node("d", work, after=[b, c], on_dep_failure=policy))  # type: ignore[arg-type]
    return wf


def _fan(parallel: int) -> cyclone.Workflow:
    wf = cyclone.Workflow(f"wm_fan_{parallel}")
    src = wf.node("src", work)
    each = wf.fan_out("each", work, over=src, max_parallel=parallel)
    wf.result(wf.node("end", work, input_from=each))
    return wf


def _timer() -> cyclone.Workflow:
    wf = cyclone.Workflow("wm_timer")
    nap = wf.sleep("nap", 3600, after=[wf.node("a", work)])
    wf.result(wf.node("z", work, after=[nap]))
    return wf


def _signal() -> cyclone.Workflow:
    wf = cyclone.Workflow("wm_signal")
    sig = wf.wait_signal("sig", "go", timeout=3600, after=[wf.node("a", work)])
    wf.result(wf.node("z", work, input_from=sig))
    return wf


SHAPES = {
    wf.name: wf
    for wf in (_diamond("fail_run"), _diamond("cancel_branch"), _fan(0), _fan(1), _timer())
}
SHAPES["wm_signal"] = _signal()
CONFIG = ClientConfig(
    handlers=[work], workflows=list(SHAPES.values()), schema="public", retention=None, notify=False
)


@dataclass(frozen=True, slots=True)
class Row:
    """One step as the invariants read it."""

    id: int
    run_id: int
    node: str
    state: str
    item_of: str | None
    fan_out_parallel: int | None
    deps: tuple[str, ...]


_STEPS = """
SELECT s.id, s.run_id, s.node, s.state, s.item_of, s.fan_out_parallel,
       coalesce(array_agg(d.dep_node ORDER BY d.dep_node)
                FILTER (WHERE d.dep_node IS NOT NULL), '{}')
FROM cyclone_steps s
LEFT JOIN cyclone_deps d ON d.run_id = s.run_id AND d.node = s.node
GROUP BY s.id
ORDER BY s.id
"""


class _Quiet:
    """A publisher that sends nothing: the machine reads the database, not wakeups."""

    def available(self, queues: Iterable[str]) -> None:
        pass

    def run_done(self, run_ids: Iterable[int]) -> None:
        pass


class WorkflowMachine(RuleBasedStateMachine):
    """Random interleavings of the run graph's moves, checked after each one."""

    def __init__(self, env: Env) -> None:
        super().__init__()
        self.env = env
        self.client = env.conns["client"]
        for conn in env.conns.values():
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")  # left by a failing example
        self.client.execute("TRUNCATE cyclone_runs CASCADE")
        self.held: dict[str, list[Claimed]] = {owner: [] for owner in OWNERS}

    # -- helpers -------------------------------------------------------------------

    def _runs(self) -> list[int]:
        return [row[0] for row in self.client.execute("SELECT id FROM cyclone_runs ORDER BY id")]

    def _operate(self, plan: Plan[Outcome[Any]]) -> None:
        """An operator plan in its own transaction; a refusal writes nothing."""
        before = self._everything()
        try:
            with self.client.transaction():
                run_plan_sync(self.client, plan)
        except (StateError, NotFoundError, ValidationError):
            assert self._everything() == before, "a refused operator call wrote something"

    def _everything(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        steps = self.client.execute("SELECT * FROM cyclone_steps ORDER BY id").fetchall()
        runs = self.client.execute("SELECT * FROM cyclone_runs ORDER BY id").fetchall()
        return steps, runs

    def _pick(self, data: st.DataObject) -> tuple[str, Claimed] | None:
        beliefs = [(o, c) for o in OWNERS for c in self.held[o]]
        if not beliefs:
            return None
        owner, claimed = data.draw(st.sampled_from(beliefs), label="belief")
        self.held[owner].remove(claimed)
        return owner, claimed

    # -- rules ---------------------------------------------------------------------

    @rule(shape=st.sampled_from(sorted(SHAPES)), deadline=st.booleans())
    def submit(self, shape: str, deadline: bool) -> None:
        options = {"deadline": 3600} if deadline else {}
        request = CONFIG.submit_request(SHAPES[shape], {"n": 1}, **options)
        with self.client.transaction():
            run_plan_sync(self.client, submit_plan(request))

    @rule(owner=st.sampled_from(OWNERS), limit=st.sampled_from([1, 2, 5]))
    def claim(self, owner: str, limit: int) -> None:
        stmt = claim_stmt(queue=QUEUE, kinds=[KIND], owner=owner, ttl=3600, limit=limit)
        rows = fetch_sync(self.env.conns[owner], stmt)
        self.held[owner].extend(parse_claimed(rows, QUEUE, owner))

    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        picked = self._pick(data)
        if picked is None:
            return
        owner, step = picked
        if step.node == "src":  # the fan-out's list: usually a list, sometimes not
            output = data.draw(st.sampled_from(["[]", "[1]", "[1, 2, 3]", '{"no": 1}']))
        else:
            output = "1"
        stmts = complete_stmts([(step, output)])
        batch_sync(self.env.conns[owner], stmts, transaction=True)

    @rule(data=st.data(), discard=st.booleans())
    def fail(self, data: st.DataObject, discard: bool) -> None:
        picked = self._pick(data)
        if picked is None:
            return
        owner, step = picked
        error = Discard("given up") if discard else RuntimeError("boom")
        failure = decide_failure(step, error, retry=BACKOFF, no_retry=())
        stmts, transaction = failure_stmts(step, failure)
        batch_sync(self.env.conns[owner], stmts, transaction=transaction)

    @rule(data=st.data(), action=st.sampled_from(["pause", "resume", "cancel", "retry"]))
    def operate(self, data: st.DataObject, action: str) -> None:
        runs = self._runs()
        if not runs:
            return
        run_id = data.draw(st.sampled_from(runs), label="run")
        if action == "pause":
            self._operate(pause_plan(run_id))
        elif action == "resume":
            self._operate(resume_plan(run_id))
        elif action == "cancel":
            self._operate(cancel_plan(run_id))
        else:
            nodes = [None, "a", "b", "c", "d", "src", "each", "end", "nap", "sig", "z"]
            node = data.draw(st.sampled_from(nodes), label="node")
            self._operate(retry_plan(run_id, node, None))

    @rule(data=st.data())
    def signal(self, data: st.DataObject) -> None:
        runs = self._runs()
        if not runs:
            return
        run_id = data.draw(st.sampled_from(runs), label="run")
        try:
            with self.client.transaction():
                run_plan_sync(self.client, signal_plan(run_id, "go", json.dumps({"ok": 1})))
        except (ValidationError, NotFoundError):
            pass  # not a run with a wait for "go"

    @rule()
    def clock(self) -> None:
        """Two hours pass: backoffs, timers, signal timeouts and deadlines fall due."""
        self.client.execute(
            "UPDATE cyclone_steps SET scheduled_at = scheduled_at - interval '2 hours'"
        )
        self.client.execute(
            "UPDATE cyclone_runs SET deadline_at = deadline_at - interval '2 hours'"
            " WHERE deadline_at IS NOT NULL"
        )

    @rule()
    def scan(self) -> None:
        """A pass of the wait scanner, the one the engine runs."""
        self.env.scan()

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def the_graph_holds(self) -> None:
        steps = [Row(*row) for row in self.client.execute(_STEPS).fetchall()]
        runs = dict(self.client.execute("SELECT id, state FROM cyclone_runs").fetchall())
        by_node = {(s.run_id, s.node): s for s in steps}
        for step in steps:
            met = all(by_node[step.run_id, dep].state == "completed" for dep in step.deps)
            if step.state in WORKING or (step.state == "completed" and step.item_of is None):
                assert met, f"step {step.node} of run {step.run_id} is {step.state} too early"
            run_state = runs[step.run_id]
            unfinished = run_state in ("running", "paused")
            graph_node = step.item_of is None and step.fan_out_parallel is None
            if unfinished and step.state == "pending" and graph_node:
                assert not met, f"{step.node} of run {step.run_id} is stranded in pending"
            if run_state == "paused":
                assert step.state != "available", f"{step.node}: available in a paused run"
            if step.fan_out_parallel:
                busy = sum(
                    1
                    for s in steps
                    if s.run_id == step.run_id
                    and s.item_of == step.node
                    and s.state in ("available", "running")
                )
                assert busy <= step.fan_out_parallel, f"{busy} items of {step.node} at work"
        for run_id, state in runs.items():
            active = any(s.state in ACTIVE for s in steps if s.run_id == run_id)
            finished = state in ("completed", "failed", "cancelled")
            assert active != finished, f"run {run_id} is {state} with active steps: {active}"


@dataclass
class Env:
    """The machine's connections, and the wait scanner on an event loop of its own."""

    conns: dict[str, psycopg.Connection[Any]]
    runner: asyncio.Runner
    scanner: WaitScanner

    def scan(self) -> None:
        self.runner.run(self.scanner.scan_once())


@pytest.fixture
def env(dsn: str) -> Iterator[Env]:
    conns = {name: psycopg.connect(dsn, autocommit=True) for name in (*OWNERS, "client")}
    with asyncio.Runner() as runner:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False
        )
        runner.run(pool.open())
        scanner = WaitScanner(
            pool, Announcer(_Quiet()), interval=3600, definitions=CONFIG.definitions
        )
        try:
            yield Env(conns, runner, scanner)
        finally:
            runner.run(pool.close())
            for conn in conns.values():
                conn.close()


@pytest.mark.parametrize(
    "examples",
    [pytest.param(15, id="quick"), pytest.param(40, id="full", marks=pytest.mark.slow)],
)
def test_workflow_state_machine(env: Env, examples: int) -> None:
    """No interleaving of the run graph's moves breaks the table or the graph (a quick
    search in the fast tier, the full one in the full suite)."""

    class BoundMachine(WorkflowMachine):
        def __init__(self) -> None:
            super().__init__(env)

    run_state_machine_as_test(BoundMachine, settings=settings(SETTINGS, max_examples=examples))
