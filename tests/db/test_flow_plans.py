"""Query plans of flow control: the limited claim, its admission and the fairness claim
stay on their indexes over a large backlog (CONTRIBUTING.md, Conventions).

The database of tests/db/test_plans.py (20,000 steps, most of them available), with
its kind limited, a few hundred steps running under concurrency keys, and a backlog
with fairness keys in one queue; analysed. EXPLAIN of each statement must name the
index made for it and never scan cyclone_steps or cyclone_runs sequentially.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cyclone.dbio import Stmt
from cyclone.sql import Q, claim_limited_sql
from cyclone.transitions import claim_stmt
from tests.conftest import create_database, database_dsn, drop_database
from tests.db.test_plans import _load_jobs, _nodes, plan


@pytest.fixture(scope="module")
def flow_db(admin_dsn: str, template_db: str) -> Iterator[str]:
    """The jobs of test_plans, kind ``k`` limited, running steps keyed by 20 keys, and
    queue ``q2``'s available steps under 50 fairness keys."""
    name = create_database(admin_dsn, template=template_db)
    try:
        dsn = database_dsn(admin_dsn, name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            _load_jobs(conn)
            conn.execute(
                "INSERT INTO cyclone_kind_limits (kind, max_concurrency, rate_count, rate_per,"
                " written_by) VALUES ('k', 5, 100, 1.0, 'test')"
            )
            conn.execute(
                "UPDATE cyclone_steps SET concurrency_key = 't' || (id % 20)"
                " WHERE state = 'running'"
            )
            conn.execute(
                "UPDATE cyclone_steps SET fairness_key = 'f' || (id % 50)"
                " WHERE queue = 'q2' AND state = 'available'"
            )
            conn.execute("ANALYZE")
        yield dsn
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture
def flow(flow_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(flow_db, autocommit=True) as conn:
        yield conn


def _scans(text: str) -> list[str | None]:
    """The relations a plan reads sequentially."""
    nodes = _nodes(json.loads(text)[0]["Plan"])
    return [n.get("Relation Name") for n, _ in nodes if n["Node Type"] == "Seq Scan"]


def test_the_limited_claim_reads_the_claim_and_concurrency_indexes(
    flow: psycopg.Connection[Any],
) -> None:
    """Candidates come from idx_steps_claim; nothing scans the steps or the runs (the
    groups' running steps are read from a partial index of running steps)."""
    params = {"queue": "q0", "kinds": ["k"], "foreign": [], "after": ""}
    text = plan(flow, Stmt(claim_limited_sql(10), params))
    assert "idx_steps_claim" in text
    scans = _scans(text)
    assert "cyclone_steps" not in scans and "cyclone_runs" not in scans, scans


def test_the_admission_reads_steps_by_id_and_groups_by_index(
    flow: psycopg.Connection[Any],
) -> None:
    """The admission of ten steps reads them by primary key, and their groups' running
    steps from a partial index of running steps, never a scan."""
    ids = [
        row[0]
        for row in flow.execute(
            "SELECT id FROM cyclone_steps WHERE state = 'available' AND queue = 'q0'"
            " ORDER BY id LIMIT 10"
        )
    ]
    flow.execute("SELECT set_config('cyclone.claimed', %s::bigint[]::text, false)", [ids])
    flow.execute("SELECT set_config('cyclone.locked', '{}', false)")
    params = {
        "owner": "w",
        "ttl_us": 30_000_000,
        "kinds": ["k"],
        "timeouts_us": [None],
        "latency": False,
    }
    text = plan(flow, Stmt(Q.steps_claim_admit, params))
    assert "cyclone_steps_pkey" in text
    scans = _scans(text)
    assert "cyclone_steps" not in scans and "cyclone_runs" not in scans, scans


def test_the_fair_claim_steps_through_the_fairness_index(flow: psycopg.Connection[Any]) -> None:
    """With fairness keys in the queue, the claim reads each key's head through
    idx_steps_fairness and the steps without a key through idx_steps_claim."""
    flow.execute("DELETE FROM cyclone_kind_limits")
    try:
        stmt = claim_stmt(queue="q2", kinds=["k"], owner="w", ttl=30, limit=10, fair=True)
        text = plan(flow, stmt)
    finally:
        flow.execute(
            "INSERT INTO cyclone_kind_limits (kind, max_concurrency, rate_count, rate_per,"
            " written_by) VALUES ('k', 5, 100, 1.0, 'test')"
        )
    assert "idx_steps_fairness" in text and "idx_steps_claim" in text
    scans = _scans(text)
    assert "cyclone_steps" not in scans and "cyclone_runs" not in scans, scans
