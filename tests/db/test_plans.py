"""Query plans: the hot statements stay on their indexes (CONTRIBUTING.md, Conventions).

20,000 steps, most of them a backlog of available work (the case where a planner is
most tempted to scan and sort), analysed; EXPLAIN of each statement must name the index
the schema made for it, and never scan cyclone_steps sequentially nor sort it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from cyclone.dbio import Stmt
from cyclone.graph import Completion, advance_stmts
from cyclone.sql import Q
from cyclone.transitions import claim_stmt, heartbeat_stmt
from tests.conftest import create_database, database_dsn, drop_database
from tests.helpers import held_step


def _load_jobs(db: psycopg.Connection[Any]) -> None:
    """20,000 standalone runs, most of their steps a backlog of available work."""
    db.execute(
        """
        WITH r AS (
            INSERT INTO cyclone_runs (workflow, def_version, state, finished_at)
            SELECT 'k', 'job', CASE WHEN g % 10 = 0 THEN 'running' ELSE 'completed' END,
                   CASE WHEN g % 10 <> 0 THEN now() END
            FROM generate_series(1, 20000) g
            RETURNING id)
        INSERT INTO cyclone_steps (run_id, node, kind, state, queue, lease_expiry, timeout,
                                   started_at, unique_key, sequence_key, lease_owner,
                                   completed_at)
        SELECT id, 'k', 'k',
               CASE WHEN id % 10 = 1 THEN 'running'
                    WHEN id % 10 = 2 THEN 'completed' ELSE 'available' END,
               'q' || (id % 4),
               CASE WHEN id % 10 = 1 THEN now() + interval '30 seconds' END,
               CASE WHEN id % 20 = 1 THEN interval '1 minute' END,
               now(),
               'u' || id,
               CASE WHEN id % 3 = 0 THEN 's' || (id % 50) END,
               CASE WHEN id % 10 = 1 THEN 'w' END,
               CASE WHEN id % 10 = 2 THEN now() END
        FROM r
        """
    )
    db.execute("ANALYZE cyclone_steps")
    db.execute("ANALYZE cyclone_runs")


def plan(db: psycopg.Connection[Any], stmt: Stmt[Any]) -> str:
    """The JSON plan text of a statement (run inside a rolled-back transaction)."""
    with db.transaction(force_rollback=True):
        row = db.execute(b"EXPLAIN (FORMAT JSON) " + stmt.sql.encode(), stmt.params).fetchone()
    assert row is not None
    return json.dumps(row[0])


def _nodes(
    node: Any, within: tuple[str, ...] = ()
) -> Iterator[tuple[dict[str, Any], tuple[str, ...]]]:
    """Every node of a JSON plan with the names of the subplans (CTEs) it lies in."""
    if "Subplan Name" in node:
        within = (*within, node["Subplan Name"])
    yield node, within
    for child in node.get("Plans", ()):
        yield from _nodes(child, within)


def test_claim_uses_the_claim_index(loaded: psycopg.Connection[Any]) -> None:
    """The claim reads idx_steps_claim in its order: it never scans cyclone_steps or
    cyclone_runs, and never sorts (the claim of a queue with fairness keys is another
    statement, tests/db/test_flow_plans.py)."""
    text = plan(loaded, claim_stmt(queue="q0", kinds=["k"], owner="w", ttl=30, limit=10))
    assert "idx_steps_claim" in text
    nodes = list(_nodes(json.loads(text)[0]["Plan"]))
    scans = [n.get("Relation Name") for n, _ in nodes if n["Node Type"] == "Seq Scan"]
    assert "cyclone_steps" not in scans and "cyclone_runs" not in scans, scans
    assert not [n for n, _ in nodes if n["Node Type"] in ("Sort", "Incremental Sort")]


def test_sweep_candidates_use_lease_and_timeout_indexes(loaded: psycopg.Connection[Any]) -> None:
    text = plan(loaded, Stmt(Q.steps_sweep_candidates, {"limit": 100}))
    assert "idx_steps_lease" in text and "idx_steps_timeout" in text
    assert "Seq Scan" not in text


def test_heartbeat_reads_held_steps_by_primary_key(loaded: psycopg.Connection[Any]) -> None:
    """One statement renewing 200 leases looks each step up by id, never scans."""
    rows = loaded.execute(
        "SELECT id, run_id FROM cyclone_steps WHERE state = 'running' ORDER BY id LIMIT 200"
    ).fetchall()
    held = [held_step(step_id, run_id, generation=0, queue="q1") for step_id, run_id in rows]
    text = plan(loaded, heartbeat_stmt(held, ttl=30))
    assert "cyclone_steps_pkey" in text
    assert "Seq Scan" not in text


def test_unique_lookup_and_run_listing_use_their_indexes(loaded: psycopg.Connection[Any]) -> None:
    unique = plan(loaded, Stmt(Q.steps_find_unique, {"kind": "k", "unique_key": "u10"}))
    assert "idx_steps_unique_active" in unique
    listing = plan(
        loaded,
        Stmt(Q.runs_list, {"state": "running", "workflow": None, "before_id": None, "limit": 50}),
    )
    assert "Seq Scan" not in listing


def _load_chains(db: psycopg.Connection[Any]) -> None:
    """On top of the jobs: 1,000 workflow runs of a 20-node chain (20,000 edges)."""
    db.execute(
        """
        WITH r AS (
            INSERT INTO cyclone_runs (workflow, def_version, result_node)
            SELECT 'chain', 'v1', 'n19' FROM generate_series(1, 1000)
            RETURNING id),
        s AS (
            INSERT INTO cyclone_steps (run_id, node, kind, state, lease_owner)
            SELECT r.id, 'n' || g, 'k', CASE WHEN g = 0 THEN 'running' ELSE 'pending' END,
                   CASE WHEN g = 0 THEN 'w' END
            FROM r, generate_series(0, 19) g)
        INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
        SELECT r.id, 'n' || g, 'n' || (g - 1), 'data'
        FROM r, generate_series(1, 19) g
        """
    )
    for table in ("cyclone_steps", "cyclone_runs", "cyclone_deps"):
        db.execute(f"ANALYZE {table}")


@pytest.fixture(scope="module")
def _loaded_dbs(admin_dsn: str, template_db: str) -> Iterator[dict[str, str]]:
    """Two databases cloned from the template, loaded once for the module (its tests
    only EXPLAIN, in transactions rolled back): ``jobs`` (the jobs) and ``dag`` (the
    jobs and the chains)."""
    names = {kind: create_database(admin_dsn, template=template_db) for kind in ("jobs", "dag")}
    try:
        for kind, name in names.items():
            with psycopg.connect(database_dsn(admin_dsn, name), autocommit=True) as conn:
                _load_jobs(conn)
                if kind == "dag":
                    _load_chains(conn)
        yield {kind: database_dsn(admin_dsn, name) for kind, name in names.items()}
    finally:
        for name in names.values():
            drop_database(admin_dsn, name)


@pytest.fixture
def loaded(_loaded_dbs: dict[str, str]) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the database of 20,000 analysed standalone runs."""
    with psycopg.connect(_loaded_dbs["jobs"], autocommit=True) as conn:
        yield conn


@pytest.fixture
def dag_loaded(_loaded_dbs: dict[str, str]) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the database of the jobs and 1,000 chains of 20 nodes."""
    with psycopg.connect(_loaded_dbs["dag"], autocommit=True) as conn:
        yield conn


def _first_workflow_step(db: psycopg.Connection[Any]) -> tuple[int, int]:
    row = db.execute(
        "SELECT s.id, s.run_id FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id"
        " WHERE r.workflow = 'chain' AND s.node = 'n0' ORDER BY s.id LIMIT 1"
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def test_advance_and_discard_resolution_use_the_edge_index(
    dag_loaded: psycopg.Connection[Any],
) -> None:
    step_id, run_id = _first_workflow_step(dag_loaded)
    advance = plan(dag_loaded, advance_stmts([Completion(step_id, 0, owner="w", generation=1)])[0])
    assert "idx_deps_depnode" in advance
    assert "Seq Scan" not in advance
    resolve = plan(
        dag_loaded, Stmt(Q.graph_resolve_discard, {"run_id": run_id, "step_id": step_id})
    )
    assert "idx_deps_depnode" in resolve
    assert "Seq Scan" not in resolve


def test_schedule_claim_uses_the_due_index(db: psycopg.Connection[Any]) -> None:
    """5,000 schedules, most not due: the claim reads idx_schedules_due."""
    db.execute(
        "INSERT INTO cyclone_schedules (id, kind, input, cron_spec, location, next_run_at) "
        "SELECT 's' || g, 'k', 'null', '@daily', 'UTC', now() + g * interval '1 minute' "
        "FROM generate_series(1, 5000) g"
    )
    db.execute("ANALYZE cyclone_schedules")
    text = plan(
        db,
        Stmt(
            Q.schedules_claim,
            {"owner": "w", "ttl_us": 30_000_000, "limit": 50, "versions": []},
        ),
    )
    assert "idx_schedules_due" in text
    assert "Seq Scan" not in text


def test_active_child_run_lookups_read_only_active_child_runs(
    db: psycopg.Connection[Any],
) -> None:
    """The orphan backstop (every full scanner pass) and the purge's live-descendant
    guard find active child runs through idx_runs_active_children; the backstop never
    reads the 20,000 finished child runs kept for retention, only the 5 active ones
    (the purge reads its candidates, the terminal runs, by its nature)."""
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version) "
        "SELECT 'k', 'job' FROM generate_series(1, 20000)"
    )
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version, state, finished_at, parent_run_id,"
        " parent_node_id) SELECT 'c', 'v', 'completed', now(), g, 'n'"
        " FROM generate_series(1, 20000) g"
    )
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version, parent_run_id, parent_node_id) "
        "SELECT 'c', 'v', g, 'm' FROM generate_series(1, 5) g"
    )
    db.execute("ANALYZE cyclone_runs")
    for stmt in (
        Stmt(Q.steps_orphaned_children, {"limit": 200}),
        Stmt(Q.runs_purge, {"limit": 500}),
    ):
        with db.transaction(force_rollback=True):
            row = db.execute(
                b"EXPLAIN (ANALYZE, FORMAT JSON) " + stmt.sql.encode(), stmt.params
            ).fetchone()
        assert row is not None
        text = json.dumps(row[0])
        assert "idx_runs_active_children" in text, text
        if stmt.query is Q.steps_orphaned_children:
            removed = [int(n) for n in re.findall(r'"Rows Removed by Filter": (\d+)', text)]
            assert all(n < 100 for n in removed), removed
