-- Cyclone migration 7: indexes for the web dashboard (cyclone.dashboard).
--
-- Five indexes, each for a page that must answer fast on a database with millions of
-- runs and steps, none read by the engine's own statements:
--
-- * idx_steps_active: the unfinished steps, by queue and state. The per-queue counts of
--   the overview (the view cyclone_v_queues) and the per-kind counts of /kinds read
--   only the steps not yet completed, discarded or cancelled: without it, each reads
--   every step kept. Its predicate is the view's, so the view is planned on it.
-- * idx_steps_completed_at: finished steps by completion time, with their state, for
--   the completions and failures per minute of the last hour.
-- * idx_runs_workflow_id: runs of one workflow, newest first (the /runs filter).
-- * idx_runs_submit_key_any: runs by submit key alone (the /runs search; the unique
--   idx_runs_submit_key leads with the workflow).
-- * idx_runs_created: runs by creation time, for a time range in /runs, newest first
--   (the primary key's order is the creation order only roughly, and the planner
--   cannot know how closely: a range far back would be read by walking the key).
--
-- Each CREATE INDEX takes a SHARE lock on its table while it is built (writes wait,
-- reads do not): on a large database, migrate at a quiet moment. Workers of earlier
-- versions never name these indexes and keep working beside them.

CREATE INDEX idx_steps_active ON cyclone_steps (queue, state, scheduled_at)
    WHERE state NOT IN ('completed', 'discarded', 'cancelled');

CREATE INDEX idx_steps_completed_at ON cyclone_steps (completed_at) INCLUDE (state)
    WHERE completed_at IS NOT NULL;

CREATE INDEX idx_runs_workflow_id ON cyclone_runs (workflow, id DESC);

CREATE INDEX idx_runs_submit_key_any ON cyclone_runs (submit_key)
    WHERE submit_key IS NOT NULL;

CREATE INDEX idx_runs_created ON cyclone_runs (created_at, id);
