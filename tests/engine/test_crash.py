"""Crashes and races with real processes: SIGKILLed workers, claim races, stale completions.

docs/design.md: Recovery sweep (a crash is not an attempt), Guarantees (two workers
race on one step; a late completion after the sweep), and The completion transaction
(exactly-once effects).
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.dbio import fetch_sync
from cyclone.sql import Q
from cyclone.transitions import claim_stmt
from tests.helpers import kill, poll_until, scalar, start_worker

pytestmark = pytest.mark.slow  # left out of the fast tier (make test-fast)


def _ledger_tables(db: psycopg.Connection[Any]) -> None:
    # No unique constraint: a duplicate commit would show as a second row.
    db.execute("CREATE TABLE ledger (run_id bigint, step_id bigint, item int)")
    db.execute("CREATE TABLE executions (step_id bigint, pid int)")


def test_killed_workers_never_duplicate_effects(dsn: str, db: psycopg.Connection[Any]) -> None:
    """300 ledger jobs; two workers SIGKILLed every second for 15 s and restarted.

    Every run completes with exactly one ledger row, attempt stays 0 (a reclaim is not
    an attempt), and the sweep did reclaim.
    """
    _ledger_tables(db)
    with cyclone.SyncClient(dsn) as producer:
        producer.enqueue_many("ledger_write", [{"item": i} for i in range(300)])
    env = {
        "CYCLONE_TEST_APP_DSN": dsn,
        "CYCLONE_TEST_TTL": "2",
        "CYCLONE_TEST_WORK": "0.4",
        "CYCLONE_TEST_SLOTS": "5",
    }
    app = "tests.apps.ledger:client"
    workers = [start_worker(app, env), start_worker(app, env)]
    try:
        chaos_end = time.monotonic() + 15
        victim = 0
        while time.monotonic() < chaos_end:
            time.sleep(1)  # the chaos schedule: one kill per second
            kill(workers[victim])
            workers[victim] = start_worker(app, env)
            victim = 1 - victim
        poll_until(
            lambda: (
                scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == 300
            ),
            timeout=240,
            interval=0.5,
            what="all 300 runs to complete",
        )
    finally:
        for proc in workers:
            kill(proc)
    assert scalar(db, "SELECT count(*) FROM ledger") == 300
    assert scalar(db, "SELECT count(DISTINCT run_id) FROM ledger") == 300
    assert scalar(db, "SELECT max(attempt) FROM cyclone_steps") == 0
    assert scalar(db, "SELECT sum(reclaims) FROM cyclone_steps") >= 1
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state <> 'completed'") == 0


def _race(dsn: str, rounds: int, barrier: Any, results: Any, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(rounds):
            barrier.wait()
            stmt = claim_stmt(queue=f"race-{i}", kinds=["count_exec"], owner=name, ttl=30, limit=1)
            results.put((i, name, len(fetch_sync(conn, stmt))))


def test_two_clients_race_for_one_step_200_times(dsn: str) -> None:
    """Two processes claim the same available step at the same moment, 200 times."""
    rounds = 200
    with cyclone.SyncClient(dsn) as producer:
        for i in range(rounds):
            producer.enqueue("count_exec", {}, queue=f"race-{i}")
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(dsn, rounds, barrier, results, n)) for n in ("a", "b")]
    for proc in procs:
        proc.start()
    outcomes: dict[int, list[int]] = {}
    for _ in range(2 * rounds):
        i, _name, claimed = results.get(timeout=120)
        outcomes.setdefault(i, []).append(claimed)
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    assert all(sorted(claims) == [0, 1] for claims in outcomes.values()), outcomes
    assert len(outcomes) == rounds


def test_two_worker_processes_run_each_step_exactly_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """200 steps, two worker processes competing: each handler runs exactly once.

    The steps are enqueued once both workers listen, so the one that starts first does
    not run them all before the other is up."""
    _ledger_tables(db)
    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_TTL": "30", "CYCLONE_TEST_SLOTS": "10"}
    workers = [start_worker("tests.apps.ledger:client", env) for _ in range(2)]
    try:
        poll_until(
            lambda: (
                scalar(
                    db,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND application_name = 'cyclone-listen'",
                )
                >= 2
            ),
            timeout=120,
            what="both workers listening",
        )
        with cyclone.SyncClient(dsn) as producer:
            producer.enqueue_many("count_exec", [{}] * 200)
        poll_until(
            lambda: (
                scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == 200
            ),
            timeout=120,
            what="200 completed runs",
        )
    finally:
        for proc in workers:
            kill(proc, signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    assert scalar(db, "SELECT count(*) FROM executions") == 200
    assert scalar(db, "SELECT count(DISTINCT step_id) FROM executions") == 200
    assert scalar(db, "SELECT count(DISTINCT pid) FROM executions") == 2


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_completion_after_reclaim_changes_nothing(
    dsn: str, db: psycopg.Connection[Any], flavour: str
) -> None:
    """A completion arriving after its step was reclaimed and claimed again changes
    nothing, and its business writes roll back with it."""
    import asyncio
    import threading

    db.execute("CREATE TABLE ledger (run_id bigint, step_id bigint, item int)")
    release_first = threading.Event()

    def write(tx: psycopg.Connection[Any], ctx: cyclone.Context) -> None:
        tx.execute(
            "INSERT INTO ledger VALUES (%s, %s, %s)",
            (ctx.run_id, ctx.step_id, ctx.lease_generation),
        )

    if flavour == "sync":

        @cyclone.step("charge")
        def charge(ctx: cyclone.Context, inp: Any) -> int:
            if ctx.lease_generation == 1:
                release_first.wait(60)
            write(ctx.completion_tx(), ctx)
            return ctx.lease_generation

    else:

        @cyclone.step("charge")
        async def charge(ctx: cyclone.Context, inp: Any) -> int:
            if ctx.lease_generation == 1:
                await asyncio.to_thread(release_first.wait, 60)
            tx = await ctx.completion_tx()
            await tx.execute(
                "INSERT INTO ledger VALUES (%s, %s, %s)",
                (ctx.run_id, ctx.step_id, ctx.lease_generation),
            )
            return ctx.lease_generation

    # The first worker's lease is long: no heartbeat interferes within the test.
    first = cyclone.Client(dsn, handlers=[charge], lease_ttl=60, poll_interval=0.1)
    second = cyclone.Client(dsn, handlers=[charge], lease_ttl=60, poll_interval=0.1)
    async with first:
        job = await first.enqueue(charge)
        await asyncio.to_thread(
            poll_until, lambda: scalar(db, "SELECT state FROM cyclone_steps") == "running"
        )
        # Expire the lease by the database clock, then let another client sweep and run it.
        db.execute("UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second'")
        async with second:  # its sweep reclaims the step, its worker runs it again
            run = await second.wait(job, timeout=30)
            assert run.result == 2
        release_first.set()
        worker = first.worker
        assert worker is not None
        await asyncio.to_thread(poll_until, lambda: worker.held == 0, what="stale completion")
    assert db.execute("SELECT item FROM ledger").fetchall() == [(2,)]
    step = db.execute(
        "SELECT state, output, lease_generation, reclaims, attempt FROM cyclone_steps"
    ).fetchone()
    assert step == ("completed", 2, 2, 1, 0)


def test_a_claim_lost_in_a_crash_cannot_be_completed_by_its_old_holder(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A claim undone by the server (a crash of a server run with synchronous_commit
    off, a restore) lets the same generation be issued again, even to the same client.
    Each claim writes its own lease owner, so the first holder's completion still
    changes nothing."""
    from cyclone.dbio import batch_sync
    from cyclone.transitions import complete_stmts, parse_claimed

    with cyclone.SyncClient(dsn) as producer:
        producer.enqueue("count_exec", {})
    with psycopg.connect(dsn, autocommit=True) as conn:

        def claim(owner: str) -> Any:
            stmt = claim_stmt(queue="default", kinds=["count_exec"], owner=owner, ttl=30, limit=1)
            (held,) = parse_claimed(fetch_sync(conn, stmt), "default", owner)
            return held

        first = claim("client-x/1")
        # what a crash before the claim's WAL reached the disk leaves behind
        db.execute(
            "UPDATE cyclone_steps SET state = 'available', lease_owner = NULL, "
            "lease_expiry = NULL, lease_generation = lease_generation - 1"
        )
        second = claim("client-x/2")
        assert first.generation == second.generation
        stale = batch_sync(conn, complete_stmts([(first, '"old"')]), transaction=True)
        fresh = batch_sync(conn, complete_stmts([(second, '"new"')]), transaction=True)
    assert stale.of(Q.steps_complete) == []
    assert len(fresh.of(Q.steps_complete)) == 1
    assert scalar(db, "SELECT output FROM cyclone_steps") == "new"
