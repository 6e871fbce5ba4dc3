"""The cost of a fan-out's statements does not grow with its item count.

A run with a fan-out node of 2,000 items caught mid-run as the fan-out scanner sees it
(half of the items completed, 45 of max_parallel=50 running, the rest pending), then,
in its place, one of 100,000 items, each vacuumed and analysed. Every statement a scanner
pass runs on such a node (lock, state, release) and every statement an item completion
runs (the DAG completion and the expansion after it) is run under
``EXPLAIN (ANALYZE, BUFFERS)``; the shared buffers it touches at 100,000 items must be
within twice those at 2,000. A statement that counts the items, scans them, or reads
the upstream list (100,000 elements, stored out of line) fails this by far.
"""

from __future__ import annotations

from typing import Any

import psycopg

from cyclone.dbio import Stmt
from cyclone.graph import Completion, advance_stmts, expand_stmt
from cyclone.sql import Q
from tests.helpers import scalar

Conn = psycopg.Connection[Any]

BIG, SMALL = 100_000, 2_000
PARALLEL, RUNNING = 50, 45

# A run as submit and expansion lay it out: the upstream step "source" completed with
# the list, the fan-out node "fan" pending (its data edge on "source"), and its item
# tasks fan[0] .. fan[n-1]: the first half completed, the next RUNNING running under a
# lease, the rest pending (waiting for the scanner to release them).
MID_RUN = """
WITH run AS (
    INSERT INTO cyclone_runs (workflow, def_version, has_fan_out)
    VALUES ('cost', 'v1', true)
    RETURNING id
), source AS (
    INSERT INTO cyclone_steps (run_id, node, kind, state, output, completed_at)
    SELECT run.id, 'source', 'k', 'completed',
           (SELECT jsonb_agg(g) FROM generate_series(0, %(n)s - 1) AS g), now()
    FROM run
), node AS (
    INSERT INTO cyclone_steps (run_id, node, kind, state, input_from, fan_out_parallel,
                               fan_out_max_bytes)
    SELECT run.id, 'fan', 'k', 'pending', 'source', %(parallel)s, 0
    FROM run
), edge AS (
    INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
    SELECT run.id, 'fan', 'source', 'data'
    FROM run
), items AS (
    INSERT INTO cyclone_steps (run_id, node, kind, state, input, output, item_of,
                               item_index, attempt, lease_owner, lease_expiry,
                               lease_generation, started_at, completed_at)
    SELECT run.id, 'fan[' || g || ']', 'k', w.state, to_jsonb(g),
           CASE WHEN w.state = 'completed' THEN to_jsonb(g::bigint * g) END, 'fan', g,
           CASE WHEN w.state = 'pending' THEN 0 ELSE 1 END,
           CASE WHEN w.state = 'running' THEN 'w/1' END,
           CASE WHEN w.state = 'running' THEN now() + interval '1 hour' END,
           CASE WHEN w.state = 'pending' THEN 0 ELSE 1 END,
           CASE WHEN w.state <> 'pending' THEN now() END,
           CASE WHEN w.state = 'completed' THEN now() END
    FROM run, generate_series(0, %(n)s - 1) AS g,
         LATERAL (SELECT CASE WHEN g < %(n)s / 2 THEN 'completed'
                              WHEN g < %(n)s / 2 + %(running)s THEN 'running'
                              ELSE 'pending' END AS state) AS w
)
SELECT id FROM run
"""


def mid_run(db: Conn, items: int) -> int:
    """Insert a run whose fan-out node of ``items`` items is mid-run; its id."""
    run_id = scalar(db, MID_RUN, {"n": items, "parallel": PARALLEL, "running": RUNNING})
    assert isinstance(run_id, int)
    return run_id


def shared_buffers(db: Conn, stmt: Stmt[Any]) -> int:
    """Shared buffers (hit + read) the execution of ``stmt`` touched, planning excluded;
    run in a transaction rolled back afterwards."""
    with db.transaction(force_rollback=True):
        row = db.execute(
            b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + stmt.sql.encode(), stmt.params
        ).fetchone()
    assert row is not None
    top = row[0][0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def pass_statements(db: Conn, run_id: int) -> dict[str, Stmt[Any]]:
    """The statements of a scanner pass over the run's fan-out node, and of one of its
    item completions."""
    item = scalar(
        db,
        "SELECT id FROM cyclone_steps WHERE run_id = %s AND item_of = 'fan'"
        " AND state = 'running' ORDER BY item_index LIMIT 1",
        (run_id,),
    )
    return {
        "steps_fan_outs_lock": Stmt(Q.steps_fan_outs_lock, {"limit": 200}),
        "steps_fan_outs_state": Stmt(Q.steps_fan_outs_state, {"run_ids": [run_id]}),
        "steps_release_items": Stmt(
            Q.steps_release_items,
            {"run_id": run_id, "node": "fan", "count": PARALLEL - RUNNING},
        ),
        "graph_advance": advance_stmts([Completion(item, run_id, owner="w/1", generation=1)])[0],
        "graph_expand_fan_outs": expand_stmt([run_id]),
    }


def check_layout(db: Conn, run_id: int) -> None:
    """The measured statements do their work on the layout: the lock takes the run, the
    state reads its node, the release fills the free places in item order, the item
    completion completes its item (all rolled back)."""
    stmts = pass_statements(db, run_id)

    def rows(name: str) -> list[tuple[Any, ...]]:
        return db.execute(stmts[name].sql, stmts[name].params).fetchall()

    with db.transaction(force_rollback=True):
        assert run_id in {row[0] for row in rows("steps_fan_outs_lock")}
        assert [row[2] for row in rows("steps_fan_outs_state")] == ["fan"]
        assert len(rows("steps_release_items")) == PARALLEL - RUNNING
        released = db.execute(
            "SELECT min(item_index), max(item_index) FROM cyclone_steps"
            " WHERE run_id = %s AND item_of = 'fan' AND state = 'available'",
            (run_id,),
        ).fetchone()
        assert released == (BIG // 2 + RUNNING, BIG // 2 + PARALLEL - 1)
        assert len(rows("graph_advance")) == 1


def measure(db: Conn, run_id: int) -> dict[str, int]:
    """Buffers of each statement on ``run_id``."""
    return {name: shared_buffers(db, stmt) for name, stmt in pass_statements(db, run_id).items()}


def vacuum_analyse(db: Conn) -> None:
    """The tables as autovacuum leaves them: statistics current, dead rows gone."""
    for table in ("cyclone_steps", "cyclone_runs", "cyclone_deps"):
        db.execute(f"VACUUM ANALYZE {table}")


def test_pass_and_item_completion_cost_do_not_grow_with_the_item_count(db: Conn) -> None:
    # One run at a time, so that each measure sees one reached fan-out node (the lock
    # takes every run that has one) and statistics of a table holding its items only.
    small = mid_run(db, SMALL)
    vacuum_analyse(db)
    at_small = measure(db, small)
    db.execute("DELETE FROM cyclone_runs WHERE id = %s", (small,))
    big = mid_run(db, BIG)
    vacuum_analyse(db)
    check_layout(db, big)
    at_big = measure(db, big)

    over = {
        name: (at_big[name], at_small[name]) for name in at_big if at_big[name] > 2 * at_small[name]
    }
    assert over == {}, f"buffers at {BIG:,} items vs {SMALL:,} (over 2x): {over}"
