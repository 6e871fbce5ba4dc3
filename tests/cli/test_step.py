"""One step by its id: ``get_step`` on both clients, and ``cyclone step ID`` (its fields
as text, ``--json``, an unknown id) run as a process, on steps a real worker ran."""

from __future__ import annotations

import re
from typing import Any

import pytest

import cyclone
from tests.cli.test_commands import as_json, cli, ok

PAD = "x" * 1000
"""A long input value: the text view cuts it, ``--json`` has all of it."""


@cyclone.step("cli_flaky", max_attempts=3, retry=cyclone.RetryPolicy(base=0.05, jitter=0))
async def flaky(ctx: cyclone.Context, inp: dict[str, Any]) -> dict[str, int]:
    if ctx.attempt == 0:
        raise RuntimeError("first try fails")
    return {"doubled": inp["n"] * 2}


async def ran_once_failed_then_completed(dsn: str) -> cyclone.Enqueued:
    """A ``cli_flaky`` job a worker ran twice: failed, then completed."""
    async with cyclone.Client(dsn, handlers=[flaky], poll_interval=0.05, lease_ttl=5) as c:
        job = await c.enqueue("cli_flaky", {"n": 21, "pad": PAD})
        await c.wait(job, timeout=30)
    return job


def fields(text: str) -> dict[str, str]:
    """The ``name  value`` lines of ``cyclone step``'s text view (first lines of values)."""
    shown: dict[str, str] = {}
    for line in text.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2 and not line.startswith(" "):
            shown.setdefault(parts[0], parts[1])
    return shown


async def test_get_step_on_both_clients(dsn: str) -> None:
    """The step as ``list_steps`` shows it; an unknown id is a NotFoundError, a bad one a
    ValidationError."""
    job = await ran_once_failed_then_completed(dsn)
    async with cyclone.Client(dsn) as producer:
        step = await producer.get_step(job.step_id)
        (listed,) = await producer.list_steps(job)
    assert step == listed
    assert (step.id, step.run_id, step.kind, step.state) == (
        job.step_id,
        job.run_id,
        "cli_flaky",
        cyclone.StepState.COMPLETED,
    )
    assert (step.attempt, step.max_attempts, step.reclaims) == (1, 3, 0)
    assert step.output == {"doubled": 42} and step.input == {"n": 21, "pad": PAD}
    assert step.error == "RuntimeError: first try fails" and step.error_kind == "exception"
    with cyclone.SyncClient(dsn) as sync:
        assert sync.get_step(job.step_id) == step
        with pytest.raises(cyclone.NotFoundError, match=f"step {job.step_id + 1} does not exist"):
            sync.get_step(job.step_id + 1)
        with pytest.raises(cyclone.ValidationError, match="step id must be between 1 and"):
            sync.get_step(0)


@pytest.mark.slow  # runs the `cyclone` command in a process
async def test_step_shows_one_step_as_text_and_json(dsn: str) -> None:
    job = await ran_once_failed_then_completed(dsn)
    with cyclone.SyncClient(dsn) as producer:
        waiting = producer.enqueue("cli_unserved", [1, 2])  # no worker runs this kind

    shown = fields(ok(dsn, "step", str(job.step_id)))
    assert shown["step"] == str(job.step_id) and shown["run"] == str(job.run_id)
    assert (shown["node"], shown["kind"], shown["queue"]) == ("cli_flaky",) * 2 + ("default",)
    assert (shown["state"], shown["attempt"], shown["reclaims"]) == ("completed", "2 of 3", "0")
    assert "lease" not in shown  # a finished step holds none
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", shown["completed"])
    assert shown["error_kind"] == "exception"
    assert shown["error"] == "RuntimeError: first try fails"
    assert shown["output"] == '{"doubled": 42}'
    assert shown["input"].startswith('{"n": 21, "pad": "xxx') and shown["input"].endswith(" …")
    assert len(shown["input"]) == 500 + 2  # cut at 500 characters
    assert shown["traceback"]  # the failed attempt's traceback, its last lines

    data = as_json(dsn, "step", str(job.step_id))
    assert (data["id"], data["run_id"], data["node"], data["state"]) == (
        job.step_id,
        job.run_id,
        "cli_flaky",
        "completed",
    )
    assert (data["attempt"], data["executions"], data["max_attempts"]) == (1, 2, 3)
    assert data["input"] == {"n": 21, "pad": PAD} and data["output"] == {"doubled": 42}
    assert "Traceback" in data["panic_stack"]

    never_ran = fields(ok(dsn, "step", str(waiting.step_id)))
    assert (never_ran["state"], never_ran["attempt"]) == ("available", "0 of 5")
    assert never_ran["input"] == "[1, 2]" and "output" not in never_ran
    assert never_ran["started"] == "-"
    assert as_json(dsn, "step", str(waiting.step_id))["executions"] == 0


@pytest.mark.slow  # runs the `cyclone` command in a process
def test_an_unknown_step_is_one_line_and_exit_status_1(dsn: str) -> None:
    result = cli(dsn, "step", "424242")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == "Error: step 424242 does not exist\n"
    assert cli(dsn, "step", "424242", "--json").returncode == 1
    bad = cli(dsn, "step", "abc")
    assert bad.returncode == 2 and "not a valid integer" in bad.stderr
