"""History does not slow the hot path: no hot statement reads rows in proportion to it.

A database holds 100,000 terminal runs (jobs completed or failed, and workflow runs of a
finished 10-node chain, all inside their retention), beside the live work of a busy
deployment: a backlog of 3,000 available jobs, 1,500 jobs running, 50 running chains.
Autovacuum is off in that database, so the planner works from statistics taken at one
moment and never refreshed: while the database was empty, after the history was written
but before the live work arrived (a burst after a quiet night), or at the end (current
statistics). Stale statistics are where a planner is most tempted to scan.

Each hot-path statement runs under ``EXPLAIN ANALYZE`` (in a rolled-back transaction),
once with a custom plan (what a connection behind a transaction pooler always gets) and
once with the generic plan of a prepared statement (what a worker's prepared statements
use), and no node of the plan may read more than :data:`MOST_ROWS` rows of an engine
table (rows returned plus rows removed by filters, over all loops), nor discard more
than that many row pairs in a join filter.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from cyclone.dbio import Stmt
from cyclone.graph import expand_stmt
from cyclone.producer import EnqueueRequest, enqueue_many_stmt, enqueue_stmt
from cyclone.snoozing import Snoozed, snooze_limit_stmts, snooze_stmt
from cyclone.sql import Q
from cyclone.sql.rows import SweepRow
from cyclone.transitions import (
    Claimed,
    Failure,
    claim_stmt,
    complete_stmts,
    failure_stmts,
    heartbeat_stmt,
    reclaim_stmts,
    release_stmt,
)
from tests.conftest import create_database, database_dsn, drop_database
from tests.helpers import held_step

pytestmark = pytest.mark.slow  # left out of the fast tier (make test-fast)

HISTORY = 100_000
BACKLOG = 3_000
RUNNING = 1_500
CHAINS = 50
MOST_ROWS = 1_000
"""Rows one plan node may read: far below the history and the backlog."""

_TABLES = (
    "cyclone_runs",
    "cyclone_steps",
    "cyclone_deps",
    "cyclone_step_inputs",
    "cyclone_signals",
    "cyclone_schedules",
    "cyclone_schedule_fires",
)

_FILL = [
    # Terminal jobs: 90 % completed, 10 % failed with a discarded step.
    """
    WITH r AS (
        INSERT INTO cyclone_runs (workflow, def_version, state, input, result_node,
                                  created_at, updated_at, finished_at, retention)
        SELECT 'hot', 'job', CASE WHEN g %% 10 = 0 THEN 'failed' ELSE 'completed' END,
               '{}', 'hot', now() - interval '1 day', now(),
               now() - (g %% 86400) * interval '1 second', interval '7 days'
        FROM generate_series(1, %(jobs)s) g
        RETURNING id, state, finished_at)
    INSERT INTO cyclone_steps (run_id, node, kind, state, queue, attempt, lease_generation,
                               started_at, completed_at, retention, unique_key)
    SELECT id, 'hot', 'hot', CASE WHEN state = 'failed' THEN 'discarded' ELSE 'completed' END,
           'default', 1, 1, finished_at, finished_at, interval '7 days', 'u' || id
    FROM r
    """,
    # Finished workflow runs of a 10-node chain, with their edges and input bindings.
    """
    WITH r AS (
        INSERT INTO cyclone_runs (workflow, def_version, state, result_node, finished_at,
                                  retention)
        SELECT 'chain', 'v1', 'completed', 'n9', now() - interval '1 hour', interval '7 days'
        FROM generate_series(1, %(chains)s)
        RETURNING id),
    s AS (
        INSERT INTO cyclone_steps (run_id, node, kind, state, input_from, completed_at,
                                   retention, output)
        SELECT r.id, 'n' || g, 'hot', 'completed', CASE WHEN g > 0 THEN 'n' || (g - 1) END,
               now(), interval '7 days', '1'
        FROM r, generate_series(0, 9) g
        RETURNING run_id, node, input_from),
    d AS (
        INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
        SELECT run_id, node, input_from, 'data' FROM s WHERE input_from IS NOT NULL)
    INSERT INTO cyclone_step_inputs (run_id, node, slot, dep_node)
    SELECT run_id, node, 0, input_from FROM s WHERE input_from IS NOT NULL
    """,
]

_LIVE = [
    # The backlog and the jobs running under a lease.
    """
    WITH r AS (
        INSERT INTO cyclone_runs (workflow, def_version, input, result_node)
        SELECT 'hot', 'job', '{}', 'hot' FROM generate_series(1, %(backlog)s + %(running)s)
        RETURNING id)
    INSERT INTO cyclone_steps (run_id, node, kind, state, queue, lease_owner, lease_expiry,
                               lease_generation, started_at, heartbeat_at, retention)
    SELECT id, 'hot', 'hot', CASE WHEN n <= %(running)s THEN 'running' ELSE 'available' END,
           'default', CASE WHEN n <= %(running)s THEN 'w/1' END,
           CASE WHEN n <= %(running)s THEN now() + interval '1 hour' END,
           CASE WHEN n <= %(running)s THEN 1 ELSE 0 END, now(), now(), interval '7 days'
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM r) AS numbered
    """,
    # Running chains: n0 running, the rest pending.
    """
    WITH r AS (
        INSERT INTO cyclone_runs (workflow, def_version, result_node)
        SELECT 'chain', 'v1', 'n9' FROM generate_series(1, %(live_chains)s)
        RETURNING id),
    s AS (
        INSERT INTO cyclone_steps (run_id, node, kind, state, input_from, lease_owner,
                                   lease_expiry, lease_generation, started_at)
        SELECT r.id, 'n' || g, 'hot', CASE WHEN g = 0 THEN 'running' ELSE 'pending' END,
               CASE WHEN g > 0 THEN 'n' || (g - 1) END,
               CASE WHEN g = 0 THEN 'w/1' END,
               CASE WHEN g = 0 THEN now() + interval '1 hour' END,
               CASE WHEN g = 0 THEN 1 ELSE 0 END, now()
        FROM r, generate_series(0, 9) g
        RETURNING run_id, node, input_from)
    INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
    SELECT run_id, node, input_from, 'data' FROM s WHERE input_from IS NOT NULL
    """,
]


def _build(admin_dsn: str, template_db: str, *, stats: str) -> Iterator[str]:
    name = create_database(admin_dsn, template=template_db)
    dsn = database_dsn(admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for table in _TABLES:
                conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
            conn.execute("ANALYZE")  # statistics of the empty tables: stale from here on
            history = 0 if stats == "fresh" else HISTORY
            params = {
                "jobs": max(0, history - 10 * 500),
                "chains": 500 if history else 0,
                "backlog": BACKLOG,
                "running": RUNNING,
                "live_chains": CHAINS,
            }
            for statement in _FILL:
                conn.execute(statement, params)
            if stats == "history":
                conn.execute("ANALYZE")  # taken while nothing ran: a burst arrives after it
            for statement in _LIVE:
                conn.execute(statement, params)
            if stats == "current":
                conn.execute("ANALYZE")
        yield dsn
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture(scope="module", params=["empty", "history", "current", "fresh"])
def busy(request: pytest.FixtureRequest, admin_dsn: str, template_db: str) -> Iterator[str]:
    """The DSN of the busy database with a long history, its statistics taken while it
    was empty, after the history was written (before the live work), or at the end;
    or ("fresh") a new deployment's: no history, the live work only, statistics of the
    empty tables (where a planner may think a scan of every row costs less than
    reaching a few by key)."""
    yield from _build(admin_dsn, template_db, stats=request.param)


def _numbered(sql: str) -> tuple[str, list[str]]:
    """``sql`` with its ``%(name)s`` placeholders as ``$n``, and the names in order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), names


def explain(conn: psycopg.Connection[Any], stmt: Stmt[Any], *, generic: bool) -> dict[str, Any]:
    """The ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan of ``stmt`` (its writes rolled back)."""
    params = dict(stmt.params or {})
    with conn.transaction(force_rollback=True):
        if not generic:
            row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + stmt.sql.encode(), params)
            plan = row.fetchone()
        else:
            text, names = _numbered(stmt.sql)
            name = f"probe_{uuid.uuid4().hex[:8]}"
            conn.execute(f"PREPARE {name} AS {text}")
            try:
                conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                args = ", ".join(["%s"] * len(names))
                with psycopg.ClientCursor(conn) as cur:
                    cur.execute(
                        f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({args})",
                        [params[n] for n in names],
                    )
                    plan = cur.fetchone()
            finally:
                conn.execute(f"DEALLOCATE {name}")
    assert plan is not None
    result: dict[str, Any] = plan[0][0]["Plan"]
    return result


def heaviest(plan: dict[str, Any]) -> tuple[int, str]:
    """The most rows any node of ``plan`` read from an engine table, and that node."""
    worst = (0, "")
    loops = max(1, int(plan.get("Actual Loops", 1)))
    read = 0
    if plan.get("Relation Name") in _TABLES:
        read = loops * (
            int(plan.get("Actual Rows", 0))
            + int(plan.get("Rows Removed by Filter", 0))
            + int(plan.get("Rows Removed by Index Recheck", 0))
        )
    read = max(read, loops * int(plan.get("Rows Removed by Join Filter", 0)))
    if read:
        label = " ".join(
            str(plan[k]) for k in ("Node Type", "Relation Name", "Index Name") if k in plan
        )
        worst = (read, label)
    for child in plan.get("Plans", ()):
        worst = max(worst, heaviest(child))
    return worst


def _held(conn: psycopg.Connection[Any], where: str, limit: int = 10) -> list[Claimed]:
    rows = conn.execute(
        "SELECT s.id, s.run_id, s.node, r.def_version FROM cyclone_steps s"
        " JOIN cyclone_runs r ON r.id = s.run_id"
        f" WHERE s.state = 'running' AND {where} ORDER BY s.id LIMIT {limit}"
    ).fetchall()
    return [
        held_step(
            row[0],
            row[1],
            node=row[2],
            kind="hot",
            workflow="chain" if row[3] != "job" else "hot",
            def_version=row[3],
        )
        for row in rows
    ]


def _failure(discard: bool) -> Failure:
    return Failure(error="E", error_kind="exception", panic_stack=None, discard=discard, delay=1)


def _request(many: bool) -> EnqueueRequest:
    return EnqueueRequest.build(
        "hot",
        [{}] * 10 if many else {},
        registry={},
        default_retention=86400.0,
        many=many,
    )


_SCANNER_STATEMENTS = (
    "steps_timers_due",
    "steps_signal_timeouts_due",
    "steps_fan_outs_lock",
    "steps_children_to_start",
    "steps_children_done",
    "steps_orphaned_children",
)


def _scanner(name: str) -> Callable[[], list[Stmt[Any]]]:
    sql = getattr(Q, name)
    return lambda: [Stmt(sql, {"limit": 100})]


def _statements(conn: psycopg.Connection[Any]) -> dict[str, Callable[[], list[Stmt[Any]]]]:
    jobs = _held(conn, "r.def_version = 'job'")
    chain = _held(conn, "r.def_version <> 'job'", limit=3)
    one = jobs[0]
    return {
        "claim": lambda: [
            claim_stmt(queue="default", kinds=["hot"], owner="w/2", ttl=30, limit=10)
        ],
        "claim_one": lambda: [
            claim_stmt(queue="default", kinds=["hot"], owner="w/2", ttl=30, limit=1)
        ],
        "complete_jobs": lambda: complete_stmts([(s, None) for s in jobs]),
        "complete_chain": lambda: complete_stmts([(s, "1") for s in chain]),
        "heartbeat": lambda: [heartbeat_stmt(jobs, ttl=30)],
        "release": lambda: [release_stmt(jobs)],
        "retry": lambda: failure_stmts(one, _failure(False))[0],
        "discard": lambda: failure_stmts(one, _failure(True))[0],
        "snooze": lambda: [snooze_stmt(one, Snoozed(30.0, 100))],
        "snooze_limit": lambda: snooze_limit_stmts(one, Snoozed(30.0, 0)),
        "enqueue": lambda: [enqueue_stmt(_request(False))],
        "enqueue_many": lambda: [enqueue_many_stmt(_request(True))],
        "find_unique": lambda: [Stmt(Q.steps_find_unique, {"kind": "hot", "unique_key": "u5"})],
        "sweep": lambda: [Stmt(Q.steps_sweep_candidates, {"limit": 100})],
        "reclaim": lambda: reclaim_stmts(
            SweepRow(
                one.id,
                one.run_id,
                lease_generation=1,
                reclaims=0,
                timed_out=False,
                node=one.node,
                kind=one.kind,
                queue=one.queue,
            ),
            max_reclaims=3,
        )[0],
        "run_get": lambda: [Stmt(Q.runs_get, {"run_id": one.run_id})],
        "outputs": lambda: [Stmt(Q.steps_outputs, {"run_ids": [chain[0].run_id], "nodes": ["n0"]})],
        "expand": lambda: [expand_stmt({s.run_id for s in chain})],
        "purge": lambda: [Stmt(Q.runs_purge, {"limit": 500})],
        # the wait scanner's passes, several a second on an idle worker
        **{name: _scanner(name) for name in _SCANNER_STATEMENTS},
    }


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
def test_hot_statements_read_no_rows_in_proportion_to_history(busy: str, generic: bool) -> None:
    with psycopg.connect(busy, autocommit=True) as conn:
        failures = []
        for name, build in _statements(conn).items():
            for index, stmt in enumerate(build()):
                if stmt.sql.startswith(("BEGIN", "COMMIT", "SET")):
                    continue
                read, node = heaviest(explain(conn, stmt, generic=generic))
                if read > MOST_ROWS:
                    failures.append(f"{name}[{index}]: {read} rows at {node}")
        assert not failures, "\n".join(failures)


def test_the_probe_sees_a_scan_in_proportion_to_history(
    busy: str, request: pytest.FixtureRequest
) -> None:
    """The measure itself: a statement that reads the history is caught."""
    if request.node.callspec.params["busy"] == "fresh":
        pytest.skip("a fresh database has no history to read")
    with psycopg.connect(busy, autocommit=True) as conn:
        stmt = Stmt(
            Q.runs_list, {"state": "completed", "workflow": "nope", "before_id": None, "limit": 5}
        )
        read, _ = heaviest(explain(conn, stmt, generic=False))
    assert read > MOST_ROWS


def test_a_purge_pass_is_never_jit_compiled(busy: str) -> None:
    """The purge's plan is priced for the history it might walk, above jit_above_cost:
    its transaction turns JIT off first (runs_purge_plan), which compiling it on every
    pass would otherwise cost more than the pass itself."""
    with psycopg.connect(busy, autocommit=True) as conn:
        if not conn.execute("SELECT pg_jit_available()").fetchone()[0]:  # type: ignore[index]
            pytest.skip("this server has no JIT")
        stmt = Stmt(Q.runs_purge, {"limit": 500})
        with conn.transaction(force_rollback=True):
            conn.execute("SET LOCAL jit_above_cost = 0")  # any plan would be compiled
            conn.execute(Q.runs_purge_plan.sql)
            row = conn.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + stmt.sql.encode(), stmt.params)
            plan = row.fetchone()
        assert plan is not None
        assert "JIT" not in plan[0][0]
