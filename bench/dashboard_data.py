"""A large history for the dashboard's bench and plan tests, written with set-based SQL.

:func:`load` writes ``runs`` runs (with the runs' and steps' timestamps spread over the
last 30 days, oldest first) and about five steps per run: half of the runs are jobs
of one step, half are 9-step chains; most completed, some failed (one step
discarded, the rest cancelled), a few cancelled, some still running (the first step
running or available, the rest pending); one run in ten has a submit key. Then one
running workflow run of ``big_nodes`` nodes in layers of 100, each node after two of
the layer before (its steps, edges and a fan-out node's item tasks), and ``ANALYZE``.

Every row is one a real engine could have written (the tests' transition guard
accepts each insert). Edges are written for the big run and for one chain in five
(8 each): the pages measured read the edges of one run, and the edges of every chain
would only slow the load.
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["BIG_WORKFLOW", "load"]

BIG_WORKFLOW = "bench_big"
"""The workflow name of the big run (``load`` returns its id)."""

_RUNS = """
INSERT INTO cyclone_runs (workflow, def_version, state, input, created_at, updated_at,
                          finished_at, submit_key, retention)
SELECT CASE WHEN g %% 2 = 0 THEN 'job_' || (g / 2 %% 5) ELSE 'flow_' || (g / 2 %% 5) END,
       CASE WHEN g %% 2 = 0 THEN 'job' ELSE 'v1' END,
       CASE WHEN g > %(runs)s - %(running)s THEN 'running'
            WHEN g %% 100 < 4 THEN 'failed'
            WHEN g %% 100 = 4 THEN 'cancelled'
            ELSE 'completed' END,
       jsonb_build_object('n', g),
       t.at, t.at + interval '2 seconds',
       CASE WHEN g > %(runs)s - %(running)s THEN NULL ELSE t.at + interval '2 seconds' END,
       CASE WHEN g %% 10 = 3 THEN 'key-' || g END,
       interval '30 days'
FROM generate_series(1, %(runs)s) g
CROSS JOIN LATERAL (
    SELECT now() - interval '30 days' + (g::float8 / %(runs)s) * interval '30 days'
           - interval '5 seconds' AS at) t
"""

_STEPS = """
INSERT INTO cyclone_steps (run_id, node, kind, state, queue, attempt, max_attempts,
                           scheduled_at, created_at, started_at, completed_at, output,
                           error, error_kind, lease_owner, lease_expiry, heartbeat_at,
                           retention)
SELECT r.id, 'n' || k, CASE WHEN r.def_version = 'job' THEN r.workflow ELSE 'step_' || k END,
       s.state,
       CASE r.id %% 3 WHEN 0 THEN 'default' WHEN 1 THEN 'images' ELSE 'emails' END,
       CASE WHEN s.state = 'discarded' THEN 1 ELSE 0 END, 5,
       r.created_at, r.created_at,
       CASE WHEN s.state IN ('completed', 'discarded', 'running')
            THEN r.created_at + k * interval '100 ms' END,
       CASE WHEN s.state IN ('completed', 'discarded', 'cancelled')
            THEN r.created_at + (k + 1) * interval '100 ms' END,
       CASE WHEN s.state = 'completed' THEN jsonb_build_object('k', k) END,
       CASE WHEN s.state = 'discarded' THEN 'ValueError: bad row ' || r.id END,
       CASE WHEN s.state = 'discarded' THEN 'discard' END,
       CASE WHEN s.state = 'running' THEN 'bench-worker-' || (r.id %% 4) END,
       CASE WHEN s.state = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN s.state = 'running' THEN now() END,
       interval '30 days'
FROM cyclone_runs r
CROSS JOIN LATERAL generate_series(0, CASE WHEN r.def_version = 'job' THEN 0 ELSE 8 END) k
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN r.state = 'completed' THEN 'completed'
        WHEN r.state = 'cancelled' THEN 'cancelled'
        WHEN r.state = 'failed' THEN CASE WHEN k = 0 THEN 'discarded' ELSE 'cancelled' END
        WHEN k = 0 THEN CASE WHEN r.id %% 2 = 0 THEN 'running' ELSE 'available' END
        ELSE 'pending' END AS state) s
WHERE r.workflow <> %(big)s
"""

_EDGES = """
INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
SELECT r.id, 'n' || k, 'n' || (k - 1), 'data'
FROM cyclone_runs r, generate_series(1, 8) k
WHERE r.def_version = 'v1' AND r.id %% 10 = 1
"""

_BIG_RUN = """
INSERT INTO cyclone_runs (workflow, def_version, state, input, has_fan_out)
VALUES (%(big)s, 'big', 'running', '[1, 2, 3]'::jsonb, true)
RETURNING id
"""

_BIG_STEPS = """
INSERT INTO cyclone_steps (run_id, node, kind, state, queue, started_at, completed_at,
                           output, lease_owner, lease_expiry, heartbeat_at,
                           fan_out_parallel)
SELECT %(run_id)s, 'L' || (n / 100) || '_' || (n %% 100), 'big_step',
       CASE WHEN n / 100 < %(done_layers)s THEN 'completed'
            WHEN n / 100 = %(done_layers)s AND n %% 2 = 0 THEN 'running'
            WHEN n / 100 = %(done_layers)s THEN 'available'
            ELSE 'pending' END,
       'default',
       CASE WHEN n / 100 <= %(done_layers)s AND (n / 100 < %(done_layers)s OR n %% 2 = 0)
            THEN now() - interval '10 minutes' + (n / 100) * interval '1 minute' END,
       CASE WHEN n / 100 < %(done_layers)s
            THEN now() - interval '10 minutes' + (n / 100 + 1) * interval '1 minute' END,
       CASE WHEN n / 100 < %(done_layers)s THEN jsonb_build_object('n', n) END,
       CASE WHEN n / 100 = %(done_layers)s AND n %% 2 = 0 THEN 'bench-worker-big' END,
       CASE WHEN n / 100 = %(done_layers)s AND n %% 2 = 0 THEN now() + interval '30 seconds' END,
       CASE WHEN n / 100 = %(done_layers)s AND n %% 2 = 0 THEN now() END,
       CASE WHEN n = 1 THEN 8 END
FROM generate_series(0, %(nodes)s - 1) n
"""

_BIG_ITEMS = """
INSERT INTO cyclone_steps (run_id, node, kind, state, queue, item_of, item_index,
                           started_at, completed_at, output)
SELECT %(run_id)s, 'L0_1[' || i || ']', 'big_item', 'completed', 'default', 'L0_1', i,
       now() - interval '10 minutes', now() - interval '9 minutes', to_jsonb(i)
FROM generate_series(0, %(items)s - 1) i
"""

_BIG_DEPS = """
INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
SELECT DISTINCT %(run_id)s, 'L' || l || '_' || j, 'L' || (l - 1) || '_' || p, 'data'
FROM generate_series(1, %(layers)s - 1) l,
     generate_series(0, 99) j,
     LATERAL (VALUES (j), ((j * 7 + 3) %% 100)) AS parents(p)
WHERE l * 100 + j < %(nodes)s
"""


def load(
    conn: psycopg.Connection[Any],
    runs: int,
    *,
    running: int | None = None,
    big_nodes: int = 1000,
    big_items: int = 500,
) -> int:
    """Write the history described in the module docstring on ``conn`` (autocommit,
    one statement per table); the id of the big run.

    Args:
        runs: runs besides the big one (about ``5 * runs`` steps).
        running: how many of them are still running (default: one in 200).
        big_nodes: nodes of the big run, in layers of 100.
        big_items: item tasks of the big run's one fan-out node.
    """
    running = max(1, runs // 200) if running is None else running
    params: dict[str, Any] = {"runs": runs, "running": running, "big": BIG_WORKFLOW}
    conn.execute(_RUNS, params)
    conn.execute(_STEPS, params)
    conn.execute(_EDGES, params)
    row = conn.execute(_BIG_RUN, params).fetchone()
    assert row is not None
    run_id = int(row[0])
    layers = (big_nodes + 99) // 100
    big = {
        "run_id": run_id,
        "nodes": big_nodes,
        "layers": layers,
        "done_layers": layers // 2,
        "items": big_items,
    }
    conn.execute(_BIG_STEPS, big)
    conn.execute(_BIG_ITEMS, big)
    conn.execute(_BIG_DEPS, big)
    for table in ("cyclone_runs", "cyclone_steps", "cyclone_deps"):
        conn.execute(f"VACUUM ANALYZE {table}")
    return run_id
