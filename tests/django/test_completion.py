"""``completion_atomic``: a sync handler's ORM writes run on the step's completion
transaction, commit with it or not at all, and Django's own commit is refused."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError

import cyclone
from cyclone.contrib.django import completion_atomic
from cyclone.errors import StateError, ValidationError
from tests.django.conftest import ZONE

AT = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


def _receipts(pg: psycopg.Connection[Any], run_id: int) -> list[str]:
    rows = pg.execute(
        "SELECT note FROM shop_receipt WHERE run_id = %s ORDER BY id", (run_id,)
    ).fetchall()
    return [row[0] for row in rows]


async def _run(dsn: str, handler: cyclone.Handler, inp: Any = None) -> cyclone.Run:
    async with cyclone.Client(dsn, handlers=[handler]) as client:
        return await client.wait(await client.enqueue(handler, inp), timeout=30)


@cyclone.step("django_writes", max_attempts=1)
def writes(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    from tests.django.shop.models import Receipt

    if inp == "own connection first":  # the thread's own Django connection, opened
        Receipt.objects.filter(run_id=-1).exists()
    own = connections["default"].connection
    try:
        with completion_atomic(ctx):
            made = Receipt.objects.create(
                run_id=ctx.run_id, note="paid", issued_at=AT, details={"items": [1, 2]}
            )
            read = Receipt.objects.get(pk=made.pk)  # through Django's loaders
            inside = ctx.completion_tx().info.parameter_status("TimeZone")
            followup = ctx.enqueue_completion("django_followup", {"receipt": made.pk})
        restored = connections["default"].connection is own
        # on the thread's own connection (if any), the receipt is not committed yet
        seen = own is not None and Receipt.objects.filter(pk=made.pk).exists()
    finally:
        connections.close_all()  # this thread's own connections
    return {
        "followup": followup.run_id,
        "issued_at": read.issued_at.isoformat(),
        "details": read.details,
        "zone_inside": inside,
        "zone_after": ctx.completion_tx().info.parameter_status("TimeZone"),
        "own_connection_restored": restored,
        "seen_before_commit": seen,
    }


@pytest.mark.parametrize("inp", ["no connection first", "own connection first"])
async def test_orm_writes_commit_with_the_step(
    django_dsn: str, pg: psycopg.Connection[Any], inp: str
) -> None:
    """The receipt, and a run enqueued in the block, commit with the step; read back in
    the block, its datetime and JSON come through Django's loaders (UTC session, jsonb
    as text); after the block the completion connection is back in its own time zone
    and the thread's Django connection is its own again (none, or the one it had opened,
    which does not see the receipt before the step commits)."""
    run = await _run(django_dsn, writes, inp)
    assert run.state == cyclone.RunState.COMPLETED, run.error
    followup = run.result.pop("followup")
    assert run.result == {
        "issued_at": AT.isoformat(),
        "details": {"items": [1, 2]},
        "zone_inside": "UTC",
        "zone_after": ZONE,
        "own_connection_restored": True,
        "seen_before_commit": False,
    }
    assert _receipts(pg, run.id) == ["paid"]
    assert pg.execute(
        "SELECT kind FROM cyclone_steps WHERE run_id = %s", (followup,)
    ).fetchall() == [("django_followup",)]


@cyclone.action("django_fails_after", max_attempts=1)
def fails_after(ctx: cyclone.Context, inp: Any) -> None:
    from tests.django.shop.models import Receipt

    with completion_atomic(ctx):
        Receipt.objects.create(run_id=ctx.run_id, note="never")
    raise RuntimeError("after the block")


@cyclone.action("django_fails_inside", max_attempts=1)
def fails_inside(ctx: cyclone.Context, inp: Any) -> None:
    from tests.django.shop.models import Receipt

    with completion_atomic(ctx):
        Receipt.objects.create(run_id=ctx.run_id, note="never")
        raise RuntimeError("inside the block")


@pytest.mark.parametrize("handler", [fails_after, fails_inside])
async def test_orm_writes_roll_back_when_the_handler_raises(
    django_dsn: str, pg: psycopg.Connection[Any], handler: cyclone.Handler
) -> None:
    """A handler that raises, after the block or inside it, fails the step and leaves
    no receipt: the ORM wrote in the completion transaction, not on Django's own
    autocommit connection."""
    run = await _run(django_dsn, handler)
    assert run.state == cyclone.RunState.FAILED
    assert "the block" in (run.error or "")
    assert _receipts(pg, run.id) == []


@cyclone.step("django_refusals", max_attempts=1)
def refusals(ctx: cyclone.Context, inp: Any) -> list[str]:
    from tests.django.shop.models import Receipt

    refused: list[str] = []
    with completion_atomic(ctx):
        Receipt.objects.create(run_id=ctx.run_id, note="kept")
        for attempt in (
            transaction.commit,
            lambda: transaction.set_autocommit(True),
            lambda: transaction.on_commit(lambda: None),
            connections["default"].close,
            lambda: completion_atomic(ctx).__enter__(),
        ):
            try:
                attempt()
            except (TransactionManagementError, StateError) as exc:
                refused.append(type(exc).__name__)
        try:
            with transaction.atomic():  # a savepoint: its row goes, the block's stays
                Receipt.objects.create(run_id=ctx.run_id, note="undone")
                raise RuntimeError("undo the savepoint")
        except RuntimeError:
            pass
        try:
            with transaction.atomic():
                connections["default"].cursor().execute("SELECT 1/0")
        except DatabaseError:
            refused.append("DatabaseError")
        Receipt.objects.create(run_id=ctx.run_id, note="after the errors")
    return refused


async def test_djangos_own_commit_is_refused_in_the_block(
    django_dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Inside the block Django cannot commit, turn autocommit on, register on_commit
    callbacks, close the connection or nest a second block; atomic() blocks are
    savepoints, a failed one included."""
    run = await _run(django_dsn, refusals)
    assert run.state == cyclone.RunState.COMPLETED, run.error
    assert run.result == [
        "TransactionManagementError",
        "TransactionManagementError",
        "StateError",
        "StateError",
        "StateError",
        "DatabaseError",
    ]
    assert _receipts(pg, run.id) == ["kept", "after the errors"]


@cyclone.step("django_bad_uses", max_attempts=1)
def bad_uses(ctx: cyclone.Context, inp: Any) -> list[str]:
    messages: list[str] = []
    try:
        for using in ("nowhere", "lite"):
            try:
                with completion_atomic(ctx, using=using):
                    pass
            except ValidationError as exc:
                messages.append(str(exc))
        with transaction.atomic():
            try:
                with completion_atomic(ctx):
                    pass
            except StateError as exc:
                messages.append(str(exc))
    finally:
        connections.close_all()  # this thread's own connections
    return messages


@cyclone.step("django_async_use", max_attempts=1)
async def async_use(ctx: cyclone.Context, inp: Any) -> str:
    try:
        with completion_atomic(ctx):
            pass
    except ValidationError as exc:
        return str(exc)
    return "accepted"


async def test_bad_uses_are_refused(django_dsn: str, pg: psycopg.Connection[Any]) -> None:
    """An unknown alias, a SQLite alias, a thread already inside Django's own atomic()
    and an async handler are refused, each with an error naming it."""
    run = await _run(django_dsn, bad_uses)
    assert run.state == cyclone.RunState.COMPLETED, run.error
    unknown, lite, nested = run.result
    assert "using='nowhere' is not an alias" in unknown
    assert "'lite' uses 'django.db.backends.sqlite3'" in lite
    assert "'default' is inside a transaction of its own" in nested
    run = await _run(django_dsn, async_use)
    assert run.state == cyclone.RunState.COMPLETED, run.error
    assert "needs a plain def handler" in run.result
