"""Pause and resume send the same wakeups from both clients: a pause sends none (the
run is not finished, and nothing became claimable); a resume wakes the queues whose
steps became claimable again, and sends no run-done wakeup either."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import apoll_until, scalar

MARK = "test-mark"


@pytest.fixture
def heard(dsn: str) -> Iterator[Callable[[], list[tuple[str, str]]]]:
    """A listener on both wakeup channels; calling it returns what it heard so far
    (read up to a marker notification sent after the call: everything committed before
    the call has been delivered by then)."""
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as marker,
    ):
        listener.execute("LISTEN cyclone_run_done")
        listener.execute("LISTEN cyclone_available")

        def read() -> list[tuple[str, str]]:
            marker.execute("SELECT pg_notify('cyclone_run_done', %s)", [MARK])
            got: list[tuple[str, str]] = []
            for note in listener.notifies(timeout=30):
                if note.payload == MARK:
                    return got
                got.append((note.channel, note.payload))
            raise AssertionError(f"the marker did not arrive; heard {got}")

        yield read


def _queues(notes: list[tuple[str, str]]) -> set[str]:
    return {json.loads(p)["queue"] for c, p in notes if c == "cyclone_available"}


def test_sync_pause_sends_nothing_and_resume_wakes_the_queue(
    dsn: str, heard: Callable[[], list[tuple[str, str]]]
) -> None:
    with cyclone.SyncClient(dsn) as client:
        run = client.enqueue("control_job", {}, queue="ctl")
        heard()
        client.pause(run)
        assert heard() == []
        client.resume(run)
        notes = heard()
    assert [c for c, _ in notes] == ["cyclone_available"]
    assert _queues(notes) == {"ctl"}


async def test_async_pause_sends_nothing_and_resume_wakes_the_queue(
    dsn: str, heard: Callable[[], list[tuple[str, str]]]
) -> None:
    async with cyclone.Client(dsn) as client:
        run = await client.enqueue("control_job", {}, queue="ctl")
        await client.stop()  # flushes the enqueue's wakeup
        heard()
        await client.pause(run)
        await client.stop()
        assert heard() == []
        await client.resume(run)
        await client.stop()
        notes = heard()
    assert [c for c, _ in notes] == ["cyclone_available"]
    assert _queues(notes) == {"ctl"}


# -- resume wakes the wait scanner for what it reached ---------------------------------

_gates: dict[str, asyncio.Event] = {}


@cyclone.step("ctl_gated")
async def gated(ctx: cyclone.Context, inp: Any) -> Any:
    """Returns its input once the test opens its gate (named by the run's input)."""
    gate = _gates.get(str(inp.get("gate"))) if isinstance(inp, dict) else None
    if gate is not None:
        await gate.wait()
    return inp.get("out", inp) if isinstance(inp, dict) else inp


def _child_flow() -> cyclone.Workflow:
    wf = cyclone.Workflow("ctl_child")
    wf.result(wf.node("only", gated))
    return wf


async def _pause_while_running(
    client: cyclone.Client, run_id: int, node: str, gate: asyncio.Event
) -> None:
    """Pause the run while ``node`` is in its handler, then let the handler return; the
    advance parks what it reaches (the run is paused)."""
    await apoll_until(lambda: _is(client, run_id, node, "running"), what=f"{node} to start")
    await client.pause(run_id)
    gate.set()
    await apoll_until(lambda: _is(client, run_id, node, "completed"), what=f"{node} to end")


async def _state(client: cyclone.Client, run_id: int, node: str) -> str | None:
    steps = {s.node: s.state.value for s in await client.list_steps(run_id)}
    return steps.get(node)


async def _is(client: cyclone.Client, run_id: int, node: str, state: str) -> bool:
    return await _state(client, run_id, node) == state


async def test_resume_that_reaches_a_child_node_starts_the_child_run_at_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A child node reached by a resume is started by a wait scanner pass the resume
    asks for, not at the scanner's next poll (an hour away here)."""
    gate = _gates["child"] = asyncio.Event()
    wf = cyclone.Workflow("ctl_parent")
    first = wf.node("first", gated)
    wf.result(wf.child("sub", _child_flow(), input_from=first))
    async with cyclone.Client(dsn, workflows=[wf], handlers=[gated], poll_interval=3600) as client:
        run = await client.submit(wf, {"gate": "child", "out": {"out": 7}})
        await _pause_while_running(client, run.run_id, "first", gate)
        assert await _state(client, run.run_id, "sub") == "paused"
        await client.resume(run)

        async def child_started() -> bool:
            query = "SELECT count(*) FROM cyclone_runs WHERE parent_run_id = %s"
            return bool(scalar(db, query, (run.run_id,)))

        await apoll_until(child_started, what="the child run to start")


async def test_resume_that_restores_fan_out_items_releases_them_at_once(dsn: str) -> None:
    """Items of a fan-out restored by a resume are released by a fan-out pass the resume
    asks for, not at the scanner's next poll."""
    gate = _gates["fan"] = asyncio.Event()
    wf = cyclone.Workflow("ctl_fan")
    source = wf.node("source", gated)
    wf.result(wf.fan_out("each", gated, over=source, max_parallel=1))
    async with cyclone.Client(dsn, workflows=[wf], handlers=[gated], poll_interval=3600) as client:
        items = [{"gate": "fan", "out": 1}, {"out": 2}]
        run = await client.submit(wf, {"out": items})
        await _pause_while_running(client, run.run_id, "each[0]", gate)
        await client.resume(run)
        done = await client.wait(run, timeout=30)
    assert done.state == cyclone.RunState.COMPLETED and done.result == [1, 2]
