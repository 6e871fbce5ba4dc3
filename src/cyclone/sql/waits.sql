-- Statements of the wait scanner on cyclone_steps (cyclone.scanners): due timers and
-- signal timeouts, the discard of a wait it gives up on, fan-out nodes and their items,
-- child nodes and their child runs. Each reads runs it locks with SKIP LOCKED, so the
-- scanners of many clients share the work; every change is a CAS on the state the
-- step waits in. The conventions of steps.sql hold here too.


-- fragment: due_wait_of_running_run
-- The start of a wait scanner's read: steps s of runs r, among the due waits t (the
-- caller adds the WHERE that picks them, on their index) of running runs.
FROM cyclone_runs r
JOIN cyclone_steps s ON s.run_id = r.id
WHERE s.id IN (
    SELECT t.id
    FROM cyclone_steps t
    JOIN cyclone_runs tr ON tr.id = t.run_id


-- fragment: due_waits_runs_locked
-- The end of that read: the earliest due first, up to %(limit)s; their runs locked in
-- id order, skipping those another transaction holds.
    ORDER BY t.scheduled_at
    LIMIT %(limit)s)
  AND r.state = 'running'
ORDER BY r.id
FOR UPDATE OF r SKIP LOCKED


-- name: steps_timers_due
-- The wait scanner's timers: lock the runs of due timer steps (idx_steps_timer), skipping
-- runs another transaction holds; the steps come back to be completed in this
-- transaction (graph_advance, CAS on waiting_timer).
SELECT s.id, s.run_id
-- use: due_wait_of_running_run
    WHERE t.state = 'waiting_timer' AND t.scheduled_at <= now() AND tr.state = 'running'
-- use: due_waits_runs_locked
;


-- name: steps_signal_timeouts_due
-- The wait scanner's signal timeouts: lock the runs of signal waits past their timeout
-- (idx_steps_signal_timeout), skipping runs another transaction holds.
SELECT s.id, s.run_id, s.node, extract(epoch FROM s.wait_for)::float8 AS wait_for_s
-- use: due_wait_of_running_run
    WHERE t.state = 'waiting_signal' AND t.wait_for IS NOT NULL AND t.scheduled_at <= now()
      AND tr.state = 'running'
-- use: due_waits_runs_locked
;


-- name: steps_discard_waiting
-- A step the wait scanner gives up on is discarded, CAS on the state it waits in
-- (%(waiting)s): a signal wait whose timeout passed (waiting_signal), a fan-out node
-- whose input is refused or whose collected output is over max_bytes (pending, a
-- fan-out node), a child node whose child run failed or was cancelled or whose input
-- cannot be built (waiting_child). graph_resolve_discard follows in the same
-- transaction.
UPDATE cyclone_steps
SET state = 'discarded',
    error = %(error)s,
    error_kind = %(error_kind)s,
    completed_at = now()
WHERE id = %(id)s
  AND state = %(waiting)s::text
  AND (state <> 'waiting_signal' OR (wait_for IS NOT NULL AND scheduled_at <= now()))
  AND (state <> 'pending' OR fan_out_parallel IS NOT NULL)
RETURNING id, run_id, node, kind, queue;


-- name: steps_fan_outs_lock
-- The fan-out scanner: lock (skipping those another transaction holds) running runs
-- with a reached fan-out node (pending, every dependency completed; idx_steps_fan_out).
SELECT r.id
FROM cyclone_runs r
WHERE r.id IN (
    SELECT f.run_id
    FROM cyclone_steps f
    JOIN cyclone_runs fr ON fr.id = f.run_id
    WHERE f.fan_out_parallel IS NOT NULL
      AND f.state = 'pending'
      AND (fr.state = 'running') IS TRUE
      AND NOT EXISTS (
          SELECT 1
          FROM cyclone_deps d
          JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
          WHERE d.run_id = f.run_id AND d.node = f.node AND p.state <> 'completed')
    ORDER BY f.id
    LIMIT %(limit)s)
  AND (r.state = 'running') IS TRUE
ORDER BY r.id
FOR UPDATE SKIP LOCKED;


-- name: steps_fan_outs_state
-- The reached fan-out nodes of locked runs, read at a cost bounded by max_parallel, not
-- by the node's item count. Every probe of the items is an equality or range on the
-- leading columns of idx_steps_items (run_id, item_of, state, item_index) with an ORDER
-- BY that the index answers, so that it reads only the entries it returns and no plan
-- that scans the items (a sequential scan hoping to meet a match soon) is cheaper:
-- "expanded": the node has items (its item 0, by the unique (run_id, node), as item
-- tasks are inserted all at once and never deleted one by one); "active": its
-- available and running items, counted up to fan_out_parallel (not when it is 0, which
-- needs no room); "unfinished": an item not completed exists, found as the first entry
-- after or before the state 'completed' in the index, never visiting the completed
-- ones. The upstream output (a list that may be large, stored out of line) is read only
-- for a node without items: its JSON type and length, to judge a list that is not a
-- list, longer than fan_out_max_items, or empty. An expanded node never reads it again.
SELECT f.id, f.run_id, f.node, f.fan_out_parallel, f.fan_out_max_bytes,
       f.fan_out_max_items, i0.id IS NOT NULL AS expanded,
       CASE WHEN i0.id IS NULL THEN jsonb_typeof(src.output) END AS over_type,
       CASE WHEN i0.id IS NULL AND jsonb_typeof(src.output) = 'array'
            THEN jsonb_array_length(src.output) END AS over_length,
       CASE WHEN i0.id IS NOT NULL AND f.fan_out_parallel > 0 THEN
                (SELECT count(*) FROM (
                     SELECT 1 FROM cyclone_steps i
                     WHERE i.run_id = f.run_id AND i.item_of = f.node
                       AND i.state = 'available'
                     ORDER BY i.item_index
                     LIMIT f.fan_out_parallel) AS a)
                + (SELECT count(*) FROM (
                     SELECT 1 FROM cyclone_steps i
                     WHERE i.run_id = f.run_id AND i.item_of = f.node
                       AND i.state = 'running'
                     ORDER BY i.item_index
                     LIMIT f.fan_out_parallel) AS r)
            ELSE 0 END AS active,
       i0.id IS NOT NULL
           AND ((SELECT i.state FROM cyclone_steps i
                 WHERE i.run_id = f.run_id AND i.item_of = f.node AND i.state > 'completed'
                 ORDER BY i.state, i.item_index
                 LIMIT 1) IS NOT NULL
                OR (SELECT i.state FROM cyclone_steps i
                    WHERE i.run_id = f.run_id AND i.item_of = f.node
                      AND i.state < 'completed'
                    ORDER BY i.state, i.item_index
                    LIMIT 1) IS NOT NULL) AS unfinished
FROM cyclone_steps f
JOIN cyclone_steps src ON src.run_id = f.run_id AND src.node = f.input_from
LEFT JOIN cyclone_steps i0 ON i0.run_id = f.run_id AND i0.node = f.node || '[0]'
WHERE f.run_id = ANY(%(run_ids)s::bigint[])
  AND f.fan_out_parallel IS NOT NULL
  AND f.state = 'pending'
  AND src.state = 'completed'
  AND NOT EXISTS (
      SELECT 1
      FROM cyclone_deps d
      JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
      WHERE d.run_id = f.run_id AND d.node = f.node AND p.state <> 'completed');


-- name: steps_release_items
-- Release up to %(count)s pending items of a fan-out node, in item order (NULL: all of
-- them). It reads only the entries it releases (idx_steps_items, in item_index order
-- under the equality on run_id, item_of and state), never counting the others.
UPDATE cyclone_steps s
SET state = 'available'
WHERE s.id IN (
    SELECT i.id
    FROM cyclone_steps i
    WHERE i.run_id = %(run_id)s AND i.item_of = %(node)s AND i.state = 'pending'
    ORDER BY i.item_index
    LIMIT %(count)s)
  AND s.state = 'pending'
RETURNING s.queue;


-- name: steps_fan_out_collect
-- The items' outputs of a fan-out node in item order, and their size in bytes.
SELECT coalesce(jsonb_agg(i.output ORDER BY i.item_index), '[]'::jsonb)::text AS output
FROM cyclone_steps i
WHERE i.run_id = %(run_id)s
  AND i.item_of = %(node)s;


-- name: steps_children_to_start
-- The child scanner: child nodes reached (waiting_child, idx_steps_waiting_child) with
-- no child run yet, in running runs locked with SKIP LOCKED; with what their input is
-- made of (as steps_claim returns it), and the parent run's trace context, which the
-- child run carries.
SELECT s.id, s.run_id, s.node, r.def_version, b.binding_nodes, b.binding_modes,
       b.binding_names, s.input_from, coalesce(s.input, r.input) AS input, r.traceparent
FROM cyclone_runs r
JOIN cyclone_steps s ON s.run_id = r.id
CROSS JOIN LATERAL (
    -- use: step_bindings
    WHERE i.run_id = s.run_id AND i.node = s.node) b
WHERE s.state = 'waiting_child'
  AND (r.state = 'running') IS TRUE
  AND NOT EXISTS (
      SELECT 1 FROM cyclone_runs c
      WHERE c.parent_run_id = s.run_id AND c.parent_node_id = s.node)
ORDER BY s.id
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;


-- name: steps_children_done
-- The child scanner: child nodes whose child run is finished (idx_runs_parent), in
-- running runs locked with SKIP LOCKED, with the child's result and error.
SELECT s.id, s.run_id, s.node, s.child_needs_result, c.id AS child_id, c.state,
       (SELECT o.output::text FROM cyclone_steps o
        WHERE o.run_id = c.id AND o.node = c.result_node) AS result,
       (SELECT e.error FROM cyclone_steps e
        WHERE e.run_id = c.id AND e.error IS NOT NULL AND e.state IN ('discarded', 'cancelled')
        ORDER BY e.state DESC, e.completed_at, e.id LIMIT 1) AS error
FROM cyclone_runs r
JOIN cyclone_steps s ON s.run_id = r.id
JOIN cyclone_runs c ON c.parent_run_id = s.run_id AND c.parent_node_id = s.node
WHERE s.state = 'waiting_child'
  AND (r.state = 'running') IS TRUE
  AND (c.state IN ('completed', 'failed', 'cancelled')) IS TRUE
ORDER BY s.id
LIMIT %(limit)s
FOR UPDATE OF r SKIP LOCKED;


-- name: steps_orphaned_children
-- A backstop for child runs left active when their parent ended (rows written before a
-- parent cancelled its children on ending, or a child started in a race with the end):
-- the parent runs of active child runs whose parent node ended without completing,
-- whose parent run is terminal, or whose parent run is gone (purged). The scanner
-- locks each parent and cancels its children with runs_cancel_children, which
-- rechecks all of this under the lock.
-- The parent run and its child node are probed by key for each active child run
-- (LATERAL ... OFFSET 0), never joined by a hash over every run and step kept.
SELECT DISTINCT c.parent_run_id
FROM cyclone_runs c
LEFT JOIN LATERAL (
    SELECT p.id, p.state FROM cyclone_runs p WHERE p.id = c.parent_run_id OFFSET 0) p ON true
LEFT JOIN LATERAL (
    SELECT s.state
    FROM cyclone_steps s
    WHERE s.run_id = c.parent_run_id AND s.node = c.parent_node_id
    OFFSET 0) s ON true
WHERE c.parent_run_id IS NOT NULL
  AND c.state IN ('running', 'paused')
  AND (p.id IS NULL
       OR p.state IN ('completed', 'failed', 'cancelled')
       OR s.state IN ('cancelled', 'discarded'))
LIMIT %(limit)s;
