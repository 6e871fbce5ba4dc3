"""Submit keys of jobs: retrying an ambiguous enqueue with the same keys is safe.

A run of a kind that holds a submit key (in any state, until it is purged) is returned
by every later enqueue of the key with ``duplicate=True``: nothing is written and no
wakeup is sent. Concurrent enqueues of one key make one run.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from tests.helpers import apoll_until, scalar

LATER = timedelta(hours=1)  # keeps jobs unclaimed where no worker should run them


@cyclone.step("echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("parent")
async def parent(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    child = await ctx.enqueue_completion("echo", inp, submit_key="child-of-parent")
    return {"run_id": child.run_id, "duplicate": child.duplicate}


def _counts(db: psycopg.Connection[Any]) -> tuple[int, int]:
    return (
        scalar(db, "SELECT count(*) FROM cyclone_runs"),
        scalar(db, "SELECT count(*) FROM cyclone_steps"),
    )


def _same(first: cyclone.Enqueued, again: cyclone.Enqueued) -> bool:
    return (again.run_id, again.step_id, again.duplicate) == (first.run_id, first.step_id, True)


async def test_async_retries_with_the_same_keys_return_the_same_runs(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn) as client:
        one = await client.enqueue("echo", 1, submit_key="order-1", scheduled_at=LATER)
        many = await client.enqueue_many(
            "echo", [2, 3, 4], submit_keys=["order-2", None, "order-4"], scheduled_at=LATER
        )
        written = _counts(db)
        one_again = await client.enqueue("echo", "other input", submit_key="order-1")
        many_again = await client.enqueue_many(
            "echo", [20, 40, 10], submit_keys=["order-2", "order-4", "order-1"]
        )
        assert _counts(db) == written  # a duplicate writes nothing
        other_kind = await client.enqueue("parent", 1, submit_key="order-1", scheduled_at=LATER)
    assert not one.duplicate and not any(m.duplicate for m in many)
    assert len({one.run_id, *(m.run_id for m in many)}) == 4
    assert _same(one, one_again)
    assert [_same(a, b) for a, b in zip([many[0], many[2], one], many_again, strict=True)] == [
        True,
        True,
        True,
    ]
    assert not other_kind.duplicate  # the key is unique per kind
    assert written == (4, 4)


def test_sync_retries_with_the_same_keys_return_the_same_runs(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    with cyclone.SyncClient(dsn) as client:
        one = client.enqueue("echo", 1, submit_key="order-1", scheduled_at=LATER)
        many = client.enqueue_many(
            "echo", [2, 3], submit_keys=["order-2", "order-3"], scheduled_at=LATER
        )
        written = _counts(db)
        one_again = client.enqueue("echo", 1, submit_key="order-1")
        mixed = client.enqueue_many("echo", [3, 5], submit_keys=["order-3", "order-5"])
    assert _same(one, one_again)
    assert _same(many[1], mixed[0])
    assert not mixed[1].duplicate and mixed[1].run_id not in {one.run_id, many[1].run_id}
    assert _counts(db) == (written[0] + 1, written[1] + 1)  # only order-5 was new


async def test_tx_forms_see_keys_of_their_own_and_of_committed_transactions(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn) as client, await psycopg.AsyncConnection.connect(dsn) as conn:
        first = await client.enqueue_tx(conn, "echo", 1, submit_key="a")
        same_tx = await client.enqueue_tx(conn, "echo", 1, submit_key="a")
        many = await client.enqueue_many_tx(conn, "echo", [1, 2], submit_keys=["a", "b"])
        await conn.commit()
        later = await client.enqueue_many_tx(conn, "echo", [2, 1], submit_keys=["b", "a"])
        await conn.commit()
    with cyclone.SyncClient(dsn) as sync_client, psycopg.connect(dsn) as sync_conn:
        sync_again = sync_client.enqueue_tx(sync_conn, "echo", 1, submit_key="a")
        sync_many = sync_client.enqueue_many_tx(sync_conn, "echo", [3], submit_keys=["b"])
        sync_conn.commit()
    assert not first.duplicate
    assert _same(first, same_tx) and _same(first, many[0]) and not many[1].duplicate
    assert _same(many[1], later[0]) and _same(first, later[1])
    assert _same(first, sync_again) and _same(many[1], sync_many[0])
    assert _counts(db) == (2, 2)


async def test_a_rolled_back_enqueue_leaves_its_key_free(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn) as client:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            await client.enqueue_tx(conn, "echo", 1, submit_key="a")
            await conn.rollback()
        fresh = await client.enqueue("echo", 1, submit_key="a", scheduled_at=LATER)
    assert not fresh.duplicate
    assert _counts(db) == (1, 1)


async def test_the_key_outlives_the_run_completing(dsn: str, db: psycopg.Connection[Any]) -> None:
    """Unlike unique_key, a submit key stays taken after the run finished."""
    async with cyclone.Client(dsn, handlers=[echo]) as worker:
        job = await worker.enqueue("echo", 1, submit_key="k1")
        (batch,) = await worker.enqueue_many("echo", [2], submit_keys=["k2"])
        assert (await worker.wait(job, timeout=30)).state == RunState.COMPLETED
        assert (await worker.wait(batch, timeout=30)).state == RunState.COMPLETED
        written = _counts(db)
        again = await worker.enqueue("echo", 99, submit_key="k1")
        (batch_again,) = await worker.enqueue_many("echo", [98], submit_keys=["k2"])
        run = await worker.get_run(again)
    with cyclone.SyncClient(dsn) as sync_client:
        sync_again = sync_client.enqueue("echo", 97, submit_key="k1")
    assert _same(job, again) and _same(batch, batch_again) and _same(job, sync_again)
    assert run.result == 1  # the first run's outcome, not a new run's
    assert _counts(db) == written


async def _waiting_on_locks(db: psycopg.Connection[Any], n: int) -> bool:
    await asyncio.sleep(0)
    waiting = scalar(
        db,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock'",
    )
    return bool(waiting >= n)


@pytest.mark.parametrize("holder_commits", [True, False], ids=["commit", "rollback"])
async def test_concurrent_enqueues_of_one_key_make_one_run(
    dsn: str, db: psycopg.Connection[Any], holder_commits: bool
) -> None:
    """Callers that wait on an uncommitted insert of their key find the run once the
    holder commits (invisible to their insert's snapshot), or one of them writes it
    when the holder rolls back; either way every caller returns the one run."""
    async with (
        cyclone.Client(dsn) as one,
        cyclone.Client(dsn) as two,
        await psycopg.AsyncConnection.connect(dsn) as holder,
    ):
        held = await one.enqueue_tx(holder, "echo", 0, submit_key="shared", scheduled_at=LATER)
        first_task = asyncio.create_task(
            one.enqueue("echo", 1, submit_key="shared", scheduled_at=LATER)
        )
        second_task = asyncio.create_task(
            two.enqueue("echo", 2, submit_key="shared", scheduled_at=LATER)
        )
        many_task = asyncio.create_task(
            two.enqueue_many("echo", [3, 4], submit_keys=["other", "shared"], scheduled_at=LATER)
        )
        await apoll_until(lambda: _waiting_on_locks(db, 3), what="three callers blocked")
        if holder_commits:
            await holder.commit()
        else:
            await holder.rollback()
        first, second, (other, third) = await first_task, await second_task, await many_task
    shared = [first, second, third]
    runs = scalar(db, "SELECT count(*) FROM cyclone_runs WHERE submit_key = 'shared'")
    assert runs == 1
    assert len({(h.run_id, h.step_id) for h in shared}) == 1
    assert not other.duplicate
    if holder_commits:
        assert all(h.duplicate for h in shared) and first.run_id == held.run_id
    else:
        assert sorted(h.duplicate for h in shared) == [False, True, True]
    assert _counts(db) == (2, 2)


async def test_a_completion_enqueue_with_a_key_runs_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """ctx.enqueue_completion takes submit_key: a second parent gets the first child."""
    async with cyclone.Client(dsn, handlers=[parent], queues={"default": 1}) as worker:
        first = await worker.wait(await worker.enqueue("parent", "x"), timeout=30)
        second = await worker.wait(await worker.enqueue("parent", "y"), timeout=30)
    assert first.result["duplicate"] is False
    assert second.result == {"run_id": first.result["run_id"], "duplicate": True}
    children = scalar(db, "SELECT count(*) FROM cyclone_runs WHERE workflow = 'echo'")
    assert children == 1


async def test_a_duplicate_sends_no_wakeup(dsn: str) -> None:
    """Notifications arrive in order: the wakeup of a later new job comes with none of
    the duplicate's before it."""
    listen = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    async with listen:
        await listen.execute("LISTEN cyclone_available")
        async with cyclone.Client(dsn, notify_coalesce=0) as client:
            await client.enqueue("echo", 1, submit_key="k", queue="a", scheduled_at=LATER)
            notes = [n.payload async for n in listen.notifies(timeout=10, stop_after=1)]
            await client.enqueue("echo", 1, submit_key="k", queue="a")
            await client.enqueue_many("echo", [1], submit_keys=["k"], queue="a")
            await client.enqueue("echo", 1, queue="z", scheduled_at=LATER)
            notes += [n.payload async for n in listen.notifies(timeout=10, stop_after=1)]
        with cyclone.SyncClient(dsn) as sync_client:
            sync_client.enqueue("echo", 1, submit_key="k", queue="a")
            sync_client.enqueue("echo", 1, queue="y", scheduled_at=LATER)
        notes += [n.payload async for n in listen.notifies(timeout=10, stop_after=1)]
    assert notes == ['{"queue":"a"}', '{"queue":"z"}', '{"queue":"y"}']


async def test_a_key_held_by_a_workflow_of_the_same_name_is_named(dsn: str) -> None:
    wf = cyclone.Workflow("clash")
    wf.node("only", echo)
    async with cyclone.Client(dsn) as client:
        await client.submit(wf, 1, submit_key="k")
        with pytest.raises(cyclone.StateError, match=r"held by run \d+, a run of workflow 'clash'"):
            await client.enqueue("clash", 1, submit_key="k")


BAD_KEYS: list[tuple[str, str, dict[str, Any], str]] = [
    ("empty submit_key", "one", {"submit_key": ""}, "submit_key must not be empty"),
    ("NUL in submit_key", "one", {"submit_key": "a\x00"}, "submit_key must not contain NUL"),
    ("submit_key not text", "one", {"submit_key": 7}, "submit_key must be a string, got 7"),
    ("submit_key too long", "one", {"submit_key": "k" * 2000}, "2000 bytes, over the 1024"),
    (
        "unique_key and submit_key",
        "one",
        {"submit_key": "a", "unique_key": "u"},
        "unique_key 'u' and submit_key 'a' cannot be combined",
    ),
    ("submit_keys on enqueue", "one", {"submit_keys": ["a"]}, r"unknown option\(s\)"),
    ("submit_key on enqueue_many", "many", {"submit_key": "a"}, r"unknown option\(s\)"),
    ("submit_keys a string", "many", {"submit_keys": "ab"}, "submit_keys must be a list"),
    ("too few submit_keys", "many", {"submit_keys": ["a"]}, "1 keys for 2 inputs"),
    ("too many submit_keys", "many", {"submit_keys": ["a", "b", "c"]}, "3 keys for 2 inputs"),
    ("a key twice", "many", {"submit_keys": ["a", "a"]}, "submit_keys repeats 'a'"),
    ("an empty key", "many", {"submit_keys": ["a", ""]}, r"submit_keys\[1\] must not be empty"),
    ("a key not text", "many", {"submit_keys": [None, 3]}, r"submit_keys\[1\] must be a string"),
]


@pytest.mark.parametrize(
    ("case", "call", "options", "message"), BAD_KEYS, ids=[c[0] for c in BAD_KEYS]
)
async def test_bad_keys_are_refused_and_write_nothing(
    dsn: str,
    db: psycopg.Connection[Any],
    case: str,
    call: str,
    options: dict[str, Any],
    message: str,
) -> None:
    async with cyclone.Client(dsn) as client, await psycopg.AsyncConnection.connect(dsn) as conn:
        with pytest.raises(cyclone.ValidationError, match=message):
            await _enqueue(client, None, call, options)
        with pytest.raises(cyclone.ValidationError, match=message):
            await _enqueue(client, conn, call, options)
        await conn.commit()
    with (
        cyclone.SyncClient(dsn) as sync_client,
        pytest.raises(cyclone.ValidationError, match=message),
    ):
        _enqueue_sync(sync_client, call, options)
    assert _counts(db) == (0, 0)


async def _enqueue(
    client: cyclone.Client,
    conn: psycopg.AsyncConnection[Any] | None,
    call: str,
    options: dict[str, Any],
) -> object:
    if call == "one":
        if conn is None:
            return await client.enqueue("echo", 1, **options)
        return await client.enqueue_tx(conn, "echo", 1, **options)
    if conn is None:
        return await client.enqueue_many("echo", [1, 2], **options)
    return await client.enqueue_many_tx(conn, "echo", [1, 2], **options)


def _enqueue_sync(client: cyclone.SyncClient, call: str, options: dict[str, Any]) -> object:
    if call == "one":
        return client.enqueue("echo", 1, **options)
    return client.enqueue_many("echo", [1, 2], **options)


async def test_a_key_held_by_a_job_of_the_same_name_is_named(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """The other way round: a submit never returns a job's run as its duplicate."""
    wf = cyclone.Workflow("clash")
    wf.node("only", echo)
    async with cyclone.Client(dsn) as client:
        job = await client.enqueue("clash", 1, submit_key="k")
        with pytest.raises(cyclone.StateError, match=rf"held by run {job.run_id}, a job"):
            await client.submit(wf, 1, submit_key="k")
    assert db.execute("SELECT count(*) FROM cyclone_runs").fetchone() == (1,)
