-- Statements on cyclone_schedules and cyclone_schedule_fires.
--
-- A scanner claims due schedules with FOR UPDATE SKIP LOCKED and takes a scanner lease
-- on each (lease_owner, lease_expiry); it then fires each slot in its own transaction
-- guarded on its lease and on the next_run_at it read, so a slot fires at most once
-- even when the lease passed to another scanner. The fire row's primary key
-- (schedule_id, scheduled_for) is the last line of defence against a duplicate.
-- A schedule whose fire failed keeps no owner and a lease_expiry in the future: its
-- back-off, before which no scanner claims it. Durations arrive as microseconds.


-- name: schedules_now
-- The database clock, from which every next_run_at is computed.
SELECT now();


-- name: schedules_insert
-- A new schedule; no row comes back when the id is taken.
INSERT INTO cyclone_schedules (
    id, kind, def_version, input, cron_spec, location, next_run_at, queue, priority,
    max_attempts, timeout, retention)
VALUES (%(id)s, %(kind)s, %(def_version)s, %(input)s::jsonb, %(cron_spec)s, %(location)s,
        %(next_run_at)s, %(queue)s, %(priority)s, %(max_attempts)s,
        %(timeout_us)s::bigint * interval '1 microsecond',
        %(retention_us)s::bigint * interval '1 microsecond')
ON CONFLICT (id) DO NOTHING
RETURNING id;


-- fragment: schedule_row
-- A schedule as the statements that change or fire it read it: durations in seconds,
-- the input as JSON text, and the database clock.
id, kind, def_version, input::text AS input, cron_spec, location, next_run_at,
queue, priority, max_attempts,
extract(epoch FROM timeout)::float8 AS timeout_s,
extract(epoch FROM retention)::float8 AS retention_s,
enabled, now() AS now


-- name: schedules_lock
-- One schedule, locked for an update, with the database clock.
SELECT
    -- use: schedule_row
FROM cyclone_schedules
WHERE id = %(id)s
FOR UPDATE;


-- name: schedules_replace
-- Every definition column of a locked schedule. A changed cron or zone starts from the
-- next slot after now(), later than every slot already fired; a failure count and a
-- back-off of the old definition are cleared.
UPDATE cyclone_schedules
SET kind = %(kind)s,
    def_version = %(def_version)s,
    input = %(input)s::jsonb,
    cron_spec = %(cron_spec)s,
    location = %(location)s,
    next_run_at = %(next_run_at)s,
    queue = %(queue)s,
    priority = %(priority)s,
    max_attempts = %(max_attempts)s,
    timeout = %(timeout_us)s::bigint * interval '1 microsecond',
    retention = %(retention_us)s::bigint * interval '1 microsecond',
    consecutive_failures = 0,
    last_error = NULL,
    lease_owner = NULL,
    lease_expiry = NULL,
    updated_at = now()
WHERE id = %(id)s
RETURNING id;


-- name: schedules_set_enabled
-- Enable or disable a locked schedule whose enabled flag is changing. Enabling moves a
-- next_run_at that passed while the schedule was disabled to the next slot after now
-- (the slots missed while it was disabled never fire; next_run_at never moves back)
-- and starts it afresh: no failure count, no error, no back-off.
UPDATE cyclone_schedules
SET enabled = %(enabled)s,
    next_run_at = greatest(next_run_at, %(next_run_at)s),
    consecutive_failures = CASE WHEN %(enabled)s THEN 0 ELSE consecutive_failures END,
    last_error = CASE WHEN %(enabled)s THEN NULL ELSE last_error END,
    lease_owner = NULL,
    lease_expiry = NULL,
    updated_at = now()
WHERE id = %(id)s
  AND enabled <> %(enabled)s
RETURNING id;


-- name: schedules_delete
-- Delete a schedule; its fire rows go with it (the fired runs stay).
DELETE FROM cyclone_schedules
WHERE id = %(id)s
RETURNING id;


-- name: schedules_list
-- Every schedule, or the one with the given id, for inspection.
SELECT id, kind, def_version, input, cron_spec, location, next_run_at, enabled,
       last_run_id, last_error, consecutive_failures, queue, priority, max_attempts,
       extract(epoch FROM timeout)::float8 AS timeout_s,
       extract(epoch FROM retention)::float8 AS retention_s,
       lease_owner, lease_expiry, created_at, updated_at
FROM cyclone_schedules
WHERE %(id)s::text IS NULL OR id = %(id)s
ORDER BY id;


-- name: schedules_claim
-- Take a scanner lease on due schedules this scanner can fire (a workflow schedule
-- needs its pinned definition), skipping rows another scanner holds; idx_schedules_due.
WITH due AS (
    SELECT id AS due_id
    FROM cyclone_schedules
    WHERE enabled
      AND next_run_at <= now()
      AND (lease_expiry IS NULL OR lease_expiry <= now())
      AND (def_version IS NULL OR def_version = ANY (%(versions)s::text[]))
    ORDER BY next_run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE cyclone_schedules s
SET lease_owner = %(owner)s,
    lease_expiry = now() + %(ttl_us)s::bigint * interval '1 microsecond'
FROM due
WHERE s.id = due.due_id
RETURNING
    -- use: schedule_row
;


-- name: schedules_fired
-- Record the fire of one slot and move the schedule forward, in the transaction that
-- inserted the run. Guarded on this scanner's lease, on the next_run_at it read and on
-- the schedule being enabled; no row back means another scanner, an update or a
-- disable got there first, and the caller rolls the whole fire back.
WITH moved AS (
    UPDATE cyclone_schedules
    SET next_run_at = %(next_run_at)s,
        last_run_id = %(run_id)s,
        last_error = NULL,
        consecutive_failures = 0,
        lease_owner = NULL,
        lease_expiry = NULL,
        updated_at = now()
    WHERE id = %(id)s
      AND enabled
      AND lease_owner = %(owner)s
      AND next_run_at = %(due)s
      AND %(next_run_at)s::timestamptz > next_run_at
    RETURNING id
)
INSERT INTO cyclone_schedule_fires (schedule_id, scheduled_for, run_id)
SELECT moved.id, %(slot)s, %(run_id)s
FROM moved
RETURNING schedule_id;


-- name: schedules_pass_over
-- Move a schedule past a slot that has a fire row already (its next_run_at was moved
-- back by hand), guarded like a fire; no run is inserted.
UPDATE cyclone_schedules
SET next_run_at = %(next_run_at)s,
    lease_owner = NULL,
    lease_expiry = NULL,
    updated_at = now()
WHERE id = %(id)s
  AND lease_owner = %(owner)s
  AND next_run_at = %(due)s
  AND %(next_run_at)s::timestamptz > next_run_at
  AND EXISTS (
      SELECT 1
      FROM cyclone_schedule_fires f
      WHERE f.schedule_id = %(id)s
        AND f.scheduled_for = %(slot)s)
RETURNING id;


-- name: schedules_failed
-- A fire that failed: record the error, count it, and back off (1 s after the first
-- failure, doubling with each, at most cap_s) by leaving a lease_expiry in the future
-- with no owner.
UPDATE cyclone_schedules
SET last_error = %(error)s,
    consecutive_failures = consecutive_failures + 1,
    lease_owner = NULL,
    lease_expiry = now() + least(power(2, least(consecutive_failures, 30)), %(cap_s)s)
                           * interval '1 second',
    updated_at = now()
WHERE id = %(id)s
  AND lease_owner = %(owner)s
RETURNING consecutive_failures;

