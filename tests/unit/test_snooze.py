"""``cyclone.Snooze`` and ``max_snoozes``: validation, and what a snooze comes to (no
database)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import cyclone
from cyclone.execute import decide_outcome
from cyclone.snoozing import Snoozed, snooze_limit_stmts, snooze_stmt
from cyclone.sql import Q
from cyclone.transitions import Failure
from tests.helpers import held_step


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [(0, 0.0), (2.5, 2.5), (timedelta(minutes=2), 120.0), (timedelta(0), 0.0)],
)
def test_a_delay_is_seconds_or_a_timedelta(delay: Any, seconds: float) -> None:
    snooze = cyclone.Snooze(delay)
    assert snooze.delay == seconds
    assert isinstance(snooze, cyclone.CycloneError)


@pytest.mark.parametrize(
    ("delay", "shown"),
    [
        (-1, "-1"),
        (timedelta(seconds=-1), "timedelta"),
        ("x", "'x'"),
        (None, "None"),
        (True, "True"),
        (math.nan, "nan"),
        (math.inf, "inf"),
    ],
)
def test_a_bad_delay_is_refused_naming_it(delay: Any, shown: str) -> None:
    with pytest.raises(cyclone.ValidationError, match=f"Snooze delay.*{shown}"):
        cyclone.Snooze(delay)


@pytest.mark.parametrize("declare", [cyclone.step, cyclone.action])
@pytest.mark.parametrize("bad", [-1, 1.5, "3", None])
def test_max_snoozes_must_be_a_count(declare: Any, bad: Any) -> None:
    with pytest.raises(cyclone.ValidationError, match=f"max_snoozes.*{bad!r}"):
        declare("bad_snoozes", max_snoozes=bad)


def test_max_snoozes_defaults_to_100_and_zero_is_allowed() -> None:
    @cyclone.action("default_snoozes")
    async def default(ctx: cyclone.Context, inp: Any) -> None: ...

    @cyclone.step("no_snoozes", max_snoozes=0)
    async def none(ctx: cyclone.Context, inp: Any) -> None: ...

    assert (default.limits.max_snoozes, none.limits.max_snoozes) == (100, 0)


@cyclone.step("pure_snoozer", max_snoozes=7, no_retry=[cyclone.CycloneError])
async def snoozer(ctx: cyclone.Context, inp: Any) -> None: ...


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_snooze_is_not_a_failure_whatever_no_retry_says() -> None:
    step = held_step(7, 3)
    outcome = decide_outcome(snoozer, step, error=_raised(cyclone.Snooze(30)))
    assert isinstance(outcome.failure, Snoozed)
    assert (outcome.failure.delay, outcome.failure.max_snoozes) == (30.0, 7)
    assert "Snooze: snoozed for 30 s" in (outcome.failure.panic_stack or "")


def test_a_snooze_after_the_timeout_is_a_timeout() -> None:
    step = replace(held_step(7, 3), timeout=1.0)
    outcome = decide_outcome(snoozer, step, error=cyclone.Snooze(30), timed_out=True)
    assert isinstance(outcome.failure, Failure)
    assert outcome.failure.error_kind == "timeout"


def test_snooze_statements() -> None:
    step = held_step(7, 3, owner="w/9", generation=4)
    snoozed = Snoozed(1.5, 2, "stack")
    stmt = snooze_stmt(step, snoozed)
    assert stmt.query is Q.steps_snooze
    assert stmt.params == {
        "id": 7,
        "owner": "w/9",
        "generation": 4,
        "max_snoozes": 2,
        "delay_us": 1_500_000,
    }
    names = [s.query.name for s in snooze_limit_stmts(step, snoozed)]
    assert names == ["runs_lock", "steps_snooze_discard", "graph_resolve_discard"]
    parent = replace(step, has_children=True)
    names = [s.query.name for s in snooze_limit_stmts(parent, snoozed)]
    assert names[-1] == "runs_cancel_children"
