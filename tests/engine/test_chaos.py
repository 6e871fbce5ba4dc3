"""Chaos: 50 runs of a 20-node workflow with a fan-out, two worker processes SIGKILLed
at random for 20 s, and PostgreSQL itself crashed and restarted once in the middle.

Runs on a server of its own (:mod:`tests.throwaway`), so the other tests never see the
crash. Afterwards every run is completed, every step's ledger row (written in its
completion transaction) exists exactly once, and no step is left running.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import cyclone
from tests.apps.chaos import ITEMS, workflow
from tests.helpers import kill, poll_until, start_worker, worker_log
from tests.throwaway import ThrowawayServer, available

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="no initdb/pg_ctl to make a throwaway server"),
]

RUNS = 50
CHAOS_SECONDS = 20.0


@pytest.fixture
def server() -> Iterator[ThrowawayServer]:
    pg = ThrowawayServer()
    pg.start()
    try:
        yield pg
    finally:
        pg.stop()


def _count(dsn: str, query: str) -> Any:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            row = conn.execute(query).fetchone()
    except psycopg.OperationalError:
        return None  # the server is restarting
    return None if row is None else row[0]


def test_runs_survive_killed_workers_and_a_database_crash(server: ThrowawayServer) -> None:
    dsn = server.dsn
    cyclone.migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (run_id bigint, node text, attempt int)")
    wf = workflow()
    with cyclone.SyncClient(dsn) as producer:
        run_ids = [producer.submit(wf, {"n": i}).run_id for i in range(RUNS)]
    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_WORK": "0.3"}  # ~30 s of work in all
    app = "tests.apps.chaos:client"
    workers = [start_worker(app, env), start_worker(app, env)]
    rng = random.Random(20261130)
    kills = 0
    crashed = False
    began = time.monotonic()
    try:
        while (elapsed := time.monotonic() - began) < CHAOS_SECONDS:
            time.sleep(rng.uniform(0.5, 2.0))
            victim = rng.randrange(len(workers))
            kill(workers[victim])
            kills += 1
            workers[victim] = start_worker(app, env)
            if not crashed and elapsed > CHAOS_SECONDS / 2:
                server.crash_restart()
                crashed = True
        done = _count(dsn, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'")
        assert done is not None and done < RUNS, "the chaos ended after the work: too little"
        poll_until(
            lambda: (
                _count(
                    dsn,
                    "SELECT count(*) FROM cyclone_runs WHERE workflow = 'chaos'"
                    " AND state IN ('completed', 'failed', 'cancelled')",
                )
                == RUNS
            ),
            timeout=180,
            interval=0.5,
            what="every run to finish after the chaos",
        )
    finally:
        logs = "\n".join(worker_log(w)[-3000:] for w in workers)
        for w in workers:
            kill(w)
    assert crashed and kills >= 5
    with psycopg.connect(dsn) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM cyclone_runs WHERE workflow = 'chaos' GROUP BY 1"
            ).fetchall()
        )
        assert states == {"completed": RUNS}, (states, logs)
        steps_per_run = 20 + ITEMS
        per_step = conn.execute(
            "SELECT s.run_id, s.node, count(l.*) FROM cyclone_steps s"
            " LEFT JOIN ledger l ON l.run_id = s.run_id AND l.node = s.node"
            " WHERE s.kind <> '@fanout' AND s.fan_out_parallel IS NULL"
            " GROUP BY s.run_id, s.node"
        ).fetchall()
        assert len(per_step) == RUNS * (steps_per_run - 1)  # the fan-out node writes none
        assert {c for _, _, c in per_step} == {1}, [r for r in per_step if r[2] != 1][:10]
        assert conn.execute("SELECT count(*) FROM ledger").fetchone() == (
            RUNS * (steps_per_run - 1),
        )
        assert conn.execute(
            "SELECT count(*) FROM cyclone_steps WHERE state NOT IN ('completed')"
        ).fetchone() == (0,)
        assert (
            sorted(
                r for (r,) in conn.execute("SELECT id FROM cyclone_runs WHERE workflow = 'chaos'")
            )
            == run_ids
        )
        reclaims = conn.execute("SELECT sum(reclaims) FROM cyclone_steps").fetchone()
    print(
        f"chaos: {kills} worker kills, one database crash, {reclaims[0] if reclaims else 0}"
        " reclaims"
    )
