"""``cyclone steps`` says "attempt N of M" with N the executions so far, in every step
state; ``cyclone run`` nests a fan-out's items under their node, apart from the nodes
downstream of it. On steps a real in-process worker ran; the command runs in this
process (click's CliRunner)."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from rich.console import Console

import cyclone
from cyclone.cli import main
from cyclone.records import StepInfo
from cyclone.render import executions, steps_table
from cyclone.states import StepState
from tests.helpers import apoll_until, scalar

RELEASE: dict[str, asyncio.Event] = {}
"""The event the ``polish_block`` handler waits for (made in the test's loop)."""


@cyclone.step("polish_block")
async def block(ctx: cyclone.Context, inp: Any) -> Any:
    await RELEASE["block"].wait()
    return inp


@cyclone.step("polish_flaky", max_attempts=3, retry=cyclone.RetryPolicy(base=0.05, jitter=0))
async def flaky(ctx: cyclone.Context, inp: Any) -> Any:
    if ctx.attempt == 0:
        raise RuntimeError("first try fails")
    return inp


@cyclone.step(
    "polish_later", max_attempts=4, retry=cyclone.RetryPolicy(base=3600, cap=3600, jitter=0)
)
async def later(ctx: cyclone.Context, inp: Any) -> Any:
    raise RuntimeError("fails, retried in an hour")


@cyclone.step("polish_doomed", max_attempts=2, retry=cyclone.RetryPolicy(base=0.05, jitter=0))
async def doomed(ctx: cyclone.Context, inp: Any) -> Any:
    raise RuntimeError("always fails")


@cyclone.step("polish_square")
async def square(ctx: cyclone.Context, inp: int) -> int:
    return inp * inp


@cyclone.step("polish_echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def fanned() -> cyclone.Workflow:
    """source -> fan-out sq (one item per element) -> total, downstream of the fan-out."""
    wf = cyclone.Workflow("polish_fanned")
    source = wf.node("source", echo)
    items = wf.fan_out("sq", square, over=source)
    wf.result(wf.node("total", echo, input_from=items))
    return wf


def cyclone_cli(dsn: str, *args: str) -> str:
    """``cyclone ARGS --dsn DSN`` run in this process; its output (it must succeed)."""
    result = CliRunner().invoke(main, [*args, "--dsn", dsn], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    return result.output


def attempt_cells(table: str) -> dict[str, str]:
    """Node -> the attempt cell of each row of ``cyclone steps``."""
    lines = table.splitlines()
    header = [c.strip() for c in re.split("[│┃]", lines[0])]
    column = header.index("attempt")
    rows = [[c.strip() for c in line.split("│")] for line in lines[2:]]
    return {row[2]: row[column] for row in rows if len(row) == len(header)}


async def test_steps_count_the_executions_so_far(dsn: str, db: psycopg.Connection[Any]) -> None:
    RELEASE["block"] = asyncio.Event()
    handlers = [block, flaky, later, doomed]
    async with cyclone.Client(dsn, handlers=handlers, poll_interval=0.05, lease_ttl=10) as c:
        done = await c.enqueue("polish_flaky", 1)  # failed once, then completed
        dead = await c.enqueue("polish_doomed", 1)  # failed twice: discarded
        await c.enqueue("polish_later", 1)  # failed once, available in an hour
        running = await c.enqueue("polish_block", 1)  # running its first attempt
        await c.enqueue("polish_unserved", 1)  # no worker runs it
        for job in (done, dead):
            await c.wait(job, timeout=30)

        def settled() -> bool:
            states = dict(db.execute("SELECT kind, state || attempt FROM cyclone_steps"))
            return (states["polish_later"], states["polish_block"]) == ("available1", "running0")

        await apoll_until(lambda: asyncio.to_thread(settled), what="a retry and a running step")
        table = await asyncio.to_thread(cyclone_cli, dsn, "steps")
        listed = json.loads(await asyncio.to_thread(cyclone_cli, dsn, "steps", "--json"))
        RELEASE["block"].set()
        await c.wait(running, timeout=30)
    assert attempt_cells(table) == {
        "polish_flaky": "2 of 3",  # completed: its failure and the one that completed it
        "polish_doomed": "2 of 2",  # discarded: both executions failed
        "polish_later": "1 of 4",  # available after one failure
        "polish_block": "1 of 5",  # running its first execution
        "polish_unserved": "0 of 5",  # available, never run
    }
    by_kind = {s["kind"]: (s["attempt"], s["executions"]) for s in listed}
    assert by_kind == {
        "polish_flaky": (1, 2),
        "polish_doomed": (2, 2),
        "polish_later": (1, 1),
        "polish_block": (0, 1),
        "polish_unserved": (0, 0),
    }
    assert scalar(db, "SELECT count(*) FROM cyclone_steps") == 5


def info(state: StepState, attempt: int, *, started: bool, **fields: Any) -> StepInfo:
    """A step as ``cyclone steps`` reads it, in ``state`` after ``attempt`` failures."""
    now = datetime(2024, 5, 1, tzinfo=UTC)
    values: dict[str, Any] = {
        "id": 1,
        "run_id": 1,
        "node": "n",
        "kind": "k",
        "state": state,
        "queue": "default",
        "priority": 0,
        "attempt": attempt,
        "max_attempts": 5,
        "error": None,
        "error_kind": None,
        "panic_stack": None,
        "reclaims": 0,
        "lease_owner": None,
        "lease_expiry": None,
        "heartbeat_at": None,
        "scheduled_at": now,
        "created_at": now,
        "started_at": now if started else None,
        "completed_at": None,
        "lease_expired": False,
        "signal_name": None,
        "item_of": None,
        "item_index": None,
        "child_run_id": None,
    }
    return StepInfo(**{**values, **fields})


@pytest.mark.parametrize(
    ("state", "attempt", "started", "shown"),
    [
        (StepState.PENDING, 0, False, 0),  # not reached yet
        (StepState.AVAILABLE, 0, False, 0),  # never run
        (StepState.AVAILABLE, 2, True, 2),  # waiting out the backoff of its 2nd failure
        (StepState.AVAILABLE, 0, True, 0),  # given back at a shutdown, or snoozed: none
        (StepState.RUNNING, 0, True, 1),
        (StepState.RUNNING, 3, True, 4),
        (StepState.COMPLETED, 0, True, 1),
        (StepState.COMPLETED, 1, True, 2),
        (StepState.COMPLETED, 0, False, 0),  # a wait or fan-out node: no handler ran
        (StepState.DISCARDED, 5, True, 5),  # a discard counts its execution in attempt
        (StepState.PAUSED, 1, True, 1),  # parked after a failure
        (StepState.WAITING_SIGNAL, 0, False, 0),
        (StepState.CANCELLED, 1, True, 1),
    ],
)
def test_attempt_n_of_m_in_each_state(
    state: StepState, attempt: int, started: bool, shown: int
) -> None:
    step = info(state, attempt, started=started)
    assert executions(step) == shown
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(steps_table([step]))
    assert f"{shown} of 5" in out.getvalue().splitlines()[2]


async def test_run_tree_nests_fan_out_items_under_their_node(dsn: str) -> None:
    wf = fanned()
    async with cyclone.Client(dsn, workflows=[wf], poll_interval=0.05, lease_ttl=10) as c:
        sub = await c.submit(wf, [1, 2, 3])
        run = await c.wait(sub, timeout=30)
    assert run.result == [1, 4, 9]
    tree = await asyncio.to_thread(cyclone_cli, dsn, "run", str(sub.run_id))
    lines = [line for line in tree.splitlines() if any(c.isalnum() for c in line)]

    def at(start: str) -> tuple[int, int]:
        """(line number, indent) of the tree line whose text starts with ``start``."""
        for number, line in enumerate(lines):
            text = line.lstrip(" │├└─")
            if text.startswith(start):
                return number, len(line) - len(text)
        raise AssertionError(f"no line {start!r} in\n{tree}")

    fan, group, total = at("sq (polish_square)"), at("3 items: 3 completed"), at("total (")
    items = [at(f"sq[{i}]") for i in range(3)]
    assert group[1] == total[1] > fan[1]  # the items' line and total: both under sq
    assert all(indent > total[1] for _, indent in items)  # items one level deeper
    assert fan[0] < group[0] < items[0][0] < items[2][0] < total[0]
