"""A 200-node random DAG run by two worker processes: each step runs exactly once, never
before all its parents completed, and receives its parents' outputs in slot order."""

from __future__ import annotations

import itertools
import json
import signal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import cyclone
from tests.apps.dag import build, node_id
from tests.helpers import kill, poll_until, scalar, start_worker

pytestmark = pytest.mark.slow  # left out of the fast tier (make test-fast)

NODES = 200

_CLAIM_CHECK = """
CREATE TABLE IF NOT EXISTS claimed_early (node text, parent text, parent_state text);
CREATE OR REPLACE FUNCTION record_early_claim() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO claimed_early
    SELECT NEW.node, p.node, p.state
    FROM cyclone_deps d
    JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
    WHERE d.run_id = NEW.run_id AND d.node = NEW.node AND p.state <> 'completed';
    RETURN NEW;
END
$f$;
CREATE OR REPLACE TRIGGER record_early_claim BEFORE UPDATE ON cyclone_steps
    FOR EACH ROW WHEN (OLD.state = 'available' AND NEW.state = 'running')
    EXECUTE FUNCTION record_early_claim();
"""
"""At each claim, in the claim's own transaction, records every parent of the claimed
step that is not completed. The order is read from what the claim's transaction sees,
not from timestamps: ``started_at`` is the claim transaction's start, which under load
can precede a parent's ``completed_at`` although the claim's snapshot, taken later in
that transaction's first statement, already holds the parent's committed completion."""
_names = itertools.count()


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Any]:
    parents = [
        sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4)))) if i else []
        for i in range(NODES)
    ]
    order = draw(st.permutations(range(NODES)))
    control = sorted(draw(st.sets(st.integers(0, NODES - 1), max_size=NODES // 3)))
    return {"parents": parents, "order": order, "control": control}


@settings(
    max_examples=3,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),  # no shrinking: each example starts processes
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=dags())
def test_random_dag_runs_each_step_once_after_its_parents(
    dsn: str, db: psycopg.Connection[Any], spec: dict[str, Any]
) -> None:
    spec["name"] = f"random_{next(_names)}"
    wf = build(spec["name"], spec["parents"], spec["order"], spec["control"])
    db.execute(
        "CREATE TABLE IF NOT EXISTS dag_log (run_id bigint, node text, input jsonb,"
        " waiting_parents int, PRIMARY KEY (run_id, node))"
    )
    db.execute(_CLAIM_CHECK)
    with cyclone.SyncClient(dsn) as producer:
        sub = producer.submit(wf, {"run": "input"})
    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_DAG": json.dumps(spec)}
    workers = [start_worker("tests.apps.dag:client", env) for _ in range(2)]
    try:
        poll_until(
            lambda: (
                scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (sub.run_id,))
                != "running"
            ),
            timeout=240,
            interval=0.2,
            what="the random DAG to finish",
        )
    finally:
        for proc in workers:
            kill(proc, signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
    assert scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (sub.run_id,)) == "completed"
    steps = db.execute(
        "SELECT node, state, attempt, reclaims, started_at, completed_at FROM cyclone_steps"
        " WHERE run_id = %s",
        (sub.run_id,),
    ).fetchall()
    assert len(steps) == NODES
    assert {s[1:4] for s in steps} == {("completed", 0, 0)}
    log = {
        row[0]: row[1:]
        for row in db.execute(
            "SELECT node, input, waiting_parents FROM dag_log WHERE run_id = %s", (sub.run_id,)
        )
    }
    assert len(log) == NODES  # every node's effect committed exactly once
    # claimed only once every parent had committed its completion (see _CLAIM_CHECK)
    assert db.execute("SELECT node, parent, parent_state FROM claimed_early").fetchall() == []
    controlled = set(spec["control"])
    for i, parents in enumerate(spec["parents"]):
        node = node_id(i)
        got, waiting = log[node]
        assert waiting == 0, f"{node} ran while {waiting} parents were not completed"
        if parents and i not in controlled:
            assert got == [node_id(p) for p in parents], node  # slot order
        else:
            assert got == {"run": "input"}, node
