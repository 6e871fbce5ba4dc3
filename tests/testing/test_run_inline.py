"""run_inline: a new run's steps run in the calling process; refused in a coroutine."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.errors import StateError, ValidationError
from cyclone.states import RunState
from cyclone.testing import run_inline
from tests.helpers import scalar


@cyclone.step("t_double")
def double(ctx: cyclone.Context, x: int) -> int:
    return 2 * x


@cyclone.step("t_add")
async def add(ctx: cyclone.Context, xs: list[int]) -> int:
    return sum(xs)


@cyclone.step("t_refuse", max_attempts=1)
async def refuse(ctx: cyclone.Context, inp: None) -> None:
    raise ValueError("no")


pair = cyclone.Workflow("t_pair")
_a = pair.node("a", double)
_b = pair.node("b", double, input=10)
pair.result(pair.node("sum", add, inputs=[_a, _b]))


def test_a_workflow_runs_to_its_result(dsn: str) -> None:
    run = run_inline(pair, 4, dsn=dsn)
    assert isinstance(run, cyclone.Run)
    assert (run.workflow, run.state, run.result) == ("t_pair", RunState.COMPLETED, 28)


def test_a_kind_runs_as_a_job(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert run_inline(double, 21, dsn=dsn).result == 42
    failed = run_inline(refuse, None, dsn=dsn)
    assert failed.state is RunState.FAILED
    assert "no" in (failed.error or "")
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 2


async def test_it_refuses_to_run_in_a_coroutine(dsn: str, db: psycopg.Connection[Any]) -> None:
    with pytest.raises(StateError, match=r"await cyclone\.testing\.drain"):
        run_inline(pair, 4, dsn=dsn)
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0


@pytest.mark.parametrize(
    ("target", "options", "named"),
    [
        ("t_pair", {}, "Workflow"),
        (None, {}, "Workflow"),
        (pair, {"max_steps": 0}, "max_steps"),
        (pair, {"max_steps": "5"}, "max_steps"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    dsn: str, db: psycopg.Connection[Any], target: Any, options: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValidationError, match=named):
        run_inline(target, 4, dsn=dsn, **options)
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
