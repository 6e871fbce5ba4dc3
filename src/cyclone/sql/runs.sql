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


-- name: runs_fail_fast
-- engine-design, Failure Propagation (fail_run): once the step %(step_id)s is
-- discarded, the run becomes failed, at most once, and a second UPDATE cancels every
-- other step still active. A sibling still in its handler learns of the cancel at its
-- next heartbeat; its late completion matches no row.
WITH failed AS (
    UPDATE cyclone_runs r
    SET state = 'failed',
        finished_at = now(),
        updated_at = now()
    WHERE r.id = %(run_id)s
      AND r.state IN ('running', 'paused')
      AND EXISTS (
          SELECT 1 FROM cyclone_steps d WHERE d.id = %(step_id)s AND d.state = 'discarded')
    RETURNING r.id
), cancelled AS (
    UPDATE cyclone_steps s
    SET state = 'cancelled',
        completed_at = now(),
        lease_owner = NULL,
        lease_expiry = NULL
    FROM failed
    WHERE s.run_id = failed.id
      AND s.id <> %(step_id)s
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING s.id
)
SELECT failed.id AS run_id, (SELECT count(*) FROM cancelled) AS steps_cancelled
FROM failed;


-- name: runs_cancel
-- Cancel a run that is not finished, and every one of its active steps (a second
-- UPDATE). Runs after runs_lock. No row back: the run is already terminal or absent.
WITH cancelled_run AS (
    UPDATE cyclone_runs
    SET state = 'cancelled',
        finished_at = now(),
        updated_at = now()
    WHERE id = %(run_id)s
      AND state IN ('running', 'paused')
    RETURNING id
), cancelled_steps AS (
    UPDATE cyclone_steps s
    SET state = 'cancelled',
        completed_at = now(),
        lease_owner = NULL,
        lease_expiry = NULL
    FROM cancelled_run
    WHERE s.run_id = cancelled_run.id
      AND s.state NOT IN ('completed', 'discarded', 'cancelled')
    RETURNING s.id
)
SELECT cancelled_run.id AS run_id, (SELECT count(*) FROM cancelled_steps) AS steps_cancelled
FROM cancelled_run;


-- name: runs_get
-- One run with its result (the output of result_node once completed) and its error
-- (the first discarded step's error once failed).
SELECT r.id, r.workflow, r.state, r.def_version, r.input,
       CASE WHEN r.state = 'completed' THEN (
           SELECT s.output FROM cyclone_steps s
           WHERE s.run_id = r.id AND s.node = r.result_node) END AS result,
       CASE WHEN r.state = 'failed' THEN (
           SELECT s.error FROM cyclone_steps s
           WHERE s.run_id = r.id AND s.state = 'discarded'
           ORDER BY s.completed_at, s.id LIMIT 1) END AS error,
       r.created_at, r.updated_at, r.finished_at, r.deadline_at, r.paused_at,
       r.submit_key, r.parent_run_id, r.parent_node_id
FROM cyclone_runs r
WHERE r.id = %(run_id)s;


-- name: runs_list
-- Runs, newest first, optionally filtered by state and workflow (idx_runs_state_id),
-- with keyset paging below %(before_id)s.
SELECT r.id, r.workflow, r.state, r.def_version, r.input,
       CASE WHEN r.state = 'completed' THEN (
           SELECT s.output FROM cyclone_steps s
           WHERE s.run_id = r.id AND s.node = r.result_node) END AS result,
       CASE WHEN r.state = 'failed' THEN (
           SELECT s.error FROM cyclone_steps s
           WHERE s.run_id = r.id AND s.state = 'discarded'
           ORDER BY s.completed_at, s.id LIMIT 1) END AS error,
       r.created_at, r.updated_at, r.finished_at, r.deadline_at, r.paused_at,
       r.submit_key, r.parent_run_id, r.parent_node_id
FROM cyclone_runs r
WHERE (%(state)s::text IS NULL OR r.state = %(state)s::text)
  AND (%(workflow)s::text IS NULL OR r.workflow = %(workflow)s::text)
  AND (%(before_id)s::bigint IS NULL OR r.id < %(before_id)s::bigint)
ORDER BY r.id DESC
LIMIT %(limit)s;
