"""Inputs checked at enqueue and submit against a handler's dataclass or pydantic
annotation: a wrong shape is a ValidationError naming the kind (or the workflow and
node) and the problem, raised before anything is written, instead of failed attempts."""

from __future__ import annotations

import dataclasses
from typing import Any

import psycopg
import pydantic
import pytest

import cyclone
from cyclone import RunState
from tests.helpers import scalar

TABLES = ("cyclone_runs", "cyclone_steps", "cyclone_step_inputs")


@dataclasses.dataclass
class Order:
    sku: str
    qty: int


class Invoice(pydantic.BaseModel):
    number: int
    total: float


@cyclone.step("iv_order")
async def take_order(ctx: cyclone.Context, inp: Order) -> int:
    return inp.qty


@cyclone.step("iv_invoice")
def take_invoice(ctx: cyclone.Context, inp: Invoice) -> float:
    return inp.total


@cyclone.step("iv_plain")
async def plain(ctx: cyclone.Context, inp: dict[str, Any]) -> Any:
    return inp


def counts(db: psycopg.Connection[Any]) -> dict[str, int]:
    return {table: scalar(db, f"SELECT count(*) FROM {table}") for table in TABLES}


NOTHING = dict.fromkeys(TABLES, 0)


async def test_enqueue_refuses_a_wrong_shape_before_writing(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn, handlers=[take_order, take_invoice]) as c:
        bad = r"input of kind 'iv_order' does not fit Order: .*unexpected keyword.*'quantity'"
        with pytest.raises(cyclone.ValidationError, match=bad):
            await c.enqueue(take_order, {"sku": "a", "quantity": 2})
        # by the registered kind's name too
        missing = r"input of kind 'iv_order' does not fit Order: .*missing .*'qty'"
        with pytest.raises(cyclone.ValidationError, match=missing):
            await c.enqueue("iv_order", {"sku": "a"})
        with pytest.raises(cyclone.ValidationError, match=r"does not fit Order: .*mapping"):
            await c.enqueue("iv_order", [1, 2])
        pydantic_bad = r"input of kind 'iv_invoice' does not fit Invoice: .*number"
        with pytest.raises(cyclone.ValidationError, match=pydantic_bad):
            await c.enqueue(take_invoice, {"number": "not a number", "total": 1.5})
        many = r"input of kind 'iv_invoice' at index 2 does not fit Invoice: .*total"
        with pytest.raises(cyclone.ValidationError, match=many):
            await c.enqueue_many(
                take_invoice, [{"number": 1, "total": 1}, Invoice(number=2, total=2), {"number": 3}]
            )
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(cyclone.ValidationError, match=r"'iv_order' does not fit Order"):
                await c.enqueue_tx(conn, take_order, {"sku": 1})
            await conn.commit()
    with (
        cyclone.SyncClient(dsn, handlers=[take_order]) as sync,
        pytest.raises(cyclone.ValidationError, match=r"'iv_order' does not fit Order"),
    ):
        sync.enqueue("iv_order", {})
    assert counts(db) == NOTHING


async def test_inputs_that_fit_are_written_and_run(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with cyclone.Client(dsn, handlers=[take_order, take_invoice], poll_interval=0.2) as c:
        a = await c.enqueue(take_order, Order("a", 3))
        b = await c.enqueue("iv_order", {"sku": "b", "qty": 4})
        (d,) = await c.enqueue_many("iv_invoice", [{"number": "7", "total": 2}])  # coerced
        runs = [await c.wait(h, timeout=30) for h in (a, b, d)]
    assert [r.result for r in runs] == [3, 4, 2.0]
    assert all(r.state == RunState.COMPLETED for r in runs)


async def test_no_check_without_a_model_or_a_known_handler(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A plain annotation passes the JSON through; a kind name the client does not
    register has no handler to check against: both are written as before."""
    async with cyclone.Client(dsn) as c:
        await c.enqueue(plain, [1, 2])
        await c.enqueue("iv_order", {"anything": True})
    assert counts(db)["cyclone_runs"] == 2


def order_flow() -> cyclone.Workflow:
    wf = cyclone.Workflow("iv_flow")
    root = wf.node("take", take_order)  # takes the run input: checked
    wf.node("count", take_order, input_from=root)  # a data edge: not the run input
    wf.node("fixed", take_invoice, input={"number": 1, "total": 1})  # a constant
    wf.node("free", plain)
    return wf


async def test_submit_checks_the_nodes_that_take_the_run_input(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    wf = order_flow()
    message = (
        r"input of workflow 'iv_flow', taken by node 'take' \(kind 'iv_order'\), "
        r"does not fit Order: .*missing .*'qty'"
    )
    async with cyclone.Client(dsn) as c:
        with pytest.raises(cyclone.ValidationError, match=message):
            await c.submit(wf, {"sku": "a"})
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            with pytest.raises(cyclone.ValidationError, match=message):
                await c.submit_tx(conn, wf, {"sku": "a"})
            await conn.commit()
    with cyclone.SyncClient(dsn) as sync, pytest.raises(cyclone.ValidationError, match=message):
        sync.submit(wf, {"sku": "a"}, submit_key="k")
    assert counts(db) == NOTHING
    async with cyclone.Client(dsn) as c:
        await c.submit(wf, {"sku": "a", "qty": 1})
    assert counts(db)["cyclone_runs"] == 1


async def test_submit_checks_a_child_workflow_that_takes_the_run_input(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    inner = cyclone.Workflow("iv_inner")
    inner.result(inner.node("bill", take_invoice))
    outer = cyclone.Workflow("iv_outer")
    outer.child("sub", inner)  # the child run's input is the run input
    fed = cyclone.Workflow("iv_fed")
    fed.child("sub", inner, input={"number": 1, "total": 1.0})  # a constant: no check
    message = (
        r"input of workflow 'iv_outer', taken by node 'bill' \(kind 'iv_invoice'\) of "
        r"child workflow 'iv_inner' \(node 'sub'\), does not fit Invoice"
    )
    async with cyclone.Client(dsn) as c:
        with pytest.raises(cyclone.ValidationError, match=message):
            await c.submit(outer, {"number": 1})
        assert counts(db) == NOTHING
        await c.submit(fed, "anything")
    assert counts(db)["cyclone_runs"] == 1


@cyclone.step("iv_producer")
async def producer(ctx: cyclone.Context, inp: Any) -> list[str]:
    """Tries a bad enqueue and a bad submit in its completion transaction."""
    errors = []
    try:
        await ctx.enqueue_completion(take_order, {"sku": "x"})
    except cyclone.ValidationError as exc:
        errors.append(str(exc))
    try:
        await ctx.submit_completion(order_flow(), {"qty": 1})
    except cyclone.ValidationError as exc:
        errors.append(str(exc))
    return errors


async def test_the_completion_forms_check_too(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with cyclone.Client(
        dsn, handlers=[producer, take_order, take_invoice, plain], poll_interval=0.2
    ) as c:
        run = await c.wait(await c.enqueue(producer, None), timeout=30)
    assert run.state == RunState.COMPLETED
    assert [e.split(":")[0] for e in run.result] == [
        "input of kind 'iv_order' does not fit Order",
        "input of workflow 'iv_flow', taken by node 'take' (kind 'iv_order'), does not fit Order",
    ]
    assert counts(db)["cyclone_runs"] == 1  # the producer's own run only


class Aliased(pydantic.BaseModel):
    user_id: int = pydantic.Field(alias="userId")


@cyclone.step("iv_aliased")
async def take_aliased(ctx: cyclone.Context, inp: Aliased) -> int:
    return inp.user_id


async def test_a_model_with_aliases_round_trips(dsn: str) -> None:
    """A pydantic model is stored by its aliases, which is what it validates back: an
    instance enqueued as it is fits its own kind and reaches the handler."""
    async with cyclone.Client(dsn, handlers=[take_aliased]) as c:
        job = await c.enqueue(take_aliased, Aliased(userId=5))
        run = await c.wait(job, timeout=30)
    assert (run.state, run.result) == (RunState.COMPLETED, 5)
