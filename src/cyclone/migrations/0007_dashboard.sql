-- Cyclone migration 7: indexes for the web dashboard (cyclone.dashboard).
--
-- Three indexes that let the dashboard's pages answer fast on a database of millions
-- of runs and steps while costing the engine's writes next to nothing. None is read
-- by the engine's own statements.
--
-- * idx_steps_completed_brin: a BRIN index of the steps' completion time (a few pages
--   for millions of rows), for the completions and failures per minute of the last
--   hour. A step's row is written when it is enqueued and rewritten, nearby, when it
--   finishes, so the table's pages follow time closely enough for a block range index;
--   a write only widens a range's summary when it falls outside it, and ranges written
--   since the last vacuum are read whole.
-- * idx_runs_created_brin: a BRIN index of the runs' creation time (runs are written
--   in time order), for a time range in /runs.
-- * idx_runs_submit_key_any: runs by submit key alone (the /runs search; the unique
--   idx_runs_submit_key leads with the workflow). Partial: runs without a submit key
--   are not in it and cost it nothing.
--
-- The per-queue counts of the overview read the partial indexes the engine already
-- has (claim, lease, timer, signal, child waits). A B-tree of every run's workflow or
-- creation time, or of every step's state or completion, would have added an entry
-- to every enqueue, claim and completion (measured in docs/dashboard.md).
--
-- Each CREATE INDEX takes a SHARE lock on its table while it is built (writes wait,
-- reads do not): on a large database, migrate at a quiet moment. Workers of earlier
-- versions never name these indexes and keep working beside them.

CREATE INDEX idx_steps_completed_brin ON cyclone_steps USING brin (completed_at);

CREATE INDEX idx_runs_created_brin ON cyclone_runs USING brin (created_at);

CREATE INDEX idx_runs_submit_key_any ON cyclone_runs (submit_key)
    WHERE submit_key IS NOT NULL;
