-- Read-only statements of the web dashboard (cyclone.dashboard.queries).
--
-- Each page reads through these blocks, with parameters only: nothing of a request
-- reaches the statement text. An optional filter is written `(%(x)s IS NULL OR ...)`;
-- the dashboard's connections never prepare statements on the server, so each
-- statement is planned with its values and a filter left out costs nothing. Ages and
-- durations come back as seconds (float8). The indexes named are those of migrations
-- 1, 3 and 7; tests/dashboard/test_plans.py holds the statements to them.


-- name: dashboard_queue_stats
-- Unfinished work per queue, as cyclone_v_queues counts it, read from the partial
-- indexes of the engine (one arm per state: idx_steps_claim, idx_steps_lease,
-- idx_steps_signal, idx_steps_timer, idx_steps_waiting_child) instead of a scan of
-- every unfinished step; and whether the queue is paused, a paused queue without
-- unfinished work listed too (the last arm, cyclone_queue_pauses: a few rows).
SELECT q.queue,
       sum(q.available)::bigint AS available,
       sum(q.running)::bigint AS running,
       sum(q.waiting)::bigint AS waiting,
       extract(epoch FROM max(q.oldest))::float8 AS oldest_available_age,
       sum(q.expired)::bigint AS expired_leases,
       EXISTS (SELECT 1 FROM cyclone_queue_pauses p WHERE p.queue = q.queue) AS paused
FROM (
    SELECT s.queue, count(*) AS available, 0 AS running, 0 AS waiting,
           max(now() - s.scheduled_at) FILTER (WHERE s.scheduled_at <= now()) AS oldest,
           0 AS expired
    FROM cyclone_steps s WHERE s.state = 'available' GROUP BY s.queue
    UNION ALL
    SELECT s.queue, 0, count(*), 0, NULL, count(*) FILTER (WHERE s.lease_expiry < now())
    FROM cyclone_steps s WHERE s.state = 'running' GROUP BY s.queue
    UNION ALL
    SELECT s.queue, 0, 0, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_signal' GROUP BY s.queue
    UNION ALL
    SELECT s.queue, 0, 0, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_timer' GROUP BY s.queue
    UNION ALL
    SELECT s.queue, 0, 0, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_child' GROUP BY s.queue
    UNION ALL
    SELECT p.queue, 0, 0, 0, NULL, 0
    FROM cyclone_queue_pauses p
) q
GROUP BY q.queue
ORDER BY q.queue;

-- name: dashboard_active_runs
-- How many runs are running and paused (idx_runs_state_id, the active end only).
SELECT count(*) FILTER (WHERE r.state = 'running') AS running,
       count(*) FILTER (WHERE r.state = 'paused') AS paused
FROM cyclone_runs r
WHERE r.state IN ('running', 'paused');


-- name: dashboard_throughput
-- Steps completed and discarded per minute over the last %(minutes)s minutes, by the
-- database clock (idx_steps_completed_brin). Minutes with none are absent.
SELECT extract(epoch FROM date_trunc('minute', s.completed_at))::float8 AS minute,
       count(*) FILTER (WHERE s.state = 'completed') AS completed,
       count(*) FILTER (WHERE s.state = 'discarded') AS failed
FROM cyclone_steps s
WHERE s.completed_at >= date_trunc('minute', now())
                        - (%(minutes)s::int - 1) * interval '1 minute'
GROUP BY 1
ORDER BY 1;

-- name: dashboard_statement_timeout
-- Cancel a dashboard read that runs longer than %(ms)s milliseconds (a session setting
-- of the dashboard's own connections; never set behind a transaction pooler).
SELECT set_config('statement_timeout', %(ms)s::text, false);


-- name: dashboard_now
-- The database clock (ages, due times and the chart's minutes are judged by it).
SELECT now() AS now;


-- name: dashboard_unserved_kinds
-- Kinds with steps claimable for at least %(grace_s)s seconds and no step running:
-- no running worker serves them (a worker claims only the kinds it registers). From
-- the claim index and the lease index (idx_steps_claim, idx_steps_lease).
SELECT a.kind,
       count(*) AS available,
       extract(epoch FROM now() - min(a.scheduled_at))::float8 AS oldest_available_age
FROM cyclone_steps a
WHERE a.state = 'available'
  AND a.scheduled_at <= now() - %(grace_s)s::float8 * interval '1 second'
  AND NOT EXISTS (
      SELECT 1 FROM cyclone_steps r
      WHERE r.state = 'running' AND r.kind = a.kind)
GROUP BY a.kind
ORDER BY a.kind;


-- name: dashboard_recent_failures
-- The latest failed runs with their errors (idx_runs_state_id; the error as
-- cyclone_run_results_v1 gives it, cut to %(chars)s characters).
SELECT f.id, f.workflow, f.finished_at, left(f.error, %(chars)s) AS error
FROM cyclone_run_results_v1 f
WHERE f.state = 'failed'
ORDER BY f.id DESC
LIMIT %(limit)s;


-- fragment: dashboard_run_line
-- A run as a line of the runs list: its error cut to %(chars)s characters, its duration
-- so far (seconds).
SELECT f.id, f.workflow, f.state, f.created_at, f.finished_at, f.submit_key,
       f.parent_run_id, left(f.error, %(chars)s) AS error,
       extract(epoch FROM coalesce(f.finished_at, now()) - f.created_at)::float8
           AS duration
FROM cyclone_run_results_v1 f


-- name: dashboard_runs
-- One page of runs, newest first, below %(before_id)s (keyset paging on the primary
-- key), each filter applied only when given: state (idx_runs_state_id), submit key
-- (idx_runs_submit_key_any), workflow and a creation time from %(since)s on (read
-- along the primary key: the newest runs come first). A failed run's error comes cut
-- to %(chars)s characters.
-- use: dashboard_run_line
WHERE (%(state)s::text IS NULL OR f.state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR f.workflow = %(workflow)s::text)
  AND (%(submit_key)s::text IS NULL OR f.submit_key = %(submit_key)s::text)
  AND (%(since)s::timestamptz IS NULL OR f.created_at >= %(since)s::timestamptz)
  AND (%(before_id)s::bigint IS NULL OR f.id < %(before_id)s::bigint)
ORDER BY f.id DESC
LIMIT %(limit)s;

-- name: dashboard_runs_between
-- dashboard_runs for runs created before %(until)s (and from %(since)s on, when given),
-- in creation order, newest first, from idx_runs_created_brin: a range in the past is
-- found by its block ranges (the primary key follows the creation order only roughly,
-- and the planner cannot know how closely, so it would walk the key down from the
-- newest run). The next page starts below the creation time and id of run
-- %(before_id)s.
-- use: dashboard_run_line
WHERE f.created_at < %(until)s::timestamptz
  AND f.created_at >= coalesce(%(since)s::timestamptz, '-infinity')
  AND (%(before_id)s::bigint IS NULL
       OR (f.created_at, f.id) < (SELECT b.created_at, b.id FROM cyclone_runs b
                                  WHERE b.id = %(before_id)s::bigint))
  AND (%(state)s::text IS NULL OR f.state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR f.workflow = %(workflow)s::text)
  AND (%(submit_key)s::text IS NULL OR f.submit_key = %(submit_key)s::text)
ORDER BY f.created_at DESC, f.id DESC
LIMIT %(limit)s;

-- name: dashboard_run_created
-- When run %(run_id)s was created (the primary key); no row for an unknown run.
SELECT r.created_at FROM cyclone_runs r WHERE r.id = %(run_id)s;


-- name: dashboard_run
-- One run with its error (cut to %(chars)s characters) and its duration so far.
SELECT f.id, f.workflow, f.state, f.def_version, f.submit_key, f.parent_run_id,
       f.parent_node_id, f.created_at, f.updated_at, f.finished_at, f.deadline_at,
       f.paused_at, left(f.error, %(chars)s) AS error,
       extract(epoch FROM coalesce(f.finished_at, now()) - f.created_at)::float8
           AS duration,
       now() AS db_now
FROM cyclone_run_results_v1 f
WHERE f.id = %(run_id)s;


-- name: dashboard_run_steps
-- The steps of one run, item tasks of fan-outs left out, in insertion order
-- (cyclone_steps_run_node_key). Errors come cut to %(chars)s characters; a wait's due
-- time is its scheduled_at (a timer's end, a signal wait's timeout).
SELECT s.id, s.node, s.kind, s.state, s.queue, s.attempt, s.max_attempts, s.reclaims,
       s.created_at, s.scheduled_at, s.started_at, s.completed_at,
       extract(epoch FROM s.completed_at - s.started_at)::float8 AS duration,
       s.lease_owner, s.lease_expiry, s.heartbeat_at,
       left(s.error, %(chars)s) AS error, s.error_kind,
       s.signal_name, s.signal_names, s.wait_count,
       extract(epoch FROM s.wait_for)::float8 AS wait_for,
       s.fan_out_parallel IS NOT NULL AS fan_out, s.child_workflow
FROM cyclone_steps s
WHERE s.run_id = %(run_id)s
  AND s.item_of IS NULL
ORDER BY s.id
LIMIT %(limit)s;


-- name: dashboard_run_items
-- The item tasks of one run's fan-outs, counted per fan-out node and state
-- (idx_steps_items).
SELECT s.item_of, s.state, count(*) AS steps
FROM cyclone_steps s
WHERE s.run_id = %(run_id)s
  AND s.item_of IS NOT NULL
GROUP BY s.item_of, s.state;


-- name: dashboard_run_deps
-- The edges of one run's DAG (the primary key of cyclone_deps).
SELECT d.node, d.dep_node, d.dep_type
FROM cyclone_deps d
WHERE d.run_id = %(run_id)s;


-- name: dashboard_run_children
-- The child runs of one run, by the node that started each (idx_runs_parent).
SELECT c.parent_node_id AS node, c.id, c.state
FROM cyclone_runs c
WHERE c.parent_run_id = %(run_id)s;


-- name: dashboard_run_signals
-- The signals in one run's mailbox per name: received, and not yet consumed
-- (idx_signals_run).
SELECT g.name, count(*) AS received, count(*) FILTER (WHERE g.consumed_by IS NULL) AS unread
FROM cyclone_signals g
WHERE g.run_id = %(run_id)s
GROUP BY g.name;


-- name: dashboard_run_states
-- What a run page refreshes: the run's state and each non-item step's state and
-- attempt, with the item counts of fan-outs as "done/total" per fan-out node.
SELECT r.state AS run_state,
       (SELECT coalesce(jsonb_object_agg(s.node, s.state), '{}'::jsonb)
        FROM cyclone_steps s
        WHERE s.run_id = r.id AND s.item_of IS NULL) AS nodes,
       (SELECT coalesce(jsonb_object_agg(i.item_of, i.done::text || '/' || i.total::text),
                        '{}'::jsonb)
        FROM (SELECT s.item_of, count(*) AS total,
                     count(*) FILTER (WHERE s.state = 'completed') AS done
              FROM cyclone_steps s
              WHERE s.run_id = r.id AND s.item_of IS NOT NULL
              GROUP BY s.item_of) i) AS items
FROM cyclone_runs r
WHERE r.id = %(run_id)s;


-- name: dashboard_step
-- One step of a run, by node, with its values pretty printed and cut to %(chars)s
-- characters, and each value's full length. The input shown is the one steps_list
-- shows: the constant or the run input; for a data edge the upstream output once it
-- exists; for a fan-in nothing (assembled at claim).
SELECT s.id, s.run_id, s.node, s.item_of, s.item_index, s.kind, s.queue, s.state,
       s.attempt, s.max_attempts, s.reclaims, s.error_kind, s.lease_owner, s.lease_expiry,
       s.started_at, s.completed_at,
       left(v.input, %(chars)s) AS input, length(v.input) AS input_chars,
       left(v.output, %(chars)s) AS output, length(v.output) AS output_chars,
       left(s.error, %(chars)s) AS error, length(s.error) AS error_chars,
       left(s.panic_stack, %(chars)s) AS panic_stack,
       length(s.panic_stack) AS panic_stack_chars
FROM cyclone_steps s
JOIN cyclone_runs r ON r.id = s.run_id
CROSS JOIN LATERAL (
    SELECT jsonb_pretty(
               -- use: step_input_shown
           ) AS input,
           jsonb_pretty(s.output) AS output
) v
WHERE s.run_id = %(run_id)s
  AND s.node = %(node)s;


-- name: dashboard_step_value
-- One value of one step in full: %(field)s is input, output, error or panic_stack
-- (JSON values pretty printed). NULL when the step or the value does not exist.
SELECT CASE %(field)s::text
           WHEN 'input' THEN jsonb_pretty(
               -- use: step_input_shown
           )
           WHEN 'output' THEN jsonb_pretty(s.output)
           WHEN 'error' THEN s.error
           WHEN 'panic_stack' THEN s.panic_stack
       END AS value
FROM cyclone_steps s
JOIN cyclone_runs r ON r.id = s.run_id
WHERE s.run_id = %(run_id)s
  AND s.node = %(node)s;


-- name: dashboard_run_items_page
-- One fan-out node's item tasks in item order, from %(from_index)s on
-- (idx_steps_items), errors cut to %(chars)s characters.
SELECT s.id, s.node, s.state, s.item_index, s.attempt, s.reclaims, s.started_at,
       s.completed_at, extract(epoch FROM s.completed_at - s.started_at)::float8 AS duration,
       left(s.error, %(chars)s) AS error
FROM cyclone_steps s
WHERE s.run_id = %(run_id)s
  AND s.item_of = %(item_of)s
  AND s.item_index >= %(from_index)s
ORDER BY s.item_index
LIMIT %(limit)s;


-- name: dashboard_kinds
-- Claimable, running and waiting steps per kind and state, with the oldest claimable
-- age and the expired leases, from the engine's partial indexes as
-- dashboard_queue_stats reads them (pending and paused steps are not counted).
SELECT k.kind, k.state, sum(k.steps)::bigint AS steps,
       extract(epoch FROM max(k.oldest))::float8 AS oldest_available_age,
       sum(k.expired)::bigint AS expired_leases
FROM (
    SELECT s.kind, s.state, count(*) AS steps,
           max(now() - s.scheduled_at) FILTER (WHERE s.scheduled_at <= now()) AS oldest,
           0 AS expired
    FROM cyclone_steps s WHERE s.state = 'available' GROUP BY s.kind, s.state
    UNION ALL
    SELECT s.kind, s.state, count(*), NULL, count(*) FILTER (WHERE s.lease_expiry < now())
    FROM cyclone_steps s WHERE s.state = 'running' GROUP BY s.kind, s.state
    UNION ALL
    SELECT s.kind, s.state, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_signal' GROUP BY s.kind, s.state
    UNION ALL
    SELECT s.kind, s.state, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_timer' GROUP BY s.kind, s.state
    UNION ALL
    SELECT s.kind, s.state, count(*), NULL, 0
    FROM cyclone_steps s WHERE s.state = 'waiting_child' GROUP BY s.kind, s.state
) k
GROUP BY k.kind, k.state
ORDER BY k.kind, k.state;

-- name: dashboard_kinds_finished
-- Steps per kind that completed or were discarded over the last %(minutes)s minutes
-- (idx_steps_completed_brin).
SELECT s.kind,
       count(*) FILTER (WHERE s.state = 'completed') AS completed,
       count(*) FILTER (WHERE s.state = 'discarded') AS failed
FROM cyclone_steps s
WHERE s.completed_at >= now() - %(minutes)s::int * interval '1 minute'
GROUP BY s.kind
ORDER BY s.kind;

-- name: dashboard_workers
-- Workers as the leases of running steps show them (idx_steps_lease): per lease
-- owner, its queues, the leases it holds, its last heartbeat, and its expired leases.
SELECT s.lease_owner AS owner,
       array_agg(DISTINCT s.queue ORDER BY s.queue) AS queues,
       count(*) AS held,
       max(s.heartbeat_at) AS last_heartbeat,
       min(s.lease_expiry) AS next_expiry,
       count(*) FILTER (WHERE s.lease_expiry < now()) AS expired
FROM cyclone_steps s
WHERE s.state = 'running'
GROUP BY s.lease_owner
ORDER BY s.lease_owner;


-- name: dashboard_schedules
-- Every schedule with the state of its last run (the primary key of cyclone_runs).
SELECT c.id, c.kind AS target, c.queue, c.enabled, c.cron_spec AS cron, c.location,
       c.next_run_at, c.last_run_id, lr.state AS last_run_state,
       lr.created_at AS last_run_at, c.last_error, c.consecutive_failures
FROM cyclone_schedules c
LEFT JOIN cyclone_runs lr ON lr.id = c.last_run_id
ORDER BY c.id
LIMIT %(limit)s;
