"""OpenTelemetry traces: producer spans, one span per step attempt, propagation through
the database to other processes, child runs and schedule fires, and nothing at all
when tracing is off."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from cyclone.observability import Observer, Outcome
from tests.apps.traced import add, chain, flaky
from tests.helpers import ROOT, apoll_until, kill, poll_until, scalar, start_worker
from tests.observability.spans import SpanRecord, capture, read_spans, tracer


def _traceparent(db: psycopg.Connection[Any], run_id: int) -> str | None:
    """The ``trace id-span id`` of the traceparent stored with run ``run_id``."""
    value = scalar(db, "SELECT traceparent FROM cyclone_runs WHERE id = %s", (run_id,))
    if value is None:
        return None
    version, trace_id, span_id, _flags = str(value).split("-")
    assert version == "00"
    return f"{trace_id}-{span_id}"


def _step_spans(path: Path) -> list[SpanRecord]:
    return [span for span in read_spans(path) if span.name == "cyclone.step tr_add"]


def _one(spans: list[SpanRecord], name: str) -> SpanRecord:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, (name, [span.name for span in spans])
    return found[0]


@pytest.mark.slow
async def test_a_workflow_run_by_a_worker_process_is_one_trace(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The producer span of a submit (inside the caller's own span) and the step spans
    of its three nodes, run by a worker process, share one trace id: each step span is
    a child of the producer span, whose traceparent is the one stored with the run."""
    files = tmp_path / "worker-spans.jsonl"
    with capture() as captured:
        with tracer().start_as_current_span("POST /orders") as request:
            async with cyclone.Client(dsn) as producer:
                submitted = await producer.submit(chain(), 1)
        request_id = f"{request.get_span_context().trace_id:032x}"
        submit = _one(captured.all(), "cyclone.submit traced_chain")
    assert submit.kind == "PRODUCER" and submit.trace_id == request_id
    assert submit.attributes["cyclone.workflow"] == "traced_chain"
    assert submit.attributes["cyclone.run_id"] == submitted.run_id
    assert _traceparent(db, submitted.run_id) == submit.ids

    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_SPANS": str(files)}
    worker = start_worker("tests.apps.traced:client", env)
    try:
        poll_until(
            lambda: (
                scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (submitted.run_id,))
                == "completed"
            ),
            what="the workflow run completed",
        )
        poll_until(lambda: len(_step_spans(files)) == 3, what="three step spans exported")
    finally:
        kill(worker, signal.SIGTERM)
        worker.wait(timeout=60)
    spans = _step_spans(files)
    rows = db.execute(
        "SELECT node, id, attempt FROM cyclone_steps WHERE run_id = %s", (submitted.run_id,)
    ).fetchall()
    assert sorted(span.attributes["cyclone.node"] for span in spans) == ["a", "b", "c"]
    by_node = {node: step_id for node, step_id, _ in rows}
    for span in spans:
        assert span.kind == "CONSUMER"
        assert span.trace_id == submit.trace_id  # one trace, days later or not
        assert span.parent_id == submit.span_id
        attrs = span.attributes
        assert attrs["cyclone.run_id"] == submitted.run_id
        assert attrs["cyclone.step_id"] == by_node[attrs["cyclone.node"]]
        assert attrs["cyclone.kind"] == "tr_add" and attrs["cyclone.queue"] == "default"
        assert attrs["cyclone.workflow"] == "traced_chain"
        assert attrs["cyclone.attempt"] == 1 and attrs["cyclone.reclaims"] == 0
        assert attrs["cyclone.outcome"] == "completed"
        assert attrs["cyclone.queue_latency_ms"] >= 0
    engine = {span.name for span in read_spans(files)}
    assert "cyclone.claim default" in engine  # a claim batch that took steps


async def test_each_attempt_is_a_span_with_its_outcome_and_exception(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A step that fails once then succeeds gives two spans of one trace: the first
    ``failed`` with the exception recorded and status ERROR, the second ``completed``;
    a step that discards gives ``discarded``."""

    @cyclone.step("tr_gives_up")
    async def gives_up(ctx: cyclone.Context, value: Any) -> None:
        raise cyclone.Discard("not today")

    with capture() as captured:
        async with cyclone.Client(
            dsn, handlers=[flaky, gives_up], poll_interval=0.05, purge_interval=None
        ) as client:
            retried = await client.enqueue(flaky, 5)
            given_up = await client.enqueue(gives_up, None)
            await client.wait(retried, timeout=60)
            await client.wait(given_up, timeout=60)
        enqueue = captured.named("cyclone.enqueue tr_flaky")
        attempts = captured.named("cyclone.step tr_flaky")
        discarded = _one(captured.all(), "cyclone.step tr_gives_up")
    assert len(enqueue) == 1 and enqueue[0].attributes["cyclone.kind"] == "tr_flaky"
    assert [s.attributes["cyclone.attempt"] for s in attempts] == [1, 2]
    first, second = attempts
    assert first.attributes["cyclone.outcome"] == "failed" and first.status == "ERROR"
    assert "exception" in first.events
    assert second.attributes["cyclone.outcome"] == "completed" and second.status != "ERROR"
    assert {s.trace_id for s in attempts} == {enqueue[0].trace_id}
    assert {s.parent_id for s in attempts} == {enqueue[0].span_id}
    assert discarded.attributes["cyclone.outcome"] == "discarded"
    assert discarded.status == "ERROR" and "exception" in discarded.events


async def test_handler_sees_the_trace_context_and_its_own_enqueues_join_the_trace(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """``ctx.trace_context`` is the run's stored traceparent; the step span is current
    in the handler, so a run the handler enqueues in its completion transaction is
    traced under it (its stored traceparent is a span of the same trace)."""
    seen: dict[str, Any] = {}

    @cyclone.step("tr_parent")
    async def parent(ctx: cyclone.Context, value: Any) -> int:
        seen["trace_context"] = ctx.trace_context
        child = await ctx.enqueue_completion(add, 1)
        return int(child.run_id)

    with capture() as captured:
        async with cyclone.Client(
            dsn, handlers=[parent, add], poll_interval=0.05, purge_interval=None
        ) as client:
            run = await client.wait(await client.enqueue(parent, None), timeout=60)
            child_id = run.result
            await client.wait(child_id, timeout=60)
        step = _one(captured.all(), "cyclone.step tr_parent")
        inner = _one(captured.all(), "cyclone.enqueue tr_add")
        child_step = _one(captured.all(), "cyclone.step tr_add")
    assert run.state == RunState.COMPLETED
    assert seen["trace_context"].split("-")[1:3] == str(_traceparent(db, run.id)).split("-")
    assert inner.parent_id == step.span_id and inner.trace_id == step.trace_id
    assert _traceparent(db, child_id) == inner.ids
    assert child_step.parent_id == inner.span_id


async def test_a_child_run_carries_its_parent_runs_trace_context(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A child run is stored with its parent run's traceparent: the child's step spans
    are in the parent's trace."""
    parent_wf = cyclone.Workflow("traced_parent")
    first = parent_wf.node("first", add)
    parent_wf.result(parent_wf.child("inner", chain(), input_from=first))
    with capture() as captured:
        async with cyclone.Client(
            dsn, workflows=[parent_wf, chain()], poll_interval=0.05, purge_interval=None
        ) as client:
            submitted = await client.submit(parent_wf, 1)
            run = await client.wait(submitted, timeout=60)
        submit = _one(captured.all(), "cyclone.submit traced_parent")
        steps = captured.named("cyclone.step tr_add")
    assert run.state == RunState.COMPLETED and run.result == 5
    child_id = scalar(db, "SELECT id FROM cyclone_runs WHERE parent_run_id = %s", (run.id,))
    assert _traceparent(db, child_id) == _traceparent(db, run.id) == submit.ids
    assert len(steps) == 4  # first, then a, b, c of the child run
    assert {s.trace_id for s in steps} == {submit.trace_id}


async def test_a_schedule_fire_is_a_span_and_its_run_a_child_of_it(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A schedule's fire is traced as ``cyclone.fire <id>``, and the run it fired
    carries that span's context: its step span is a child of the fire span."""
    with capture() as captured:
        async with cyclone.Client(
            dsn, handlers=[add], poll_interval=3600, purge_interval=None
        ) as client:
            await client.create_schedule("tr-every-minute", add, 1, "* * * * *")
            db.execute(
                "UPDATE cyclone_schedules SET next_run_at = date_trunc('second', now()) "
                "- interval '1 second'"
            )
            scanner = client.schedule_scanner
            assert scanner is not None

            async def fired() -> Any:
                await scanner.scan_once()  # a pass of its own may hold the lease now
                return scalar(db, "SELECT last_run_id FROM cyclone_schedules")

            run_id = await apoll_until(fired, what="the schedule fired")
            assert client.engine is not None
            client.engine.wake("default")  # the worker polls once an hour here
            await client.wait(run_id, timeout=60)
        fire = _one(captured.all(), "cyclone.fire tr-every-minute")
        step = _one(captured.all(), "cyclone.step tr_add")
    assert fire.parent_id is None and fire.attributes["cyclone.run_id"] == run_id
    assert _traceparent(db, run_id) == fire.ids
    assert step.trace_id == fire.trace_id and step.parent_id == fire.span_id


_WITHOUT_TRACING = """
import asyncio, sys
{block}
import cyclone

@cyclone.step("plain_add")
async def plain_add(ctx, value):
    assert ctx.trace_context is None
    return value + 1

async def main():
    async with cyclone.Client({dsn!r}, handlers=[plain_add], poll_interval=0.05) as c:
        run = await c.wait(await c.enqueue(plain_add, 1), timeout=60)
    print(json.dumps({{"result": run.result, "modules": sorted(
        m for m, mod in sys.modules.items() if m.startswith("opentelemetry") and mod)}}))

import asyncio
import json
import logging
asyncio.run(main())
"""


@pytest.mark.slow
@pytest.mark.parametrize("installed", [False, True], ids=["api-absent", "no-provider"])
def test_without_tracing_nothing_is_imported_or_stored(
    dsn: str, db: psycopg.Connection[Any], installed: bool
) -> None:
    """Without ``opentelemetry-api`` (its import made to fail) a worker runs jobs and
    imports nothing of it; with the API but no provider set, the SDK is never imported
    and no trace context is stored."""
    block = "" if installed else "sys.modules['opentelemetry'] = None"
    script = textwrap.dedent(_WITHOUT_TRACING).format(block=block, dsn=dsn)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == 2
    if installed:
        assert not [m for m in report["modules"] if m.startswith("opentelemetry.sdk")]
    else:
        assert report["modules"] == []
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE traceparent IS NOT NULL") == 0


async def test_a_step_given_back_at_shutdown_ends_its_span_as_released(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A handler still running when the client stops past its grace period: the step
    goes back to available and its span ends with outcome ``released``."""
    started = asyncio.Event()

    @cyclone.step("tr_forever")
    async def forever(ctx: cyclone.Context, value: Any) -> None:
        started.set()
        await asyncio.Event().wait()

    with capture() as captured:
        client = cyclone.Client(
            dsn, handlers=[forever], poll_interval=0.05, shutdown_grace=0.1, purge_interval=None
        )
        async with client:
            run = await client.enqueue(forever, None)
            await asyncio.wait_for(started.wait(), timeout=30)
        span = _one(captured.all(), "cyclone.step tr_forever")
    assert span.attributes["cyclone.outcome"] == "released"
    assert span.attributes["cyclone.run_id"] == run.run_id
    assert scalar(db, "SELECT state FROM cyclone_steps WHERE run_id = %s", (run.run_id,)) == (
        "available"
    )


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_producer_call_that_fails_records_it_on_its_span(
    dsn: str, flavour: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A signal to a run that does not exist raises NotFoundError from inside the call:
    its producer span ends then, with the exception recorded and status ERROR, and the
    span's context is left cleanly (nothing logged about a context not detached)."""
    caplog.set_level(logging.WARNING)
    with capture() as captured:
        if flavour == "async":
            async with cyclone.Client(dsn) as client:
                with pytest.raises(cyclone.NotFoundError):
                    await client.signal(987654, "approve")
        else:
            with cyclone.SyncClient(dsn) as sync_client, pytest.raises(cyclone.NotFoundError):
                sync_client.signal(987654, "approve")
        span = _one(captured.all(), "cyclone.signal approve")
    assert span.kind == "PRODUCER" and span.status == "ERROR" and "exception" in span.events
    assert span.attributes["cyclone.run_id"] == 987654
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


async def test_queue_latency_counts_from_when_a_step_was_ready(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """``cyclone.queue_latency_ms`` of a root node is from its due time to its start,
    and of a downstream node from its upstream's completion (not from the submit):
    exactly what the database recorded, both read on the claim's clock."""
    with capture() as captured:
        async with cyclone.Client(
            dsn, workflows=[chain()], poll_interval=0.05, purge_interval=None
        ) as client:
            run = await client.wait(await client.submit(chain(), 1), timeout=60)
        spans = {s.attributes["cyclone.node"]: s for s in captured.named("cyclone.step tr_add")}
    rows = db.execute(
        "SELECT node, scheduled_at, started_at, completed_at FROM cyclone_steps WHERE run_id = %s",
        (run.id,),
    ).fetchall()
    steps = {node: (scheduled, started, completed) for node, scheduled, started, completed in rows}
    expected = {
        "a": steps["a"][1] - steps["a"][0],
        "b": steps["b"][1] - max(steps["b"][0], steps["a"][2]),
        "c": steps["c"][1] - max(steps["c"][0], steps["b"][2]),
    }
    for node, waited in expected.items():
        shown = spans[node].attributes["cyclone.queue_latency_ms"]
        assert shown == pytest.approx(waited.total_seconds() * 1000, abs=0.002), node
    assert steps["c"][0] < steps["b"][2]  # c was scheduled at the submit, long before


async def test_a_plain_def_handler_runs_inside_its_step_span(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """In a plain ``def`` handler (its own thread) the step span is current: a run it
    enqueues in its completion transaction is traced under it, and the commit of that
    transaction is a span of its own, a child of the step span."""

    @cyclone.step("tr_sync_parent")
    def sync_parent(ctx: cyclone.Context, value: Any) -> int:
        return int(ctx.enqueue_completion(add, 1).run_id)

    with capture() as captured:
        async with cyclone.Client(
            dsn, handlers=[sync_parent, add], poll_interval=0.05, purge_interval=None
        ) as client:
            run = await client.wait(await client.enqueue(sync_parent, None), timeout=60)
            await client.wait(run.result, timeout=60)
        step = _one(captured.all(), "cyclone.step tr_sync_parent")
        inner = _one(captured.all(), "cyclone.enqueue tr_add")
        commit = _one(captured.all(), "cyclone.completion_tx.commit")
    assert inner.parent_id == step.span_id and inner.trace_id == step.trace_id
    assert commit.parent_id == step.span_id and commit.trace_id == step.trace_id
    assert _traceparent(db, run.result) == inner.ids


class _Outcomes(Observer):
    """Records each attempt's outcome."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, str]] = []
        self.reclaimed: list[tuple[str, str]] = []

    def step_ended(self, step: Any, outcome: Outcome, duration: float | None) -> None:
        self.ended.append((step.id, outcome))

    def step_reclaimed(self, kind: str, queue: str) -> None:
        self.reclaimed.append((kind, queue))


async def test_an_attempt_whose_lease_is_lost_ends_as_lost(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A running step whose lease expires is reclaimed by the sweep; the heartbeat then
    finds the lease gone and cancels the handler: its span and the observers say
    ``lost``, and the sweep's reclaim is reported too."""
    started = asyncio.Event()

    @cyclone.step("tr_stuck", max_attempts=3)
    async def stuck(ctx: cyclone.Context, value: Any) -> None:
        if (
            ctx.attempt == 0
            and scalar(db, "SELECT reclaims FROM cyclone_steps WHERE id = %s", (ctx.step_id,)) == 0
        ):
            started.set()
            await asyncio.Event().wait()

    outcomes = _Outcomes()
    with capture() as captured:
        client = cyclone.Client(
            dsn,
            handlers=[stuck],
            poll_interval=0.05,
            lease_ttl=1,
            sweep_interval=3600,  # only the test's own sweep reclaims
            purge_interval=None,
        )
        client.observers.add(outcomes)
        async with client:
            run = await client.enqueue(stuck, None)
            await asyncio.wait_for(started.wait(), timeout=30)
            sweeper = client.sweeper
            assert sweeper is not None

            async def expire_and_sweep() -> int:
                # a heartbeat landing between the two renews the lease: then expire again
                db.execute("UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second'")
                return (await sweeper.sweep_once()).reclaimed

            assert await apoll_until(expire_and_sweep, what="the sweep's reclaim") == 1
            await client.wait(run, timeout=60)
        spans = captured.named("cyclone.step tr_stuck")
    # the second attempt may end before the heartbeat finds the first one's lease gone
    by_reclaims = {s.attributes["cyclone.reclaims"]: s.attributes["cyclone.outcome"] for s in spans}
    assert by_reclaims == {0: "lost", 1: "completed"}
    assert sorted(outcome for _, outcome in outcomes.ended) == ["completed", "lost"]
    assert outcomes.reclaimed == [("tr_stuck", "default")]
