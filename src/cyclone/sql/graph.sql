-- The run graph: every statement that moves the steps of a workflow run along its
-- dependency edges. The advance (graph_advance) completes steps and reaches their
-- dependents; graph_expand_fan_outs inserts the item tasks of the fan-out nodes it
-- reached; graph_resolve_discard settles a run after one of its steps is discarded;
-- graph_restore reaches again the steps that resume and operator retry put back. The
-- rules they share (the state a reached node enters, when a wait starts, which
-- dependencies are unmet) are the SQL functions and the view of migration 5
-- (cyclone_reached_state_v1, cyclone_reached_at_v1, cyclone_unmet_deps_v1), written
-- once there. The advance and the expansion, and the restore, return rows of one
-- shape: (id, run_id, run_finished, queues, signals, children, fan_outs), read by
-- cyclone.graph. Each runs under the run row locks of its transaction (runs_lock).


-- fragment: complete_steps_in_v
-- The completion of the steps of a CTE v (id, output, ...): the caller adds the CAS
-- that guards each row, then its RETURNING.
UPDATE cyclone_steps s
SET state = 'completed',
    output = v.output,
    completed_at = statement_timestamp(),
    lease_owner = NULL,
    lease_expiry = NULL
FROM v
WHERE s.id = ANY(ARRAY(SELECT id FROM v))
  AND s.id = v.id


-- name: graph_advance
-- Complete steps of workflow runs, each row guarded by its own CAS; advance their runs;
-- finish every run left with no active step (an item task's completion never finishes
-- one: its fan-out node is still active). Runs under the run row locks (runs_lock), in
-- the completion transaction of held steps (after the handler's completion_tx() writes)
-- or in a scanner's transaction. The completions come as aligned arrays (%(ids)s,
-- %(generations)s, %(owners)s, %(outputs)s, %(waiting)s: graph.Completion): a held step
-- names its lease; a wait completed by a scanner or a signal names instead the waiting
-- state its CAS expects (owner and generation null). A null output is stored as NULL.
-- Advance: a pending dependent of a completed step (idx_deps_depnode) is reached once
-- it has no unmet dependency (cyclone_unmet_deps_v1), counting the steps this statement
-- completes (its snapshot does not show them yet); it enters
-- cyclone_reached_state_v1 (a wait node starts its wait: cyclone_reached_at_v1). A
-- reached fan-out node stays pending: graph_expand_fan_outs, next in the same
-- transaction, inserts its item tasks. The run row lock taken first makes completions
-- of one run take turns, and READ COMMITTED gives this statement a snapshot taken after
-- the lock was granted, so the last parent to complete always sees the others.
-- Every row carries the wakeups for after COMMIT: the queues that received work, and
-- whether a signal wait or a child node was reached or an item task finished (a pass
-- of the wait scanner, fan-out part only for the last).
WITH v AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[], %(owners)s::text[],
                %(outputs)s::jsonb[], %(waiting)s::text[])
        AS v (id, generation, owner, output, waiting)
), done AS (
    -- use: complete_steps_in_v
      AND ((v.waiting IS NULL
            AND (s.state = 'running') IS TRUE
            AND s.lease_owner = v.owner
            AND s.lease_generation = v.generation)
           OR (v.waiting IS NOT NULL AND s.state = v.waiting))
    RETURNING s.id, s.run_id, s.node, s.item_of
), ready AS (
    SELECT DISTINCT c.run_id, c.node
    FROM done
    JOIN cyclone_deps c ON c.run_id = done.run_id AND c.dep_node = done.node
    WHERE NOT EXISTS (
        SELECT 1
        FROM cyclone_unmet_deps_v1 u
        WHERE u.run_id = c.run_id
          AND u.node = c.node
          AND u.dep_step_id NOT IN (SELECT id FROM done))
), advanced AS (
    UPDATE cyclone_steps s
    SET state = cyclone_reached_state_v1(s.kind, r.state),
        scheduled_at = cyclone_reached_at_v1(
            s.kind, r.state, s.wait_for, s.scheduled_at, statement_timestamp())
    FROM ready
    JOIN cyclone_runs r ON r.id = ready.run_id
    WHERE s.run_id = ready.run_id
      AND s.node = ready.node
      AND s.state = 'pending'
      AND s.fan_out_parallel IS NULL
    RETURNING s.queue, s.state
), finished AS (
    -- use: run_completed_by_statement
    -- An item task's completion never finishes its run: its fan-out node stays pending
    -- (or paused) until the fan-out scanner completes it after the last item, and that
    -- completion checks. Skipping the check keeps an item's completion from searching
    -- the run's steps, which a large fan-out makes as many as its items.
    WHERE r.id IN (SELECT run_id FROM done WHERE item_of IS NULL)
      AND (r.state IN ('running', 'paused')) IS TRUE
      AND NOT EXISTS (
          SELECT 1
          FROM cyclone_steps o
          WHERE o.run_id = r.id
            AND o.state NOT IN ('completed', 'discarded', 'cancelled')
            AND o.id NOT IN (SELECT id FROM done))
    RETURNING r.id
)
SELECT done.id, done.run_id, finished.id IS NOT NULL AS run_finished, w.queues, w.signals,
       w.children, w.fan_outs
FROM done
LEFT JOIN finished ON finished.id = done.run_id
CROSS JOIN (
    SELECT (SELECT array_agg(DISTINCT queue) FROM advanced WHERE state = 'available')
               AS queues,
           EXISTS (SELECT 1 FROM advanced WHERE state = 'waiting_signal') AS signals,
           EXISTS (SELECT 1 FROM advanced WHERE state = 'waiting_child') AS children,
           EXISTS (SELECT 1 FROM done WHERE item_of IS NOT NULL) AS fan_outs) AS w;


-- name: graph_expand_fan_outs
-- Runs after graph_advance in the same transaction, for runs with a fan-out node
-- (cyclone_runs.has_fan_out, read under the run row lock): each fan-out node now reached
-- (pending, every dependency completed) that has no item tasks yet gets one per element
-- of its upstream list, the first fan_out_parallel of them runnable (0: all; paused in a
-- paused run). A list longer than fan_out_max_items (when over 0) gets no items: the
-- fan-out scanner discards that node ('fan_out_too_large'). Idempotent: an expanded node
-- has its items (an empty list, or one over the cap, has none and inserts none again).
-- Rows come back per reached node, for the fan-out scanner.
-- It runs at every item completion, so it reads nothing in proportion to the items:
-- the fan-out nodes are found through their input edge (cyclone_deps, dep_node =
-- input_from: the graph's edges, which items have none of), and "no items yet" is the
-- absence of item 0 (the unique (run_id, node); item tasks are inserted all at once
-- and never deleted one by one).
WITH reached AS (
    SELECT f.run_id, f.node, f.kind, f.queue, f.priority, f.max_attempts, f.timeout,
           f.retention, f.fan_out_parallel, f.fan_out_max_items, r.state AS run_state,
           src.output AS over, f.concurrency_key, f.rate_key, f.fairness_key, f.item_keys
    FROM cyclone_deps e
    JOIN cyclone_steps f ON f.run_id = e.run_id AND f.node = e.node
    JOIN cyclone_runs r ON r.id = f.run_id
    JOIN cyclone_steps src ON src.run_id = f.run_id AND src.node = f.input_from
    WHERE e.run_id = ANY(%(fan_out_runs)s::bigint[])
      AND e.dep_node = f.input_from
      AND f.fan_out_parallel IS NOT NULL
      AND f.state IN ('pending', 'paused')
      AND src.state = 'completed'
      AND NOT EXISTS (
          SELECT 1 FROM cyclone_unmet_deps_v1 u WHERE u.run_id = f.run_id AND u.node = f.node)
      AND NOT EXISTS (
          SELECT 1 FROM cyclone_steps i WHERE i.run_id = f.run_id AND i.node = f.node || '[0]')
), expanded AS (
    INSERT INTO cyclone_steps (
        run_id, node, kind, state, input, queue, priority, max_attempts, timeout,
        retention, item_of, item_index, concurrency_key, rate_key, fairness_key)
    SELECT f.run_id, f.node || '[' || (e.ord - 1) || ']', f.kind,
           CASE WHEN f.fan_out_parallel <> 0 AND e.ord > f.fan_out_parallel THEN 'pending'
                WHEN f.run_state = 'paused' THEN 'paused'
                ELSE 'available' END,
           e.value, f.queue, f.priority, f.max_attempts, f.timeout, f.retention, f.node,
           (e.ord - 1)::integer,
           -- a key given as cyclone.ItemKey(field) is read from the item (migration 9)
           coalesce(cyclone_item_key_v1(e.value, f.item_keys ->> 'concurrency_key'),
                    f.concurrency_key),
           coalesce(cyclone_item_key_v1(e.value, f.item_keys ->> 'rate_key'), f.rate_key),
           coalesce(cyclone_item_key_v1(e.value, f.item_keys ->> 'fairness_key'),
                    f.fairness_key)
    FROM reached f,
         jsonb_array_elements(
             CASE WHEN jsonb_typeof(f.over) <> 'array' THEN '[]'::jsonb
                  WHEN coalesce(f.fan_out_max_items, 0) > 0
                       AND jsonb_array_length(f.over) > f.fan_out_max_items THEN '[]'::jsonb
                  ELSE f.over END) WITH ORDINALITY AS e (value, ord)
    RETURNING queue, state
)
SELECT NULL::bigint AS id, NULL::bigint AS run_id, false AS run_finished,
       (SELECT array_agg(DISTINCT queue) FROM expanded WHERE state = 'available') AS queues,
       false AS signals, false AS children, EXISTS (SELECT 1 FROM reached) AS fan_outs;


-- name: graph_restore
-- Resume and operator retry, after they put the steps they restore back to pending (in
-- the same transaction, under the run row lock): every pending step of run %(run_id)s
-- with no unmet dependency (cyclone_unmet_deps_v1) is reached again, as the advance
-- would reach it: cyclone_reached_state_v1 of its kind, a wait starting now
-- (cyclone_reached_at_v1). Item tasks and fan-out nodes stay pending: the fan-out
-- scanner releases the first and completes the second. Any other pending step of a
-- running run has an unmet dependency (the advance reaches each node when its last
-- dependency completes), so only the restored steps change. One row of wakeups, shaped
-- like graph_advance's.
WITH restored AS (
    UPDATE cyclone_steps s
    SET state = cyclone_reached_state_v1(s.kind, r.state),
        scheduled_at = cyclone_reached_at_v1(s.kind, r.state, s.wait_for, s.scheduled_at, now())
    FROM cyclone_runs r
    WHERE r.id = %(run_id)s
      AND s.run_id = r.id
      AND s.state = 'pending'
      AND s.item_of IS NULL
      AND s.fan_out_parallel IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM cyclone_unmet_deps_v1 u WHERE u.run_id = s.run_id AND u.node = s.node)
    RETURNING s.queue, s.state
)
SELECT NULL::bigint AS id, %(run_id)s::bigint AS run_id, false AS run_finished,
       (SELECT array_agg(DISTINCT queue) FROM restored WHERE state = 'available') AS queues,
       EXISTS (SELECT 1 FROM restored WHERE state = 'waiting_signal') AS signals,
       EXISTS (SELECT 1 FROM restored WHERE state = 'waiting_child') AS children,
       false AS fan_outs;


-- name: graph_resolve_discard
-- Failure propagation: resolve the run of the step %(step_id)s just
-- discarded, under the run row lock of the discard transaction. The discard is fatal
-- when the step has no dependents (a leaf: every standalone job) or when any node of
-- its downstream closure declares fail_run (the default): the run becomes failed, at
-- most once (the UPDATE from running finds nothing the second time), and a second
-- UPDATE cancels every other active step. When every downstream node declares
-- cancel_branch, only that closure is cancelled and the run goes on; it completes if
-- nothing active is left. The run fails all the same when its result is lost: the
-- discarded step is the result node (the run's error is then the step's error), or the
-- cancelled closure holds it ("result node cancelled"). A sibling still in its handler learns of a cancel at its next
-- heartbeat; its late completion matches no row.
WITH RECURSIVE discarded AS (
    -- A discarded item task stands for its fan-out node (docs/design.md, Fan-out items).
    SELECT s.run_id, coalesce(s.item_of, s.node) AS node, s.item_of, s.node AS step_node,
           s.error
    FROM cyclone_steps s
    WHERE s.id = %(step_id)s
      AND s.run_id = %(run_id)s
      AND s.state = 'discarded'
), fan_out AS (
    -- The first item discarded discards its fan-out node ...
    UPDATE cyclone_steps f
    SET state = 'discarded',
        error = 'item ' || x.step_node || ' discarded: ' || coalesce(x.error, ''),
        error_kind = 'item_discarded',
        completed_at = now()
    FROM discarded x
    WHERE x.item_of IS NOT NULL
      AND f.run_id = x.run_id
      AND f.node = x.item_of
      AND f.state IN ('pending', 'paused')
    RETURNING f.id
), items AS (
    -- ... and cancels its other active items.
    UPDATE cyclone_steps i
    SET error = 'item ' || x.step_node || ' was discarded',
        error_kind = 'item_discarded',
        -- use: step_cancelled
    FROM discarded x
    WHERE x.item_of IS NOT NULL
      AND i.run_id = x.run_id
      AND i.item_of = x.item_of
      AND i.id <> %(step_id)s
      AND i.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING i.id
), branch (node) AS (
    SELECT c.node
    FROM discarded x
    JOIN cyclone_deps c ON c.run_id = x.run_id AND c.dep_node = x.node
    UNION
    SELECT c.node
    FROM branch b
    JOIN cyclone_deps c ON c.run_id = %(run_id)s AND c.dep_node = b.node
), verdict AS (
    SELECT x.node AS discarded_node,
           (NOT EXISTS (SELECT 1 FROM branch)
            OR EXISTS (
                SELECT 1
                FROM branch b
                JOIN cyclone_steps s ON s.run_id = %(run_id)s AND s.node = b.node
                WHERE s.on_dep_failure IS DISTINCT FROM 'cancel_branch')) AS fatal,
           coalesce(r.result_node = x.node OR r.result_node IN (SELECT node FROM branch), false)
               AS result_lost
    FROM discarded x
    JOIN cyclone_runs r ON r.id = %(run_id)s AND r.state IN ('running', 'paused')
), failed AS (
    UPDATE cyclone_runs r
    SET state = 'failed',
        -- use: run_ended_now
    FROM verdict v
    WHERE r.id = %(run_id)s
      AND r.state IN ('running', 'paused')
      AND (v.fatal OR v.result_lost)
    RETURNING r.id, r.result_node, v.fatal
), cancelled AS (
    UPDATE cyclone_steps s
    SET error = CASE
            WHEN s.node = (SELECT result_node FROM failed WHERE NOT fatal)
                THEN 'result node cancelled'
            WHEN s.node IN (SELECT node FROM branch)
                THEN 'upstream node ' || v.discarded_node || ' was discarded'
            ELSE 'run failed: node ' || v.discarded_node || ' was discarded' END,
        error_kind = CASE
            WHEN s.node = (SELECT result_node FROM failed WHERE NOT fatal)
                THEN 'result_node_cancelled'
            WHEN s.node IN (SELECT node FROM branch) THEN 'dep_discarded'
            ELSE 'run_failed' END,
        -- use: step_cancelled
    FROM verdict v
    WHERE s.run_id = %(run_id)s
      AND s.id <> %(step_id)s
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
      AND (EXISTS (SELECT 1 FROM failed) OR s.node IN (SELECT node FROM branch))
      -- the fan-out node and its items are settled above
      AND NOT EXISTS (
          SELECT 1 FROM discarded x
          WHERE x.item_of IS NOT NULL
            AND (s.node = x.item_of OR s.item_of = x.item_of))
    RETURNING s.id
), finished AS (
    UPDATE cyclone_runs r
    SET state = 'completed',
        -- use: run_ended_now
    FROM verdict v
    WHERE r.id = %(run_id)s
      AND r.state IN ('running', 'paused')
      AND NOT (v.fatal OR v.result_lost)
      AND NOT EXISTS (
          SELECT 1
          FROM cyclone_steps o
          WHERE o.run_id = r.id
            AND o.state NOT IN ('completed', 'discarded', 'cancelled')
            AND o.id NOT IN (SELECT id FROM cancelled)
            AND o.id NOT IN (SELECT id FROM fan_out)
            AND o.id NOT IN (SELECT id FROM items))
    RETURNING r.id
)
SELECT (SELECT count(*) FROM failed) AS runs_failed,
       (SELECT count(*) FROM finished) AS runs_completed,
       (SELECT count(*) FROM cancelled) AS steps_cancelled;
