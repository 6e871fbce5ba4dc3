-- Pieces of SQL that several statements share, each written once. A statement names
-- one with a line "-- use: <fragment>" (see cyclone.sql.load_blocks); the text stands
-- there, indented as that line is. Fragments in other files serve that file only.


-- fragment: step_closed
-- The assignments of a step that ends now: completed now, no lease. Last in its SET list.
completed_at = now(),
lease_owner = NULL,
lease_expiry = NULL


-- fragment: step_cancelled
-- The assignments that cancel a step that is not terminal: no lease, completed now.
-- Last in its SET list (a statement's own assignments, error and error_kind, come first).
state = 'cancelled',
-- use: step_closed


-- fragment: run_ended_now
-- The times of a run that ends now, after the state it ends in.
finished_at = now(),
updated_at = now()


-- fragment: run_completed_by_statement
-- The start of the update that completes the runs of steps completed by this
-- statement: their time is the statement's (statement_timestamp()), as the steps' is.
UPDATE cyclone_runs r
SET state = 'completed',
    finished_at = statement_timestamp(),
    updated_at = statement_timestamp()


-- fragment: step_input_shown
-- The input a step s of run r shows (jsonb): the constant or the run input; for a data
-- edge the upstream output once it exists; for a fan-in (cyclone_step_inputs) nothing,
-- as it is assembled when the step is claimed.
CASE
    WHEN s.input_from IS NOT NULL THEN (
        SELECT u.output FROM cyclone_steps u
        WHERE u.run_id = s.run_id AND u.node = s.input_from)
    WHEN EXISTS (
        SELECT 1 FROM cyclone_step_inputs i
        WHERE i.run_id = s.run_id AND i.node = s.node) THEN NULL
    ELSE coalesce(s.input, r.input) END


-- fragment: step_record
-- A step as a cyclone.Step reads it (steps_list, steps_get), from step s of run r; the
-- statement adds its WHERE (and ORDER BY).
SELECT s.id, s.run_id, s.node, s.kind, s.state, s.queue, s.priority,
       -- use: step_input_shown
           AS input,
       s.output, s.attempt, s.max_attempts,
       s.error, s.error_kind, s.panic_stack, s.reclaims, s.lease_owner, s.lease_expiry,
       s.lease_generation, s.heartbeat_at, s.scheduled_at, s.created_at, s.started_at,
       s.completed_at, s.unique_key, s.sequence_key,
       extract(epoch FROM s.timeout)::float8 AS timeout_s,
       extract(epoch FROM s.retention)::float8 AS retention_s,
       s.snoozes
FROM cyclone_steps s
JOIN cyclone_runs r ON r.id = s.run_id
