-- The retention purge (cyclone.scanners.purge): terminal runs past their retention, or
-- older than an operator's limit, deleted in bounded batches with their steps, deps,
-- input bindings, signals and schedule fires (by cascade). A run that links a live run
-- to its tree stays.


-- name: runs_purge_plan
-- The first statement of a purge transaction. The purge's plan is priced for the whole
-- history it might walk (millions in cost units), far above jit_above_cost, and
-- PostgreSQL would JIT-compile it on every call: 0.3 s of compiling for a pass that
-- reads a few index entries (measured with 1,000,000 kept runs). Transaction-local.
SET LOCAL jit = off;


-- fragment: runs_above_live
-- The runs above a running or paused run (its parent, the parent's parent, ...), for a
-- recursive CTE above_live (id) of the purge: found by walking up from the active child
-- runs (idx_runs_active_children, then primary keys).
SELECT c.parent_run_id
FROM cyclone_runs c
WHERE c.parent_run_id IS NOT NULL
  AND c.state IN ('running', 'paused')
UNION
SELECT p.parent_run_id
FROM above_live a
JOIN cyclone_runs p ON p.id = a.id
WHERE p.parent_run_id IS NOT NULL


-- fragment: runs_not_linked_to_live
-- A purge candidate r links no live run to its tree: it is not the child run of a
-- running or paused parent, nor above a running or paused run (above_live).
AND NOT EXISTS (
    SELECT 1
    FROM cyclone_runs p
    WHERE p.id = r.parent_run_id
      AND p.state IN ('running', 'paused'))
AND NOT EXISTS (SELECT 1 FROM above_live a WHERE a.id = r.id)


-- fragment: runs_purge_doomed
-- The end of a purge: the doomed runs, of those a CTE doomed selects, locked in id order
-- (a run another transaction holds is skipped) and deleted, their rows with them.
    ORDER BY r.id
    LIMIT %(limit)s
    FOR UPDATE OF r SKIP LOCKED
)
DELETE FROM cyclone_runs r
USING doomed
WHERE r.id = doomed.id
RETURNING r.id


-- name: runs_purge
-- Delete one bounded batch of terminal runs past their retention; steps, deps, input
-- bindings, signals and schedule fires go with them by cascade. A run is past its
-- retention when every one of its steps has a retention and has outlived it since the
-- run finished (a step with no retention keeps its run forever). A terminal child run
-- stays while its parent run is running or paused, and a terminal run stays while a
-- run below it (a child run, its child, ...) is running or paused: it links that run to
-- the tree (rows from before a parent cancelled its children on ending; the orphan
-- scanner cancels them). Those runs are found once per batch by walking up from the
-- active child runs (idx_runs_active_children, then primary keys), never per
-- candidate. Never a non-terminal run: the state is rechecked under the row lock, and
-- a run another transaction holds is skipped.
-- The candidates come from idx_runs_expiry, never from a scan of the runs kept: the
-- distinct run retentions (cyclone_runs.retention, the longest of the run's steps),
-- one index probe each, then within each retention the runs that finished at least
-- that long ago, oldest first, each checked against its steps (whose retention an
-- operator may have changed since). Only those runs are read, so a pass costs what it
-- deletes, whatever the history kept. A run with no retention (a step keeps it
-- forever, or it was written by a version before migration 4) is never a candidate.
WITH RECURSIVE above_live (id) AS (
    -- use: runs_above_live
), kept (retention) AS (
    (SELECT r.retention
     FROM cyclone_runs r
     WHERE r.state IN ('completed', 'failed', 'cancelled')
       AND r.retention IS NOT NULL
     ORDER BY r.retention
     LIMIT 1)
    UNION ALL
    SELECT (SELECT r.retention
            FROM cyclone_runs r
            WHERE r.state IN ('completed', 'failed', 'cancelled')
              AND r.retention > k.retention
            ORDER BY r.retention
            LIMIT 1)
    FROM kept k
    WHERE k.retention IS NOT NULL
), due AS (
    SELECT d.id
    FROM kept k
    CROSS JOIN LATERAL (
        SELECT r.id
        FROM cyclone_runs r
        WHERE r.state IN ('completed', 'failed', 'cancelled')
          AND r.retention = k.retention
          AND r.finished_at <= now() - k.retention
          AND NOT EXISTS (
              SELECT 1
              FROM cyclone_steps s
              WHERE s.run_id = r.id
                AND (s.retention IS NULL OR r.finished_at + s.retention > now()))
          -- use: runs_not_linked_to_live
        ORDER BY r.finished_at
        LIMIT %(limit)s) d
    WHERE k.retention IS NOT NULL
), doomed AS (
    SELECT r.id
    FROM cyclone_runs r
    WHERE r.id = ANY(ARRAY(SELECT id FROM due))
      AND r.state IN ('completed', 'failed', 'cancelled')
-- use: runs_purge_doomed


-- name: runs_purge_older
-- runs_purge for "cyclone purge --older-than": every terminal run that finished at least
-- %(older_than_us)s ago goes, whatever its retention, with the same guards (a child run
-- of a live parent, a run above a live run, a run another transaction holds stay).
-- It reads the terminal runs in id order until it has a batch: an operator's command,
-- run on demand, never on a schedule.
WITH RECURSIVE above_live (id) AS (
    -- use: runs_above_live
), doomed AS (
    SELECT r.id
    FROM cyclone_runs r
    WHERE r.state IN ('completed', 'failed', 'cancelled')
      AND r.finished_at <= now() - %(older_than_us)s::bigint * interval '1 microsecond'
      -- use: runs_not_linked_to_live
-- use: runs_purge_doomed
