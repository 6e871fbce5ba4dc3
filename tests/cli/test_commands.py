"""The operator's commands: runs, run, steps, queues, kinds, signal, cancel, pause,
resume, retry, on real runs made by an in-process worker; each command runs as a
subprocess, as an operator would run it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import ROOT, apoll_until, scalar

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process


@cyclone.step("cli_tag")
async def tag(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    return {"node": ctx.node, "in": inp}


@cyclone.step("cli_echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("cli_square")
async def square(ctx: cyclone.Context, inp: int) -> int:
    return inp * inp


@cyclone.action("cli_charge", max_attempts=1)
async def charge(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard("card declined")


def diamond() -> cyclone.Workflow:
    wf = cyclone.Workflow("cli_diamond")
    a = wf.node("a", tag)
    b = wf.node("b", tag, input_from=a)
    c = wf.node("c", tag, input_from=a)
    wf.result(wf.node("d", tag, inputs=[b, c]))
    return wf


def squares() -> cyclone.Workflow:
    wf = cyclone.Workflow("cli_squares")
    source = wf.node("source", echo)
    items = wf.fan_out("sq", square, over=source)
    wf.result(wf.node("total", tag, input_from=items))
    return wf


def gate() -> cyclone.Workflow:
    wf = cyclone.Workflow("cli_gate")
    start = wf.node("start", tag)
    approve = wf.wait_signal("approve", after=[start])
    wf.result(wf.node("finish", tag, input_from=approve))
    return wf


def client(dsn: str, *workflows: cyclone.Workflow) -> cyclone.Client:
    return cyclone.Client(
        dsn, workflows=workflows, handlers=[charge], poll_interval=0.05, lease_ttl=5
    )


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``cyclone ARGS`` with ``CYCLONE_DSN`` set, its output piped (no terminal)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "cyclone", *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT), "CYCLONE_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(dsn: str, *args: str) -> str:
    """The output of a command that must succeed."""
    result = cli(dsn, *args)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout


def as_json(dsn: str, *args: str) -> Any:
    """The parsed output of a command run with ``--json``."""
    return json.loads(ok(dsn, *args, "--json"))


def fails(dsn: str, *args: str) -> str:
    """The one line of a command that must fail cleanly."""
    result = cli(dsn, *args)
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def row_of(table: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in\n{table}")


async def test_listings_and_the_tree_of_completed_and_failed_runs(dsn: str) -> None:
    """A diamond, a fan-out and a discarded job: runs, run (tree and JSON), steps,
    kinds; then retry reopens the failed job and cancel ends it."""
    dag, fan = diamond(), squares()
    async with client(dsn, dag, fan) as c:
        done = await c.submit(dag, {"x": 1})
        spread = await c.submit(fan, list(range(12)))
        job = await c.enqueue("cli_charge", {"order": 7})
        for run in (done, spread, job):
            await c.wait(run, timeout=30)

    table = ok(dsn, "runs")
    assert row_of(table, str(done.run_id))[1:3] == ["cli_diamond", "completed"]
    assert row_of(table, str(spread.run_id))[1:3] == ["cli_squares", "completed"]
    failed = row_of(table, str(job.run_id))
    assert failed[1:3] == ["cli_charge", "failed"]
    assert "card declined" in failed[-1]
    listed = as_json(dsn, "runs", "--limit", "2")
    assert [r["id"] for r in listed] == [job.run_id, spread.run_id]  # newest first
    assert as_json(dsn, "runs", "--state", "failed")[0]["error"] == "Discard: card declined"
    assert [r["id"] for r in as_json(dsn, "runs", "--workflow", "cli_diamond")] == [done.run_id]

    tree = ok(dsn, "run", str(done.run_id))
    assert "cli_diamond" in tree and "completed" in tree
    lines = {line.split("(")[0].strip(" │├└─"): line for line in tree.splitlines()}
    assert set("abcd") <= set(lines)
    assert "also after: c" in lines["d"]  # drawn under b, its first parent
    assert lines["d"].index("d (") > lines["b"].index("b (")  # one level below b
    assert "took" in lines["a"]
    shown = as_json(dsn, "run", str(done.run_id))
    assert shown["run"]["state"] == "completed"
    assert shown["run"]["result"]["node"] == "d"
    deps = {s["node"]: s["deps"] for s in shown["steps"]}
    assert deps == {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}

    fanned = ok(dsn, "run", str(spread.run_id))
    assert "12 items: 12 completed" in fanned
    assert "sq[0]" in fanned and "sq[11]" not in fanned
    assert "9 more items" in fanned

    steps = ok(dsn, "steps", "--run", str(job.run_id))
    cells = row_of(steps, str(job.step_id))
    assert cells[1:5] == [str(job.run_id), "cli_charge", "cli_charge", "discarded"]
    assert "card declined" in cells[-1]
    discarded = as_json(dsn, "steps", "--state", "discarded", "--kind", "cli_charge")
    assert [(s["id"], s["error_kind"]) for s in discarded] == [(job.step_id, "discard")]
    kinds = {(k["kind"], k["state"]): k["count"] for k in as_json(dsn, "kinds")}
    assert kinds[("cli_square", "completed")] == 13  # the fan-out node and its 12 items
    assert kinds[("cli_charge", "discarded")] == 1
    assert "cli_square" in ok(dsn, "kinds")

    # operator retry reopens the failed job (no worker runs now); cancel ends it
    assert ok(dsn, "retry", str(job.run_id)) == f"run {job.run_id} reopened: 1 step(s) reset\n"
    queues = as_json(dsn, "queues")
    assert [(q["queue"], q["available"], q["running"]) for q in queues] == [("default", 1, 0)]
    assert isinstance(queues[0]["oldest_available_age"], float)
    assert row_of(ok(dsn, "queues"), "default")[1] == "1"
    assert ok(dsn, "cancel", str(job.run_id)) == f"run {job.run_id} cancelled\n"
    assert [r["id"] for r in as_json(dsn, "runs", "--state", "cancelled")] == [job.run_id]
    assert as_json(dsn, "queues") == []


async def test_pause_resume_and_a_signal_complete_a_waiting_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = gate()
    async with client(dsn, wf) as c:
        sub = await c.submit(wf, "in")
        run_id = str(sub.run_id)
        await apoll_until(
            lambda: asyncio.to_thread(
                scalar,
                db,
                "SELECT state = 'waiting_signal' FROM cyclone_steps"
                " WHERE run_id = %s AND node = 'approve'",
                (sub.run_id,),
            ),
            what="the signal wait",
        )
        tree = await asyncio.to_thread(ok, dsn, "run", run_id)
        assert "waiting_signal" in tree and "signal 'approve'" in tree
        waiting = await asyncio.to_thread(as_json, dsn, "queues")
        assert [(q["queue"], q["waiting"]) for q in waiting] == [("default", 1)]

        assert await asyncio.to_thread(ok, dsn, "pause", run_id) == f"run {run_id} paused\n"
        paused = await asyncio.to_thread(as_json, dsn, "runs", "--state", "paused")
        assert [r["id"] for r in paused] == [sub.run_id]
        assert await asyncio.to_thread(ok, dsn, "resume", run_id) == f"run {run_id} resumed\n"

        said = await asyncio.to_thread(ok, dsn, "signal", run_id, "approve", '{"by": "ann"}')
        assert said == f"signal 'approve' stored in the mailbox of run {run_id}\n"
        run = await c.wait(sub, timeout=30)
    assert run.state == cyclone.RunState.COMPLETED
    assert run.result == {"node": "finish", "in": {"by": "ann"}}
    assert "not stored" in ok(dsn, "signal", run_id, "approve")
    assert "already completed" in fails(dsn, "cancel", run_id)
    assert "not paused" in fails(dsn, "resume", run_id)


def test_errors_are_one_line_without_a_traceback(dsn: str, empty_dsn: str) -> None:
    with cyclone.SyncClient(dsn) as producer:
        run_id = str(producer.submit(gate(), None).run_id)
    for args in (["run", "999"], ["steps", "--run", "999"], ["signal", "999", "approve"]):
        assert fails(dsn, *args) == "Error: run 999 does not exist", args
    assert "state must be one of" in fails(dsn, "runs", "--state", "bogus")
    assert "'bogus'" in fails(dsn, "steps", "--state", "bogus")
    bad = fails(dsn, "signal", run_id, "approve", "{bad")
    assert "PAYLOAD" in bad and "not JSON" in bad and "{bad" in bad
    assert "no wait for signal 'nope'" in fails(dsn, "signal", run_id, "nope", "1")
    assert "not a valid integer" in fails(dsn, "run", "abc")
    assert "limit must be between" in fails(dsn, "steps", "--limit", "0")
    assert "run `cyclone migrate" in fails(empty_dsn, "runs")
    assert ok(dsn, "runs", "--state", "failed") == "no runs\n"


def test_schedules_and_purge(dsn: str, db: psycopg.Connection[Any]) -> None:
    """``schedules`` lists next fire times in each schedule's own zone; ``purge`` deletes
    the expired runs and reports how many."""
    with cyclone.SyncClient(dsn) as c:
        c.create_schedule("nightly", "cli_charge", {"n": 1}, "30 2 * * *", location="Asia/Tokyo")
        c.create_schedule("hourly", "cli_charge", None, "@hourly", location="UTC")
        c.disable_schedule("hourly")
        job = c.enqueue("cli_charge", {"n": 2}, retention=0)

    async def finish() -> None:  # a real worker runs it (the handler discards it)
        async with client(dsn) as worker:
            await worker.wait(job, timeout=30)

    asyncio.run(finish())
    listing = cli(dsn, "schedules")
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines()[2:]}
    assert set(lines) == {"hourly", "nightly"}
    assert "02:30:00 JST" in lines["nightly"] and "Asia/Tokyo" in lines["nightly"]
    assert "30 2 * * *" in lines["nightly"] and " yes " in lines["nightly"]
    assert "0 * * * *" in lines["hourly"] and " no " in lines["hourly"]
    rows = json.loads(cli(dsn, "schedules", "--json").stdout)
    assert [(r["id"], r["location"], r["enabled"]) for r in rows] == [
        ("hourly", "UTC", False),
        ("nightly", "Asia/Tokyo", True),
    ]
    result = cli(dsn, "purge")
    assert (result.returncode, result.stdout.strip()) == (0, "purged 1 run(s)")
    assert json.loads(cli(dsn, "purge", "--json").stdout) == {"deleted": 0}
    bad = cli(dsn, "purge", "--older-than", "-5")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
