"""Engine log lines about a step name its run and step, in the message and as record
attributes (what ``--log-format json`` prints as keys)."""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.observability.logs import STEP_FIELDS
from tests.apps.traced import flaky


async def test_a_retry_and_a_discard_are_logged_with_their_run_and_step(
    dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """The line of a failed attempt and the line of a discard carry ``run_id``,
    ``step_id``, ``node``, ``kind``, ``queue`` and ``attempt`` equal to the database's,
    and their message starts with ``run R step S (node N, kind K)``."""

    @cyclone.step("lg_gives_up")
    async def gives_up(ctx: cyclone.Context, value: Any) -> None:
        raise cyclone.Discard("not today")

    caplog.set_level(logging.INFO, logger="cyclone")
    async with cyclone.Client(
        dsn, handlers=[flaky, gives_up], poll_interval=0.05, purge_interval=None
    ) as client:
        retried = await client.enqueue(flaky, 5)
        given_up = await client.enqueue(gives_up, None)
        await client.wait(retried, timeout=60)
        await client.wait(given_up, timeout=60)
    about = [r for r in caplog.records if hasattr(r, "step_id")]
    for run, word in ((retried, "failed attempt 1"), (given_up, "discarded")):
        step_id, node, kind = db.execute(
            "SELECT id, node, kind FROM cyclone_steps WHERE run_id = %s", (run.run_id,)
        ).fetchone() or (None, None, None)
        lines = [r for r in about if r.step_id == step_id and word in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in about]
        record = lines[0]
        fields = {name: getattr(record, name) for name in STEP_FIELDS}
        assert fields == {
            "run_id": run.run_id,
            "step_id": step_id,
            "node": node,
            "kind": kind,
            "queue": "default",
            "attempt": 1,
        }
        assert record.getMessage().startswith(
            f"run {run.run_id} step {step_id} (node {node}, kind {kind}): "
        )
