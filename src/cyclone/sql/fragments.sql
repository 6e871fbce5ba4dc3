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
