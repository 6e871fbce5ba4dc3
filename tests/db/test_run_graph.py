"""The shared pieces of the run graph (migration 5) and the statements built on them.

The two functions decide the state and ``scheduled_at`` of a reached node; the view
lists unmet dependencies. Each is checked for its values, then for being inlined into
the statements that use it (EXPLAIN VERBOSE names no function call), then through the
statements: resume and retry reach a restored node exactly as the advance does.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.control import resume_plan
from cyclone.dbio import Stmt, batch_sync, fetch_sync, run_plan_sync
from cyclone.graph import Completion, advance_stmts
from cyclone.sql import Q
from cyclone.transitions import claim_stmt, complete_stmts, parse_claimed
from tests.helpers import scalar

Conn = psycopg.Connection[Any]


@pytest.mark.parametrize(
    ("kind", "run_state", "state"),
    [
        ("send", "running", "available"),
        ("@sleep", "running", "waiting_timer"),
        ("@signal", "running", "waiting_signal"),
        ("@child", "running", "waiting_child"),
        ("send", "paused", "paused"),
        ("@sleep", "paused", "paused"),
        ("@child", "paused", "paused"),
    ],
)
def test_reached_state(db: Conn, kind: str, run_state: str, state: str) -> None:
    """A reached node is parked in a paused run, waits for a wait kind, else is
    available."""
    query = "SELECT cyclone_reached_state_v1(%s, %s)"
    assert scalar(db, query, (kind, run_state)) == state


def test_reached_at_starts_a_wait_only_in_a_running_run(db: Conn) -> None:
    """A sleep or signal wait of a running run starts its wait at ``at``; a parked
    wait and any other node keep their scheduled_at."""
    rows = db.execute(
        """
        SELECT k, s, cyclone_reached_at_v1(k, s, interval '5 seconds',
                                           timestamptz '2026-01-01 00:00:00+00',
                                           timestamptz '2026-06-01 00:00:00+00')
        FROM (VALUES ('@sleep', 'running'), ('@signal', 'running'), ('@sleep', 'paused'),
                     ('@child', 'running'), ('send', 'running')) AS v (k, s)
        """
    ).fetchall()
    got = {(k, s): at.isoformat() for k, s, at in rows}
    assert got == {
        ("@sleep", "running"): "2026-06-01T00:00:05+00:00",
        ("@signal", "running"): "2026-06-01T00:00:05+00:00",
        ("@sleep", "paused"): "2026-01-01T00:00:00+00:00",
        ("@child", "running"): "2026-01-01T00:00:00+00:00",
        ("send", "running"): "2026-01-01T00:00:00+00:00",
    }


@cyclone.step("rg_send")
def send(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


def _diamond() -> cyclone.Workflow:
    wf = cyclone.Workflow("rg_diamond")
    a = wf.node("a", send)
    b = wf.node("b", send, after=[a])
    c = wf.node("c", send, after=[a])
    wf.result(wf.node("d", send, after=[b, c]))
    return wf


def test_unmet_deps_lists_the_edges_whose_upstream_is_not_completed(dsn: str, db: Conn) -> None:
    wf = _diamond()
    with cyclone.SyncClient(dsn, workflows=[wf]) as client:
        run = client.submit(wf, 1)
    rows = db.execute(
        "SELECT node, dep_node FROM cyclone_unmet_deps_v1 WHERE run_id = %s ORDER BY 1, 2",
        (run.run_id,),
    ).fetchall()
    assert rows == [("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")]
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = fetch_sync(
            conn, claim_stmt(queue="default", kinds=["rg_send"], owner="t/1", ttl=60, limit=1)
        )
        batch_sync(
            conn,
            complete_stmts([(parse_claimed(rows, "default", "t/1")[0], "1")]),
            transaction=True,
        )
    rows = db.execute(
        "SELECT node, dep_node FROM cyclone_unmet_deps_v1 WHERE run_id = %s ORDER BY 1, 2",
        (run.run_id,),
    ).fetchall()
    assert rows == [("d", "b"), ("d", "c")]


def _verbose_plan(db: Conn, stmt: Stmt[Any]) -> str:
    with db.transaction(force_rollback=True):
        rows = db.execute(b"EXPLAIN (VERBOSE) " + stmt.sql.encode(), stmt.params).fetchall()
    return "\n".join(row[0] for row in rows)


@pytest.mark.parametrize(
    "stmt",
    [
        advance_stmts([Completion(1, 1, owner="w", generation=1)])[0],
        Stmt(Q.graph_restore, {"run_id": 1}),
        Stmt(Q.graph_expand_fan_outs, {"fan_out_runs": "{1}"}),
    ],
    ids=["graph_advance", "graph_restore", "graph_expand_fan_outs"],
)
def test_the_graph_pieces_are_inlined(db: Conn, stmt: Stmt[Any]) -> None:
    """No call of the migration's functions, and no scan of the view as a whole, is
    left in the plans: the planner wrote them out."""
    text = _verbose_plan(db, stmt)
    assert "cyclone_reached_state_v1" not in text
    assert "cyclone_reached_at_v1" not in text
    assert "cyclone_unmet_deps_v1" not in text
    assert "Function Scan on public.cyclone" not in text


def test_submit_reaches_its_roots_with_the_shared_rule(dsn: str, db: Conn) -> None:
    """Roots enter the state cyclone_reached_state_v1 gives them (a wait root starts
    its wait); every other node is pending."""
    wf = cyclone.Workflow("rg_roots")
    a = wf.node("a", send)
    nap = wf.sleep("nap", 60)
    wf.result(wf.node("z", send, after=[a, nap]))
    with cyclone.SyncClient(dsn, workflows=[wf]) as client:
        run = client.submit(wf, 1)
    rows = dict(
        db.execute(
            "SELECT node, state FROM cyclone_steps WHERE run_id = %s", (run.run_id,)
        ).fetchall()
    )
    assert rows == {"a": "available", "nap": "waiting_timer", "z": "pending"}
    waits = scalar(
        db,
        "SELECT scheduled_at > now() + interval '50 seconds' FROM cyclone_steps"
        " WHERE run_id = %s AND node = 'nap'",
        (run.run_id,),
    )
    assert waits is True


def test_resume_reaches_a_parked_node_as_the_advance_would(dsn: str, db: Conn) -> None:
    """A node the advance parked in a paused run is reached by resume into the state the
    advance would have given it (here a sleep, which starts its wait at the resume),
    and the resume asks for no wakeup: a timer needs none."""
    wf = cyclone.Workflow("rg_parked")
    a = wf.node("a", send)
    wf.result(wf.sleep("nap", 30, after=[a]))
    with cyclone.SyncClient(dsn, workflows=[wf]) as client:
        run = client.submit(wf, 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            rows = fetch_sync(
                conn, claim_stmt(queue="default", kinds=["rg_send"], owner="t/1", ttl=60, limit=1)
            )
            (held,) = parse_claimed(rows, "default", "t/1")
            client.pause(run)
            batch_sync(conn, complete_stmts([(held, "1")]), transaction=True)
            assert (
                scalar(db, "SELECT state FROM cyclone_steps WHERE id = %s", (held.id,))
                == "completed"
            )
            parked = "SELECT state FROM cyclone_steps WHERE run_id = %s AND node = 'nap'"
            assert scalar(db, parked, (run.run_id,)) == "paused"
            with conn.transaction():
                outcome = run_plan_sync(conn, resume_plan(run.run_id))
    state, waits = db.execute(
        "SELECT state, scheduled_at > now() + interval '20 seconds' FROM cyclone_steps"
        " WHERE run_id = %s AND node = 'nap'",
        (run.run_id,),
    ).fetchone() or (None, None)
    assert (state, waits) == ("waiting_timer", True)
    assert not outcome.wakeups
