"""``cyclone kinds`` shows the flow control each kind stored; ``--limits`` alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

import cyclone
from tests.cli.test_queues_pause import ok

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process


@cyclone.step("cli_limited", max_concurrency=3, rate_limit="100/m", max_snoozes=7)
async def limited(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


async def test_kinds_shows_the_stored_limits(dsn: str) -> None:
    """A client that registers a kind stores its limits at start; `cyclone kinds`
    prints them under the step counts, `--limits --json` gives them as objects, and
    `--json` alone keeps the step counts' shape."""
    async with cyclone.Client(dsn, handlers=[limited]) as client:
        await client.wait(await client.enqueue(limited, 1), timeout=30)
    text = ok("kinds", dsn=dsn)
    assert "cli_limited" in text and "100/m" in text and "max_concurrency" in text
    (row,) = json.loads(ok("kinds", "--limits", "--json", dsn=dsn))
    assert (row["kind"], row["max_concurrency"], row["rate_count"], row["rate_per"]) == (
        "cli_limited",
        3,
        100,
        60.0,
    )
    assert (row["rate_burst"], row["max_snoozes"]) == (0, 7)
    counts = json.loads(ok("kinds", "--json", dsn=dsn))
    assert {(c["kind"], c["state"]) for c in counts} == {("cli_limited", "completed")}
    assert "100/m" in ok("kinds", "--limits", dsn=dsn)


def test_kinds_without_limits_says_so(dsn: str) -> None:
    assert ok("kinds", "--limits", dsn=dsn).strip() == "no limits stored"
