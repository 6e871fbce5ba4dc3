"""sequence_key: FIFO per key, one active step of a key at a time.

docs/design.md, Jobs: FIFO by (scheduled_at, id) among a key's active steps; a step
waiting out its retry backoff still blocks its key; a finished step frees it.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import psycopg

import cyclone
from cyclone.dbio import batch_sync, fetch_sync
from cyclone.sql import Q
from cyclone.sql.rows import ClaimRow
from cyclone.transitions import claim_stmt, parse_claimed, sequence_recheck_stmts
from tests.helpers import apoll_until, kill, poll_until, scalar, start_worker


def test_two_workers_run_each_key_one_at_a_time_in_order(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """4 keys x 12 steps, two worker processes with 8 slots each: no two steps of a key
    ever overlap, and each key runs in enqueue order."""
    db.execute("CREATE TABLE seq_active (key text PRIMARY KEY, step_id bigint)")
    db.execute("CREATE TABLE seq_overlaps (key text, step_id bigint)")
    db.execute("CREATE TABLE seq_log (id bigserial PRIMARY KEY, key text, position int)")
    keys = ["k0", "k1", "k2", "k3"]
    with cyclone.SyncClient(dsn) as producer:
        for position in range(12):
            for key in keys:
                producer.enqueue("seq_record", {"key": key, "position": position}, sequence_key=key)
    env = {"CYCLONE_TEST_APP_DSN": dsn}
    workers = [start_worker("tests.apps.sequence:client", env) for _ in range(2)]
    try:
        poll_until(
            lambda: scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == 48,
            timeout=120,
            what="48 completed runs",
        )
    finally:
        for proc in workers:
            kill(proc, signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    assert scalar(db, "SELECT count(*) FROM seq_overlaps") == 0
    for key in keys:
        order = [
            r[0]
            for r in db.execute("SELECT position FROM seq_log WHERE key = %s ORDER BY id", (key,))
        ]
        assert order == list(range(12)), key


def test_recheck_leaves_at_most_one_running_step_per_key(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """If two claims of one key both commit (an earlier step committed concurrently with
    the claim of a later one), the recheck under the key lock gives back all but at most
    one, and the head of the key is claimed next."""
    with cyclone.SyncClient(dsn) as producer:
        later = producer.enqueue("seq_record", {"n": "later"}, sequence_key="k")
    claim = claim_stmt(queue="default", kinds=["seq_record"], owner="w1", ttl=30, limit=5)
    with psycopg.connect(dsn, autocommit=True) as w1, psycopg.connect(dsn, autocommit=True) as w2:
        (held_1,) = parse_claimed(fetch_sync(w1, claim), "default", "w1")
        # an earlier step of the key commits, and a racing claimer (whose snapshot did
        # not see the first claim) takes it
        with cyclone.SyncClient(dsn) as producer:
            earlier = producer.enqueue(
                "seq_record", {"n": "earlier"}, sequence_key="k", scheduled_at=_clock(db, "-1 hour")
            )
        db.execute(
            "UPDATE cyclone_steps SET state = 'running', lease_owner = 'w2', "
            "lease_expiry = now() + interval '30 seconds', lease_generation = 1 WHERE id = %s",
            (earlier.step_id,),
        )
        (held_2,) = parse_claimed(
            [
                ClaimRow(*row)
                for row in db.execute(
                    "SELECT s.id, s.run_id, s.node, s.kind, r.input, NULL::text, s.attempt, "
                    "s.max_attempts, s.lease_generation, NULL::float8, s.sequence_key, "
                    "r.workflow, r.def_version, NULL::text, false, NULL::text[], NULL::text[], "
                    "NULL::text[], 0, NULL::text, NULL::text, 0.0::float8, false "
                    "FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id WHERE s.id = %s",
                    (earlier.step_id,),
                ).fetchall()
            ],
            "default",
            "w2",
        )
        assert held_1.id == later.step_id
        released_1 = batch_sync(w1, sequence_recheck_stmts([held_1]), transaction=True).of(
            Q.steps_sequence_release
        )
        released_2 = batch_sync(w2, sequence_recheck_stmts([held_2]), transaction=True).of(
            Q.steps_sequence_release
        )
    running = db.execute("SELECT id FROM cyclone_steps WHERE state = 'running'").fetchall()
    assert released_1 == [(later.step_id,)]  # the later one yields to the earlier
    assert released_2 == []
    assert running == [(earlier.step_id,)]


def _clock(db: psycopg.Connection[Any], shift: str) -> Any:
    return scalar(db, "SELECT now() + %s::interval", (shift,))


async def test_backoff_blocks_the_key_and_other_keys_run(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A failed step waiting out its backoff keeps the next step of its key waiting;
    another key is not held up."""
    ran: list[str] = []

    @cyclone.action("seq_flaky", retry=cyclone.RetryPolicy(base=3600, cap=3600, jitter=0))
    async def seq_flaky(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
        ran.append(inp["name"])
        if inp["name"] == "first":
            raise RuntimeError("try again in an hour")

    async with cyclone.Client(dsn, handlers=[seq_flaky], poll_interval=0.05) as c:
        await c.enqueue(seq_flaky, {"name": "first"}, sequence_key="k")
        second = await c.enqueue(seq_flaky, {"name": "second"}, sequence_key="k")
        other = await c.enqueue(seq_flaky, {"name": "other"}, sequence_key="other")
        await c.wait(other, timeout=30)
        await apoll_until(lambda: asyncio.sleep(0, "first" in ran), what="first attempt")
        worker = c.worker
        assert worker is not None
        claims = worker.claims
        await apoll_until(lambda: asyncio.sleep(0, worker.claims >= claims + 5), what="5 claims")
        state = await c.get_run(second)
    assert state.state == cyclone.RunState.RUNNING
    assert ran.count("second") == 0 and ran.count("first") == 1
    first = db.execute("SELECT state, attempt FROM cyclone_steps ORDER BY id LIMIT 1").fetchone()
    assert first == ("available", 1)


async def test_a_retried_step_keeps_its_place_at_the_head_of_its_key(dsn: str) -> None:
    """A step that failed an attempt (its scheduled_at moved past the next step's) runs
    again first, then the next one: the key neither reorders nor deadlocks."""
    ran: list[tuple[str, int]] = []

    @cyclone.action("seq_retry", retry=cyclone.RetryPolicy(base=0.3, cap=0.3, jitter=0))
    async def seq_retry(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
        ran.append((inp["name"], ctx.attempt))
        if inp["name"] == "first" and ctx.attempt == 0:
            raise RuntimeError("once")

    async with cyclone.Client(dsn, handlers=[seq_retry], poll_interval=0.05) as c:
        first = await c.enqueue(seq_retry, {"name": "first"}, sequence_key="k")
        second = await c.enqueue(seq_retry, {"name": "second"}, sequence_key="k")
        runs = [await c.wait(job, timeout=30) for job in (first, second)]
    assert [r.state for r in runs] == [cyclone.RunState.COMPLETED] * 2
    assert ran == [("first", 0), ("first", 1), ("second", 0)]
