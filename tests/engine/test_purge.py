"""Retention and purge against real PostgreSQL: exactly the expired terminal runs go,
with every row that hangs off them; live runs and the runs a live parent still needs
stay. Time passes by the database clock (``finished_at`` moved back), never by sleeping.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from cyclone.scanners.purge import purge_async
from tests.helpers import apoll_until, scalar


@cyclone.step("purge_echo")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


@cyclone.step("purge_fail", max_attempts=1)
async def fail(ctx: cyclone.Context, value: Any) -> Any:
    raise cyclone.Discard("no")


HANDLERS = [echo, fail]
ROW_TABLES = (
    "cyclone_steps",
    "cyclone_deps",
    "cyclone_step_inputs",
    "cyclone_signals",
    "cyclone_schedule_fires",
)


def client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("purge_interval", None)
    return cyclone.Client(
        dsn, handlers=HANDLERS, workflows=workflows, poll_interval=0.05, lease_ttl=5, **options
    )


def age(db: psycopg.Connection[Any], run_ids: list[int], by: timedelta) -> None:
    """Make runs look finished ``by`` earlier."""
    db.execute(
        "UPDATE cyclone_runs SET finished_at = finished_at - %s WHERE id = ANY(%s)",
        (by, run_ids),
    )


def remaining(db: psycopg.Connection[Any]) -> set[int]:
    return {r[0] for r in db.execute("SELECT id FROM cyclone_runs").fetchall()}


def rows_of(db: psycopg.Connection[Any], run_ids: list[int]) -> dict[str, int]:
    return {
        table: scalar(db, f"SELECT count(*) FROM {table} WHERE run_id = ANY(%s)", (run_ids,))
        for table in ROW_TABLES
    }


async def test_purge_deletes_exactly_the_expired_terminal_runs(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    diamond = cyclone.Workflow("purge_diamond")
    a = diamond.node("a", echo)
    b = diamond.node("b", echo, input_from=a)
    c2 = diamond.node("c", echo, input_from=a)
    diamond.result(diamond.node("d", echo, inputs=[b, c2]))
    async with client(dsn, diamond, retention=timedelta(hours=1)) as c:
        short = await c.enqueue(echo, 1, retention=timedelta(minutes=1))
        default = await c.enqueue(echo, 2)  # the client default: one hour
        with cyclone.SyncClient(dsn, retention=None) as keeper:
            forever = keeper.enqueue(echo, 3)  # a client that keeps its runs forever
        failed = await c.enqueue(fail, 4, retention=timedelta(minutes=1))
        dag = await c.submit(diamond, 5, submit_key="order-5")
        for ref in (short, default, forever, failed, dag):
            await c.wait(ref, timeout=30)
        live = await c.enqueue("purge_nobody_runs_this", 6, retention=0)  # stays available
        mixed = await c.enqueue(echo, 7, retention=timedelta(minutes=1))
        await c.wait(mixed, timeout=30)
        # one step of the run keeps it longer than the other would
        db.execute(
            "UPDATE cyclone_steps SET retention = interval '2 hours' WHERE run_id = %s",
            (mixed.run_id,),
        )
        finished = [short.run_id, default.run_id, forever.run_id, failed.run_id]
        finished += [dag.run_id, mixed.run_id]
        age(db, finished, timedelta(minutes=30))
        assert await c.purge() == 2  # short and failed: 30 min > their 1 min
        assert remaining(db) == {default.run_id, forever.run_id, dag.run_id, live.run_id} | {
            mixed.run_id
        }
        assert rows_of(db, [short.run_id, failed.run_id]) == dict.fromkeys(ROW_TABLES, 0)
        assert rows_of(db, [dag.run_id])["cyclone_deps"] == 4  # untouched
        age(db, finished, timedelta(hours=1))  # 90 min: the default hour has passed
        assert await c.purge() == 2
        assert remaining(db) == {forever.run_id, live.run_id, mixed.run_id}
        assert rows_of(db, [dag.run_id]) == dict.fromkeys(ROW_TABLES, 0)
        assert await c.purge() == 0
        age(db, finished, timedelta(hours=1))  # 150 min: past the longest step's 2 hours
        assert await c.purge() == 1
        assert remaining(db) == {forever.run_id, live.run_id}
        # older_than ignores retention, and never touches a run that is not terminal
        assert await c.purge(older_than=timedelta(minutes=1)) == 1
        assert remaining(db) == {live.run_id}
        assert await c.purge(older_than=0) == 0
        # a purged submit_key is free again
        again = await c.submit(diamond, 5, submit_key="order-5")
        assert not again.duplicate and again.run_id != dag.run_id
        assert (await c.wait(again, timeout=30)).state is RunState.COMPLETED


async def test_a_child_run_stays_while_its_parent_is_live(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    kid = cyclone.Workflow("purge_kid")
    kid.result(kid.node("work", echo))
    parent = cyclone.Workflow("purge_parent")
    child = parent.child("kid", kid)
    gate = parent.wait_signal("go", after=[child])
    parent.result(parent.node("done", echo, input_from=gate))
    async with client(dsn, parent, retention=0) as c:
        sub = await c.submit(parent, {"n": 1})

        async def child_done() -> Any:
            return scalar(
                db,
                "SELECT id FROM cyclone_runs WHERE parent_run_id = %s AND state = 'completed'",
                (sub.run_id,),
            )

        child_id = await apoll_until(child_done, what="the child run to complete")
        assert await c.purge() == 0  # the child waits for its parent; the parent is live
        assert await c.purge(older_than=0) == 0
        assert remaining(db) == {sub.run_id, child_id}
        assert await c.signal(sub, "go", "now")
        assert (await c.wait(sub, timeout=30)).state is RunState.COMPLETED
        assert await c.purge() == 2
        assert remaining(db) == set()
        assert rows_of(db, [sub.run_id, child_id]) == dict.fromkeys(ROW_TABLES, 0)


async def test_started_clients_purge_on_their_own(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with client(dsn, retention=0, purge_interval=0.05) as c:
        job = await c.enqueue(echo, 1)
        await c.wait(job, timeout=30)

        async def gone() -> bool:
            return not remaining(db)

        await apoll_until(gone, what="the background purge")


def test_sync_client_purges_and_checks_its_argument(dsn: str, db: psycopg.Connection[Any]) -> None:
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version, state, finished_at) VALUES "
        "('k', 'job', 'completed', now() - interval '2 days'), ('k', 'job', 'running', NULL)"
    )
    with cyclone.SyncClient(dsn) as c:
        with pytest.raises(cyclone.ValidationError, match="older_than"):
            c.purge(older_than=-1)
        assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 2
        assert c.purge(older_than=timedelta(days=1)) == 1
        assert scalar(db, "SELECT state FROM cyclone_runs") == "running"


async def test_purge_works_in_bounded_batches(dsn: str, db: psycopg.Connection[Any]) -> None:
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version, state, finished_at) "
        "SELECT 'k', 'job', 'completed', now() - interval '1 day' FROM generate_series(1, 7)"
    )
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        assert await purge_async(conn, 0, batch=3, max_batches=2) == 6  # two batches of 3
        assert count_runs(db) == 1
        assert await purge_async(conn, 0, batch=3) == 1
    assert count_runs(db) == 0


def count_runs(db: psycopg.Connection[Any]) -> int:
    return int(scalar(db, "SELECT count(*) FROM cyclone_runs"))


def test_purge_never_deletes_a_run_with_an_active_descendant(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Rows as a database written before parents cancelled their children holds them: a
    failed run whose cancelled child run still has a running child of its own. Even
    purge(older_than=0) deletes none of them (the running grandchild would be left with
    no parent to find it by); once the grandchild is finished, all three go."""
    db.execute(
        "INSERT INTO cyclone_runs (id, workflow, def_version, state, finished_at, "
        "parent_run_id, parent_node_id) OVERRIDING SYSTEM VALUE VALUES "
        "(1, 'top', 'v1', 'failed', now() - interval '1 day', NULL, NULL), "
        "(2, 'middle', 'v2', 'cancelled', now() - interval '1 day', 1, 'middle'), "
        "(3, 'leaf', 'v3', 'running', NULL, 2, 'leaf')"
    )
    db.execute(
        "INSERT INTO cyclone_steps (run_id, node, kind, state, completed_at, lease_owner)"
        " VALUES (1, 'middle', '@child', 'discarded', now(), NULL),"
        " (2, 'leaf', '@child', 'cancelled', now(), NULL), (3, 'work', 'k', 'running', NULL, 'w')"
    )
    with cyclone.SyncClient(dsn) as c:
        assert c.purge(older_than=0) == 0
        assert remaining(db) == {1, 2, 3}
        db.execute("UPDATE cyclone_runs SET state = 'cancelled', finished_at = now() WHERE id = 3")
        assert c.purge(older_than=0) == 3
    assert remaining(db) == set()
