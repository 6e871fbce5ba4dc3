"""Query plans of the dashboard: every page's statements stay on indexes.

On 20,000 runs (about 100,000 steps) and one running 1,000-node run, analysed
(bench/dashboard_data.py, the data set of the speed bench at a fiftieth of its size),
EXPLAIN of each ``dashboard_*`` statement, with the values a page sends, must name the
index made for it and never scan cyclone_runs, cyclone_steps or cyclone_deps
sequentially.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from bench.dashboard_data import load

from cyclone.dbio import Stmt
from cyclone.sql import Q

pytestmark = pytest.mark.slow

BIG_TABLES = ("cyclone_runs", "cyclone_steps", "cyclone_deps")


@pytest.fixture(scope="module")
def loaded(admin_dsn: str, template_db: str) -> Any:
    """A database of its own for the module, loaded once (the data set is read only)."""
    from tests.conftest import create_database, database_dsn, drop_database

    name = create_database(admin_dsn, template=template_db)
    conn = psycopg.connect(database_dsn(admin_dsn, name), autocommit=True)
    big = load(conn, 20_000)
    yield conn, big
    conn.close()
    drop_database(admin_dsn, name)


def plan(db: psycopg.Connection[Any], sql: Any, params: dict[str, Any] | None = None) -> str:
    """The JSON plan of a statement, planned with its values."""
    stmt = Stmt(sql, params)
    row = db.execute(b"EXPLAIN (FORMAT JSON) " + stmt.sql.encode(), stmt.params).fetchone()
    assert row is not None
    return json.dumps(row[0])


def assert_on_index(text: str, *indexes: str) -> None:
    """The plan names every one of ``indexes`` and scans no big table sequentially."""
    for index in indexes:
        assert f'"Index Name": "{index}"' in text, f"{index} not used:\n{text}"
    found = json.loads(text)

    def walk(node: dict[str, Any]) -> None:
        if node.get("Node Type") == "Seq Scan":
            assert node.get("Relation Name") not in BIG_TABLES, f"sequential scan:\n{text}"
        for child in node.get("Plans", []):
            walk(child)

    walk(found[0]["Plan"])


RUNS_ANY = {
    "state": None,
    "workflow": None,
    "since": None,
    "until": None,
    "submit_key": None,
    "before_id": None,
    "limit": 51,
    "chars": 300,
}


def test_overview_statements_use_their_indexes(loaded: Any) -> None:
    db, _ = loaded
    assert_on_index(
        plan(db, Q.dashboard_queue_stats),
        "idx_steps_claim",
        "idx_steps_lease",
        "idx_steps_signal",
        "idx_steps_timer",
        "idx_steps_waiting_child",
    )
    assert_on_index(plan(db, Q.dashboard_active_runs), "idx_runs_state_id")
    assert_on_index(plan(db, Q.dashboard_throughput, {"minutes": 60}), "idx_steps_completed_brin")
    assert_on_index(plan(db, Q.dashboard_unserved_kinds, {"grace_s": 60.0}), "idx_steps_lease")
    assert_on_index(
        plan(db, Q.dashboard_recent_failures, {"chars": 300, "limit": 8}), "idx_runs_state_id"
    )


@pytest.mark.parametrize(
    ("filters", "index"),
    [
        ({}, "cyclone_runs_pkey"),
        ({"before_id": 10_000}, "cyclone_runs_pkey"),
        ({"state": "failed"}, "idx_runs_state_id"),
        ({"workflow": "flow_3"}, "cyclone_runs_pkey"),
        ({"submit_key": "key-1003"}, "idx_runs_submit_key_any"),
        ({"since": "minus 20 days", "until": "minus 19 days"}, "idx_runs_created_brin"),
        ({"since": "minus 20 days"}, "cyclone_runs_pkey"),
        ({"until": "minus 29 days", "state": "failed"}, "idx_runs_created_brin"),
        ({"until": "minus 29 days", "before_id": 100}, "idx_runs_created_brin"),
    ],
)
def test_runs_page_filters_use_their_indexes(
    loaded: Any, filters: dict[str, Any], index: str
) -> None:
    db, _ = loaded
    now = datetime.now(UTC)
    values = {
        k: now - timedelta(days=int(v.split()[1])) if isinstance(v, str) and "minus" in v else v
        for k, v in filters.items()
    }
    ranged = "until" in values
    sql = Q.dashboard_runs_between if ranged else Q.dashboard_runs
    assert_on_index(plan(db, sql, {**RUNS_ANY, **values}), index)


def test_run_page_statements_use_their_indexes(loaded: Any) -> None:
    db, big = loaded
    run = {"run_id": big, "chars": 300}
    assert_on_index(plan(db, Q.dashboard_run, run), "cyclone_runs_pkey")
    assert_on_index(
        plan(db, Q.dashboard_run_steps, {**run, "limit": 5000}), "cyclone_steps_run_node_key"
    )
    assert_on_index(plan(db, Q.dashboard_run_items, run), "idx_steps_items")
    deps = plan(db, Q.dashboard_run_deps, run)  # either index leads with run_id
    assert_on_index(deps)
    assert "cyclone_deps_pkey" in deps or "idx_deps_depnode" in deps
    assert_on_index(plan(db, Q.dashboard_run_children, run), "idx_runs_parent")
    assert_on_index(plan(db, Q.dashboard_run_signals, run), "idx_signals_run")
    assert_on_index(plan(db, Q.dashboard_run_states, run), "cyclone_steps_run_node_key")
    step = {"run_id": big, "node": "L0_1", "chars": 20_000}
    assert_on_index(plan(db, Q.dashboard_step, step), "cyclone_steps_run_node_key")
    assert_on_index(
        plan(db, Q.dashboard_step_value, {"run_id": big, "node": "L0_1", "field": "output"}),
        "cyclone_steps_run_node_key",
    )
    page = {"run_id": big, "item_of": "L0_1", "from_index": 0, "limit": 100, "chars": 300}
    assert_on_index(plan(db, Q.dashboard_run_items_page, page), "idx_steps_items")


def test_other_pages_use_their_indexes(loaded: Any) -> None:
    db, _ = loaded
    assert_on_index(plan(db, Q.dashboard_kinds), "idx_steps_claim", "idx_steps_lease")
    assert_on_index(
        plan(db, Q.dashboard_kinds_finished, {"minutes": 60}), "idx_steps_completed_brin"
    )
    assert_on_index(plan(db, Q.dashboard_workers), "idx_steps_lease")
    assert_on_index(plan(db, Q.dashboard_schedules, {"limit": 100}))
