-- Statements on cyclone_runs: run locks, run outcomes, inspection.
--
-- Every transaction that changes a run and its steps locks the run rows first, in id
-- order (runs_lock), then the steps. One lock order everywhere means a completion, a
-- discard and a cancel of the same run never deadlock.


-- name: runs_lock
-- Lock run rows in id order for the rest of the transaction.
SELECT id
FROM cyclone_runs
WHERE id = ANY(%(run_ids)s::bigint[])
ORDER BY id
FOR UPDATE;


-- name: runs_submit
-- Submit a workflow run: the run, every step (roots reached: cyclone_reached_state_v1,
-- a wait root starting its wait now; the rest pending), every dependency edge and every
-- input binding (with its input name when named, else NULL), in one statement. %(nodes)s, %(deps)s and
-- %(inputs)s are JSON arrays laid out once per workflow. With a submit_key the run
-- insert yields on idx_runs_submit_key (waiting for a concurrent insert of the key to
-- commit or roll back): then nothing is written and no row comes back. Foreign keys
-- between the new rows are checked at the end of the statement, when all exist.
WITH run AS (
    INSERT INTO cyclone_runs (
        workflow, def_version, input, result_node, submit_key, deadline_at, has_fan_out,
        parent_run_id, parent_node_id, retention, traceparent)
    VALUES (%(workflow)s, %(def_version)s, %(input)s::jsonb, %(result_node)s, %(submit_key)s,
            now() + %(deadline_us)s::bigint * interval '1 microsecond', %(has_fan_out)s,
            %(parent_run_id)s, %(parent_node_id)s,
            %(run_retention_us)s::bigint * interval '1 microsecond', %(traceparent)s)
    ON CONFLICT (workflow, submit_key) WHERE submit_key IS NOT NULL DO NOTHING
    RETURNING id
), steps AS (
    INSERT INTO cyclone_steps (
        run_id, node, kind, state, input, input_from, queue, priority, max_attempts,
        timeout, retention, on_dep_failure, wait_for, signal_name, signal_names, wait_count,
        fan_out_parallel, fan_out_max_bytes, fan_out_max_items, child_workflow,
        child_needs_result, scheduled_at, concurrency_key, rate_key, fairness_key, item_keys)
    SELECT run.id, n.node, n.kind,
           CASE WHEN n.root THEN cyclone_reached_state_v1(n.kind, 'running')
                ELSE 'pending' END,
           n.input, n.input_from, n.queue, n.priority,
           n.max_attempts, n.timeout_us * interval '1 microsecond',
           n.retention_us * interval '1 microsecond', n.on_dep_failure,
           n.wait_for_us * interval '1 microsecond', n.signal_name, n.signal_names,
           n.wait_count, n.fan_out_parallel, n.fan_out_max_bytes, n.fan_out_max_items,
           n.child_workflow, n.child_needs_result,
           CASE WHEN n.root
                THEN cyclone_reached_at_v1(n.kind, 'running',
                                           n.wait_for_us * interval '1 microsecond', now(),
                                           now())
                ELSE now() END,
           n.concurrency_key, n.rate_key, n.fairness_key, n.item_keys
    FROM run,
         ROWS FROM (jsonb_to_recordset(%(nodes)s::jsonb) AS (
             node text, kind text, root boolean, input jsonb, input_from text, queue text,
             priority integer, max_attempts integer, timeout_us bigint, retention_us bigint,
             on_dep_failure text, wait_for_us bigint, signal_name text, signal_names text[],
             wait_count integer, fan_out_parallel integer, fan_out_max_bytes bigint,
             fan_out_max_items integer, child_workflow text, child_needs_result boolean,
             concurrency_key text, rate_key text, fairness_key text, item_keys jsonb))
             WITH ORDINALITY AS n (
             node, kind, root, input, input_from, queue, priority, max_attempts, timeout_us,
             retention_us, on_dep_failure, wait_for_us, signal_name, signal_names, wait_count,
             fan_out_parallel, fan_out_max_bytes, fan_out_max_items, child_workflow,
             child_needs_result, concurrency_key, rate_key, fairness_key, item_keys, ord)
    ORDER BY n.ord
), deps AS (
    INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)
    SELECT run.id, d.node, d.dep_node, d.dep_type
    FROM run, jsonb_to_recordset(%(deps)s::jsonb) AS d (node text, dep_node text, dep_type text)
), bindings AS (
    INSERT INTO cyclone_step_inputs (run_id, node, slot, dep_node, assembly_mode, input_name)
    SELECT run.id, i.node, i.slot, i.dep_node, i.assembly_mode, i.input_name
    FROM run,
         jsonb_to_recordset(%(inputs)s::jsonb)
             AS i (node text, slot integer, dep_node text, assembly_mode text, input_name text)
)
SELECT id FROM run;


-- name: runs_find_submit_key
-- The run that holds (workflow, submit_key): the run a duplicate submit returns, and
-- its def_version ('job' for a standalone job of a kind with the workflow's name).
SELECT id, def_version
FROM cyclone_runs
WHERE workflow = %(workflow)s
  AND submit_key = %(submit_key)s;


-- name: runs_cancel
-- Cancel a run that is not finished, every one of its active steps (a second UPDATE),
-- and, the same way, every unfinished run below it (its child runs, theirs, ...). Runs
-- after runs_lock of the run. No row back: the run is already terminal or absent.
WITH RECURSIVE tree (id) AS (
    SELECT %(run_id)s::bigint
    UNION
    SELECT c.id
    FROM cyclone_runs c
    JOIN tree t ON c.parent_run_id = t.id
), cancelled_run AS (
    UPDATE cyclone_runs
    SET state = 'cancelled',
        -- use: run_ended_now
    WHERE id IN (SELECT id FROM tree)
      AND state IN ('running', 'paused')
    RETURNING id
), cancelled_steps AS (
    UPDATE cyclone_steps s
    SET
        -- use: step_cancelled
    FROM cancelled_run
    WHERE s.run_id = cancelled_run.id
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING s.id
)
SELECT cancelled_run.id AS run_id, (SELECT count(*) FROM cancelled_steps) AS steps_cancelled
FROM cancelled_run
WHERE cancelled_run.id = %(run_id)s;


-- name: runs_cancel_children
-- A run that ends cancels its active child runs in the same transaction, and the same
-- way every active run below them (theirs, ...; idx_runs_parent), with their active
-- steps (error_kind 'parent_ended'). %(ended_runs)s are parent runs this transaction
-- holds (runs_lock, or SKIP LOCKED); a child run of one of them is cancelled when that
-- parent is terminal or gone (rows from before this rule) or when the child node that
-- started it ended without completing (fail-fast, a cancelled branch). Runs after the
-- statements that ended the parents, in their transaction: it sees them. The child runs
-- are locked here in id order, after their parents (a child's id is larger). When the
-- transaction holds several runs, a child's id may fall between two of them, so two
-- such transactions can deadlock; PostgreSQL then fails one, whose statements the
-- engine's loops retry (rare: it takes two multi-run batches over one run tree). Rows
-- shaped like graph_advance's, one per run cancelled (no step id, run_finished true, no
-- wakeups), to announce on cyclone_run_done after the commit. Nothing to cancel costs one index probe per run.
WITH RECURSIVE tree (id) AS (
    SELECT c.id
    FROM cyclone_runs c
    LEFT JOIN cyclone_runs p ON p.id = c.parent_run_id
    LEFT JOIN cyclone_steps n ON n.run_id = c.parent_run_id AND n.node = c.parent_node_id
    WHERE c.parent_run_id = ANY(%(ended_runs)s::bigint[])
      AND (p.id IS NULL
           OR p.state IN ('completed', 'failed', 'cancelled')
           OR n.state IN ('cancelled', 'discarded'))
    UNION
    SELECT c.id
    FROM tree t
    JOIN cyclone_runs c ON c.parent_run_id = t.id
), locked AS MATERIALIZED (
    -- by primary key (= ANY of an array): never a scan of the active runs
    SELECT r.id
    FROM cyclone_runs r
    WHERE r.id = ANY(ARRAY(SELECT id FROM tree))
      AND r.state IN ('running', 'paused')
    ORDER BY r.id
    FOR UPDATE
), cancelled_run AS (
    UPDATE cyclone_runs r
    SET state = 'cancelled',
        -- use: run_ended_now
    FROM locked
    WHERE r.id = locked.id
      AND r.state IN ('running', 'paused')
    RETURNING r.id, r.parent_run_id, r.parent_node_id
), cancelled_steps AS (
    UPDATE cyclone_steps s
    SET error = 'parent ended: node ' || c.parent_node_id || ' of run ' || c.parent_run_id,
        error_kind = 'parent_ended',
        -- use: step_cancelled
    FROM cancelled_run c
    WHERE s.run_id = c.id
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING s.id
)
SELECT NULL::bigint AS id, c.id AS run_id, true AS run_finished, NULL::text[] AS queues,
       false AS signals, false AS children, false AS fan_outs
FROM cancelled_run c
ORDER BY c.id;


-- name: runs_get
-- One run with its result and error (cyclone_run_results_v1, migration 6).
SELECT *
FROM cyclone_run_results_v1
WHERE id = %(run_id)s;


-- name: runs_list
-- Runs with their results and errors (cyclone_run_results_v1), newest first, optionally
-- filtered by state and workflow (idx_runs_state_id), with keyset paging below
-- %(before_id)s.
SELECT *
FROM cyclone_run_results_v1
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;


-- name: runs_fail_deadline
-- The deadline scanner: runs still running past deadline_at (idx_runs_deadline), locked
-- with SKIP LOCKED so scanners in many clients share the work, become failed; a second
-- UPDATE cancels their active steps with error_kind 'deadline'. A step still in its
-- handler learns of it at its next heartbeat.
WITH due AS (
    SELECT id
    FROM cyclone_runs
    WHERE state = 'running'
      AND deadline_at IS NOT NULL
      AND deadline_at <= now()
    ORDER BY deadline_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), failed AS (
    UPDATE cyclone_runs r
    SET state = 'failed',
        -- use: run_ended_now
    FROM due
    WHERE r.id = due.id
      AND r.state = 'running'
    RETURNING r.id
), cancelled AS (
    UPDATE cyclone_steps s
    SET error = 'run deadline passed',
        error_kind = 'deadline',
        -- use: step_cancelled
    FROM failed
    WHERE s.run_id = failed.id
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING s.id
)
SELECT failed.id AS run_id, (SELECT count(*) FROM cancelled) AS steps_cancelled
FROM failed;


-- name: runs_pause
-- docs/design.md, Pause: a running run becomes paused (paused_at = now()); its pending
-- and available steps become paused, so nothing new of it is claimed; running steps finish
-- (their advance parks dependents as paused); waiting steps keep waiting. Runs after
-- runs_lock. No row back: the run is not running.
WITH paused AS (
    UPDATE cyclone_runs
    SET state = 'paused',
        paused_at = now(),
        updated_at = now()
    WHERE id = %(run_id)s
      AND state = 'running'
    RETURNING id
), held AS (
    UPDATE cyclone_steps s
    SET state = 'paused'
    FROM paused
    WHERE s.run_id = paused.id
      AND s.state IN ('pending', 'available')
    RETURNING s.id
)
SELECT paused.id AS run_id, (SELECT count(*) FROM held) AS steps_paused
FROM paused;


-- name: runs_resume
-- docs/design.md, Pause: a paused run runs again; deadline_at and the deadlines of its
-- waiting steps move forward by the pause length; its paused steps go back to pending,
-- and graph_restore, next in the transaction, reaches again those whose parents all
-- completed (a wait node's wait starts then). fan_outs: a fan-out node or item task was
-- restored (the fan-out scanner releases them). Runs after runs_lock. No row back: the
-- run is not paused.
WITH run AS (
    SELECT id, now() - paused_at AS pause
    FROM cyclone_runs
    WHERE id = %(run_id)s
      AND state = 'paused'
), resumed AS (
    UPDATE cyclone_runs r
    SET state = 'running',
        deadline_at = r.deadline_at + run.pause,
        paused_at = NULL,
        updated_at = now()
    FROM run
    WHERE r.id = run.id
    RETURNING r.id
), shifted AS (
    UPDATE cyclone_steps s
    SET scheduled_at = s.scheduled_at + run.pause
    FROM run
    WHERE s.run_id = run.id
      AND s.state IN ('waiting_timer', 'waiting_signal')
    RETURNING s.id
), restored AS (
    UPDATE cyclone_steps s
    SET state = 'pending'
    FROM run
    WHERE s.run_id = run.id
      AND s.state = 'paused'
    RETURNING s.item_of, s.fan_out_parallel
)
SELECT resumed.id AS run_id,
       EXISTS (SELECT 1 FROM restored
               WHERE item_of IS NOT NULL OR fan_out_parallel IS NOT NULL) AS fan_outs
FROM resumed;


-- name: runs_retry
-- docs/design.md, Operator retry: reset the discarded and cancelled steps of a run: all
-- of them, or, for %(node)s, those above and below it and every cancelled step (what the
-- failure cancelled). Reset means pending, attempt and reclaims 0, error and output
-- cleared; graph_restore, next in the transaction, reaches again the reset steps whose
-- parents all completed (available, or its waiting state). The run returns to running,
-- its deadline_at cleared unless a new deadline is given (%(deadline_us)s from now). Nothing is reset when the run is paused
-- (resume it first) or when a discarded step would stay behind (retry it too): a run
-- must not complete around a failure. The child runs of reset child nodes come back
-- (child_runs) to be retried in the same transaction. Runs after runs_lock.
WITH RECURSIVE start (node) AS (
    -- the node, and for an item task its fan-out node (items have no edges)
    SELECT %(node)s::text WHERE %(node)s::text IS NOT NULL
    UNION
    SELECT item_of FROM cyclone_steps
    WHERE run_id = %(run_id)s AND node = %(node)s AND item_of IS NOT NULL
), below (node) AS (
    SELECT node FROM start
    UNION
    SELECT d.node
    FROM below b
    JOIN cyclone_deps d ON d.run_id = %(run_id)s AND d.dep_node = b.node
), above (node) AS (
    SELECT node FROM start
    UNION
    SELECT d.dep_node
    FROM above a
    JOIN cyclone_deps d ON d.run_id = %(run_id)s AND d.node = a.node
), targets AS (
    SELECT s.id, s.node
    FROM cyclone_steps s
    WHERE s.run_id = %(run_id)s
      AND s.state IN ('discarded', 'cancelled')
      AND (%(node)s::text IS NULL
           OR s.state = 'cancelled'
           OR s.node IN (SELECT node FROM below)
           OR s.node IN (SELECT node FROM above)
           OR s.item_of IN (SELECT node FROM below UNION SELECT node FROM above))
), blocked AS (
    SELECT s.node
    FROM cyclone_steps s
    WHERE s.run_id = %(run_id)s
      AND s.state = 'discarded'
      AND s.id NOT IN (SELECT id FROM targets)
), run AS (
    SELECT id, state
    FROM cyclone_runs
    WHERE id = %(run_id)s
), reset AS (
    UPDATE cyclone_steps s
    SET state = 'pending',
        scheduled_at = now(),
        attempt = 0,
        reclaims = 0,
        error = NULL,
        error_kind = NULL,
        panic_stack = NULL,
        output = NULL,
        started_at = NULL,
        completed_at = NULL,
        lease_owner = NULL,
        lease_expiry = NULL
    FROM targets t, run
    WHERE s.id = t.id
      AND run.state <> 'paused'
      AND NOT EXISTS (SELECT 1 FROM blocked)
    RETURNING s.node, s.kind, s.item_of, s.fan_out_parallel
), reopened AS (
    UPDATE cyclone_runs r
    SET state = 'running',
        finished_at = NULL,
        deadline_at = now() + %(deadline_us)s::bigint * interval '1 microsecond',
        updated_at = now()
    WHERE r.id = %(run_id)s
      AND EXISTS (SELECT 1 FROM reset)
    RETURNING r.id
)
SELECT (SELECT count(*) FROM reset) AS steps_reset,
       EXISTS (SELECT 1 FROM reset
               WHERE item_of IS NOT NULL OR fan_out_parallel IS NOT NULL) AS fan_outs,
       (SELECT state FROM run) AS run_state,
       (SELECT array_agg(node ORDER BY node) FROM blocked) AS blocked,
       (%(node)s::text IS NULL OR EXISTS (
           SELECT 1 FROM cyclone_steps WHERE run_id = %(run_id)s AND node = %(node)s))
           AS node_found,
       (SELECT array_agg(c.id ORDER BY c.id)
        FROM reset
        JOIN cyclone_runs c ON c.parent_run_id = %(run_id)s AND c.parent_node_id = reset.node
        WHERE reset.kind = '@child') AS child_runs;


-- name: runs_read_committed
-- The first statement of a transaction on a connection the engine does not configure
-- (a caller's pool): the advance relies on READ COMMITTED.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;


-- name: runs_state
-- The state of one run, to say why an operator call found nothing to change. No row
-- back: no run has that id.
SELECT state
FROM cyclone_runs
WHERE id = %(run_id)s;
