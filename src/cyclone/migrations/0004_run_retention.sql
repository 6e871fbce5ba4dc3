-- Cyclone migration 4: retention on the run, so that the purge finds expired runs
-- without reading the history; an index for the purge's schedule cleanup.
--
-- cyclone_runs.retention is the run's retention: the longest retention of its steps,
-- written with the run (a job: its step's; a workflow run: its longest node's), NULL
-- when a step keeps the run forever. The purge walks idx_runs_expiry once per distinct
-- retention and reads, in each, only the runs that finished at least that long ago:
-- its cost follows what it deletes, not the runs it keeps. Existing runs get their
-- retention here, from their steps (one pass over both tables: migrate at a quiet
-- moment on a large database).
--
-- Deleting a run sets cyclone_schedules.last_run_id to NULL where it names the run
-- (ON DELETE SET NULL): idx_schedules_last_run finds those rows without a scan of the
-- schedules per deleted run.

ALTER TABLE cyclone_runs ADD COLUMN retention interval;

UPDATE cyclone_runs r
SET retention = k.retention
FROM (
    SELECT run_id, max(retention) AS retention
    FROM cyclone_steps
    GROUP BY run_id
    HAVING bool_and(retention IS NOT NULL)
) AS k
WHERE k.run_id = r.id;

CREATE INDEX idx_runs_expiry ON cyclone_runs (retention, finished_at)
    WHERE state IN ('completed', 'failed', 'cancelled');

CREATE INDEX idx_schedules_last_run ON cyclone_schedules (last_run_id)
    WHERE last_run_id IS NOT NULL;
