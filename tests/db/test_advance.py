"""The DAG advance under concurrency, on the statements themselves.

Two parents of one node complete in two transactions at once: the one that waits for
the run row lock must see the other's completion and make the child available, even on
a server whose default isolation is REPEATABLE READ (engine transactions pin READ
COMMITTED, so each statement's snapshot follows the lock).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.dbio import batch_sync, fetch_sync
from cyclone.graph import Advanced, parse_advanced
from cyclone.sql import Q
from cyclone.transitions import claim_stmt, complete_stmts, parse_claimed
from tests.helpers import poll_until, scalar


@cyclone.step("adv_p")
async def parent(ctx: cyclone.Context, inp: Any) -> int:
    return 1


def _two_parent_run(dsn: str) -> tuple[int, dict[str, Any]]:
    wf = cyclone.Workflow("two_parents")
    a = wf.node("p1", parent)
    b = wf.node("p2", parent)
    wf.node("child", parent, inputs=[a, b])
    with cyclone.SyncClient(dsn) as producer:
        run_id = producer.submit(wf, None).run_id
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = fetch_sync(
            conn, claim_stmt(queue="default", kinds=["adv_p"], owner="t/1", ttl=60, limit=10)
        )
    return run_id, {s.node: s for s in parse_claimed(rows, "default", "t/1")}


@pytest.mark.parametrize("isolation", ["read committed", "repeatable read"])
def test_last_parent_to_commit_advances_the_child(
    dsn: str, db: psycopg.Connection[Any], isolation: str
) -> None:
    db.execute(f"ALTER DATABASE {db.info.dbname} SET default_transaction_isolation = '{isolation}'")
    run_id, held = _two_parent_run(dsn)
    results: list[Advanced] = []
    with (
        psycopg.connect(dsn, autocommit=True) as first,
        psycopg.connect(dsn, autocommit=True) as second,
    ):
        # The first completion holds the run row lock, its completion done, not committed.
        first.execute("BEGIN")
        for stmt in complete_stmts([(held["p1"], "1")]):
            first.execute(stmt.sql, stmt.params)
        waiter_pid = second.info.backend_pid

        def complete_second() -> None:
            rows = batch_sync(second, complete_stmts([(held["p2"], "2")]), transaction=True)
            results.append(parse_advanced(rows))

        thread = threading.Thread(target=complete_second)
        thread.start()
        poll_until(
            lambda: (
                scalar(
                    db, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (waiter_pid,)
                )
                == "Lock"
            ),
            what="the second completion to wait for the run row lock",
        )
        first.execute("COMMIT")
        thread.join(timeout=30)
    advanced = results[0]
    assert advanced.done == {held["p2"].id} and not advanced.finished
    assert advanced.wakeups.queues == {"default"}
    states = dict(
        db.execute("SELECT node, state FROM cyclone_steps WHERE run_id = %s", (run_id,)).fetchall()
    )
    assert states == {"p1": "completed", "p2": "completed", "child": "available"}


def test_one_batch_completing_both_parents_advances_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    run_id, held = _two_parent_run(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = batch_sync(
            conn, complete_stmts([(held["p1"], "1"), (held["p2"], "2")]), transaction=True
        )
    advanced = parse_advanced(rows)
    assert advanced.done == {held["p1"].id, held["p2"].id} and not advanced.finished
    assert advanced.wakeups.queues == {"default"}
    assert (
        scalar(
            db, "SELECT state FROM cyclone_steps WHERE run_id = %s AND node = 'child'", (run_id,)
        )
        == "available"
    )
    # The run ends with its last step, in the same statement.
    with psycopg.connect(dsn, autocommit=True) as conn:
        (child,) = parse_claimed(
            fetch_sync(
                conn, claim_stmt(queue="default", kinds=["adv_p"], owner="t/2", ttl=60, limit=5)
            ),
            "default",
            "t/2",
        )
        assert child.bindings == (("p1", "tuple"), ("p2", "tuple"))  # resolved by the worker
        rows = batch_sync(conn, complete_stmts([(child, "3")]), transaction=True)
    assert parse_advanced(rows).finished == {run_id}
    assert scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (run_id,)) == "completed"


def test_a_batch_mixing_jobs_and_workflow_steps_completes_both(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    run_id, held = _two_parent_run(dsn)
    with cyclone.SyncClient(dsn) as producer:
        job = producer.enqueue(parent, None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        (claimed_job,) = parse_claimed(
            fetch_sync(
                conn, claim_stmt(queue="default", kinds=["adv_p"], owner="t/3", ttl=60, limit=5)
            ),
            "default",
            "t/3",
        )
        items = [(claimed_job, "7"), (held["p1"], "1"), (held["p2"], "2")]
        stmts = complete_stmts(items)
        assert [s.query for s in stmts[1:]] == [Q.steps_complete, Q.graph_advance]
        advanced = parse_advanced(batch_sync(conn, stmts, transaction=True))
    assert advanced.done == {claimed_job.id, held["p1"].id, held["p2"].id}
    assert advanced.finished == {job.run_id} and advanced.wakeups.queues == {"default"}
    assert (
        scalar(
            db, "SELECT state FROM cyclone_steps WHERE run_id = %s AND node = 'child'", (run_id,)
        )
        == "available"
    )
