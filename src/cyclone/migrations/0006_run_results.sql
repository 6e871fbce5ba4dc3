-- Cyclone migration 6: a run as the clients read it, with its result and its error.
--
-- The view cyclone_run_results_v1 has one row per run: the run's columns, its result
-- (the output of its result node, once the run completed) and its error (once it
-- failed: "result node cancelled" when a contained failure cancelled the result node,
-- else a deadline's error, else the first discarded step's error). get_run and
-- list_runs read it, so the rule for a run's result and error is written once. A
-- simple view: a query that filters, orders and limits it is planned on cyclone_runs
-- and its indexes directly, and the result and error are read only for the rows it
-- returns. No lock is taken; workers of earlier versions never read it.

CREATE VIEW cyclone_run_results_v1 AS
SELECT r.id, r.workflow, r.state, r.def_version, r.input,
       CASE WHEN r.state = 'completed' THEN (
           SELECT s.output FROM cyclone_steps s
           WHERE s.run_id = r.id AND s.node = r.result_node) END AS result,
       CASE WHEN r.state = 'failed' THEN coalesce(
           (SELECT s.error FROM cyclone_steps s
            WHERE s.run_id = r.id AND s.node = r.result_node
              AND s.error_kind = 'result_node_cancelled'),
           (SELECT s.error FROM cyclone_steps s
            WHERE s.run_id = r.id AND s.error_kind = 'deadline' LIMIT 1),
           (SELECT s.error FROM cyclone_steps s
            WHERE s.run_id = r.id AND s.state = 'discarded'
            ORDER BY s.completed_at, s.id LIMIT 1)) END AS error,
       r.created_at, r.updated_at, r.finished_at, r.deadline_at, r.paused_at,
       r.submit_key, r.parent_run_id, r.parent_node_id
FROM cyclone_runs r;
