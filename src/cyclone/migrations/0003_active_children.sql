-- Cyclone migration 3: an index of the child runs still active.
--
-- The orphan backstop of the wait scanner (steps_orphaned_children) and the purge's
-- guard against deleting a run with an active descendant (runs_purge) look for active
-- child runs on every pass. idx_runs_parent holds every child run until it is purged,
-- so without this index each pass reads every child run of the retention window. The
-- partial index holds only the child runs that are running or paused: a few, whatever
-- the history. Building it takes a SHARE lock on cyclone_runs (writes wait while it is
-- built; reads do not); on a table of millions of runs, migrate at a quiet moment.
-- Workers of earlier versions never name it and keep working beside it.

CREATE INDEX idx_runs_active_children ON cyclone_runs (parent_run_id)
    WHERE parent_run_id IS NOT NULL AND state IN ('running', 'paused');
