-- Statements of the test helpers (cyclone.testing): moving the database clock's
-- deadlines instead of waiting for them, and reading what is enqueued.
--
-- advance_time shifts rows, never the clock: every due time, wait deadline and run
-- deadline moves earlier by %(by_us)s microseconds (a bigint, as every duration sent to
-- SQL), so that what would be due that much later is due now. No state changes here:
-- the scanners and the claim then move the rows as they would have once that time had
-- passed.


-- name: testing_shift_steps
-- Steps not yet run or waiting: their scheduled_at (a retry's or a snooze's backoff, an
-- enqueue's scheduled time, a timer's end, a signal wait's timeout) moves earlier; on
-- every step, a uniqueness window (unique_until) ends that much earlier too. Running
-- steps and their leases are left alone. How many steps changed.
WITH shifted AS (
    UPDATE cyclone_steps s
    SET scheduled_at = CASE
            WHEN s.state IN ('pending', 'available', 'waiting_timer', 'waiting_signal',
                             'paused')
            THEN s.scheduled_at - %(by_us)s::bigint * interval '1 microsecond'
            ELSE s.scheduled_at END,
        unique_until = s.unique_until - %(by_us)s::bigint * interval '1 microsecond'
    WHERE s.state IN ('pending', 'available', 'waiting_timer', 'waiting_signal', 'paused')
       OR s.unique_until IS NOT NULL
    RETURNING 1
)
SELECT count(*) AS total FROM shifted;


-- name: testing_shift_runs
-- Runs not finished that have a deadline: deadline_at moves earlier. How many runs.
WITH shifted AS (
    UPDATE cyclone_runs r
    SET deadline_at = r.deadline_at - %(by_us)s::bigint * interval '1 microsecond'
    WHERE r.state IN ('running', 'paused')
      AND r.deadline_at IS NOT NULL
    RETURNING 1
)
SELECT count(*) AS total FROM shifted;


-- name: testing_shift_buckets
-- Rate-limit buckets: every start in a bucket's sliding log, and the time its tokens
-- were last counted (updated_at, from which they refill), move earlier; a start that
-- leaves its window frees its room as it would have. How many buckets.
WITH shifted AS (
    UPDATE cyclone_rate_buckets b
    SET starts = ARRAY(
            SELECT t - %(by_us)s::bigint * interval '1 microsecond'
            FROM unnest(b.starts) WITH ORDINALITY AS u(t, i)
            ORDER BY i),
        updated_at = b.updated_at - %(by_us)s::bigint * interval '1 microsecond'
    RETURNING 1
)
SELECT count(*) AS total FROM shifted;


-- name: testing_available_steps
-- The steps waiting to be claimed (available, due now or later) of kind %(kind)s (NULL:
-- of every kind), as cyclone.Step reads them, oldest first, at most %(limit)s: what
-- assert_enqueued matches and lists.
-- use: step_record
WHERE s.state = 'available'
  AND (%(kind)s::text IS NULL OR s.kind = %(kind)s::text)
ORDER BY s.id
LIMIT %(limit)s;
