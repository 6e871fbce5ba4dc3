-- Cyclone migration 5: the pieces of the run graph, shared by every statement that moves
-- a step of a workflow run onto its next state.
--
-- Two SQL functions and a view that PostgreSQL inlines into the statements that use them
-- (each function is a single SELECT in LANGUAGE sql, not STRICT, not SECURITY DEFINER,
-- with no SET clause, and no more volatile in its body than declared): a caller pays no
-- function call, and its plan is the one it would have with the text written out. They
-- hold the rules once, where the advance, submit, resume and operator retry used to
-- repeat them:
--
-- * cyclone_reached_state_v1(kind, run_state): the state a node enters when it is
--   reached (every dependency completed): paused in a paused run; waiting_timer,
--   waiting_signal or waiting_child for a sleep, signal or child node; else available.
-- * cyclone_reached_at_v1(kind, run_state, wait_for, scheduled_at, at): the scheduled_at
--   of a node reached at time "at": a sleep or signal wait of a run that is not paused
--   starts its wait then (at + wait_for: the sleep's length, the signal's timeout); a
--   parked node (paused run) and any other node keep scheduled_at.
-- * cyclone_unmet_deps_v1 (view): the dependency edges whose upstream step is not
--   completed, as (run_id, node, dep_node, dep_step_id). A node is ready when it has no
--   row here; a statement that completes steps itself (and so does not see its own
--   writes) also counts a row whose dep_step_id it completes as met. Read with
--   run_id and node given, it costs two index probes per dependency.
--
-- Functions and a view only: no table, column or index changes, and nothing is locked
-- while they are created. Workers of earlier versions never call them and keep working
-- beside them.

CREATE FUNCTION cyclone_reached_state_v1(p_kind text, p_run_state text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN p_run_state = 'paused' THEN 'paused'
        WHEN p_kind = '@sleep' THEN 'waiting_timer'
        WHEN p_kind = '@signal' THEN 'waiting_signal'
        WHEN p_kind = '@child' THEN 'waiting_child'
        ELSE 'available' END
$$;

CREATE FUNCTION cyclone_reached_at_v1(
    p_kind text, p_run_state text, p_wait_for interval, p_scheduled_at timestamptz,
    p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_kind IN ('@sleep', '@signal') AND p_run_state <> 'paused'
        THEN p_at + coalesce(p_wait_for, interval '0')
        ELSE p_scheduled_at END
$$;

CREATE VIEW cyclone_unmet_deps_v1 AS
SELECT d.run_id, d.node, d.dep_node, p.id AS dep_step_id
FROM cyclone_deps d
JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
WHERE p.state <> 'completed';
