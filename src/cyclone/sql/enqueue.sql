-- Statements that enqueue standalone runs (jobs): one run and its one step per input,
-- in one statement, with the unique_key and submit_key lookups that make an enqueue
-- idempotent. The conventions of steps.sql hold here too.


-- fragment: job_step_insert
-- The insert of a standalone run's one step (a job): its columns.
INSERT INTO cyclone_steps (
    run_id, node, kind, state, queue, priority, max_attempts, scheduled_at,
    timeout, unique_key, sequence_key, retention, concurrency_key, rate_key, fairness_key)


-- fragment: job_step_values
-- The values of job_step_insert after the run id: the enqueue's options, durations in
-- microseconds, the due time the database clock computes from %(delay_us)s unless
-- %(scheduled_at)s names one.
%(kind)s, %(kind)s, 'available', %(queue)s, %(priority)s, %(max_attempts)s,
coalesce(%(scheduled_at)s::timestamptz,
         now() + %(delay_us)s::bigint * interval '1 microsecond'),
%(timeout_us)s::bigint * interval '1 microsecond',
%(unique_key)s, %(sequence_key)s,
%(retention_us)s::bigint * interval '1 microsecond',
%(concurrency_key)s, %(rate_key)s, %(fairness_key)s


-- name: steps_enqueue
-- A standalone run and its one step, in one statement. The step is inserted first so
-- that its ON CONFLICT on idx_steps_unique_active decides whether anything is written:
-- on a live duplicate unique_key no step and no run is inserted and no row comes back.
-- The run id is drawn from the run identity in advance; the foreign key from the step
-- to the run is checked at the end of the statement, when both rows exist.
WITH new_run AS (
    SELECT nextval('cyclone_runs_id_seq') AS id
), step AS (
    -- use: job_step_insert
    SELECT new_run.id,
           -- use: job_step_values
    FROM new_run
    ON CONFLICT (kind, unique_key)
        WHERE unique_key IS NOT NULL AND state NOT IN ('completed', 'discarded', 'cancelled')
        DO NOTHING
    RETURNING id, run_id
), run AS (
    INSERT INTO cyclone_runs (
        id, workflow, def_version, input, result_node, retention, traceparent)
    OVERRIDING SYSTEM VALUE
    SELECT step.run_id, %(kind)s, 'job', %(input)s::jsonb, %(kind)s,
           %(retention_us)s::bigint * interval '1 microsecond', %(traceparent)s
    FROM step
)
SELECT step.id AS step_id, step.run_id
FROM step;


-- name: steps_enqueue_woken
-- extends: steps_enqueue
-- steps_enqueue with another last SELECT (the loader writes the rest from it), which also
-- notifies the step's queue with the payload %(wake)s when a step is written: the
-- notification goes out when the statement's transaction commits, so an enqueue at the
-- leading edge of its queue's wakeup window is one statement and one round trip,
-- wakeup included. Skipped while the server's notification queue is over half full
-- ("woke" false). A role that may not execute pg_notify cannot run this statement at
-- all (the privilege is checked before anything runs): the client then uses
-- steps_enqueue and the publisher.
SELECT step.id AS step_id, step.run_id,
       (SELECT pg_notify('cyclone_available', %(wake)s::text)
        WHERE pg_notification_queue_usage() < 0.5) IS NOT NULL AS woke
FROM step;


-- name: steps_find_unique
-- The active step that holds (kind, unique_key), if any: the run a duplicate enqueue
-- returns.
SELECT id AS step_id, run_id
FROM cyclone_steps
WHERE kind = %(kind)s
  AND unique_key = %(unique_key)s
  AND state NOT IN ('completed', 'discarded', 'cancelled');


-- name: steps_enqueue_many
-- Many standalone runs of one kind with shared options, in one statement. The inputs
-- come as one JSON array text (%(inputs_json)s: parsed once, no array literal of JSON
-- texts to unpack). Run ids are drawn in input order as the array is read, so sorting
-- the rows by run id gives input order (the client sorts them: no sort here).
WITH v AS (
    SELECT nextval('cyclone_runs_id_seq') AS run_id, u.input
    FROM jsonb_array_elements(%(inputs_json)s::jsonb) AS u (input)
), run AS (
    INSERT INTO cyclone_runs (
        id, workflow, def_version, input, result_node, retention, traceparent)
    OVERRIDING SYSTEM VALUE
    SELECT v.run_id, %(kind)s, 'job', v.input, %(kind)s,
           %(retention_us)s::bigint * interval '1 microsecond', %(traceparent)s
    FROM v
), step AS (
    -- use: job_step_insert
    SELECT v.run_id,
           -- use: job_step_values
    FROM v
    RETURNING id, run_id
)
SELECT step.id AS step_id, step.run_id
FROM step;


-- name: steps_enqueue_keyed
-- Standalone runs of one kind with submit keys, in one statement: %(submit_keys)s is
-- aligned with %(inputs)s (NULL for an input without a key). The run is inserted first,
-- so that its ON CONFLICT on idx_runs_submit_key decides whether anything is written
-- (waiting for a concurrent insert of the key to commit or roll back): for a key some
-- run holds, in any state, neither a run nor a step is written and no row comes back.
-- Each written input returns (ord, step_id, run_id), ord its position from 1. A key
-- that came back empty is looked up by steps_find_submit_keys in a following statement:
-- a run committed while this statement waited is invisible to its snapshot. Runs are
-- inserted in key order (their ids are drawn in input order all the same), so that two
-- calls waiting on each other's keys always take them in one order: no deadlock.
WITH v AS (
    SELECT nextval('cyclone_runs_id_seq') AS run_id, u.input, u.submit_key, u.ord
    FROM unnest(%(inputs)s::jsonb[], %(submit_keys)s::text[])
        WITH ORDINALITY AS u (input, submit_key, ord)
), run AS (
    INSERT INTO cyclone_runs (
        id, workflow, def_version, input, result_node, submit_key, retention, traceparent)
    OVERRIDING SYSTEM VALUE
    SELECT v.run_id, %(kind)s, 'job', v.input, %(kind)s, v.submit_key,
           %(retention_us)s::bigint * interval '1 microsecond', %(traceparent)s
    FROM v
    ORDER BY v.submit_key, v.ord
    ON CONFLICT (workflow, submit_key) WHERE submit_key IS NOT NULL DO NOTHING
    RETURNING id
), step AS (
    -- use: job_step_insert
    SELECT v.run_id,
           -- use: job_step_values
    FROM v
    JOIN run ON run.id = v.run_id
    ORDER BY v.ord
    RETURNING id, run_id
)
SELECT v.ord, step.id AS step_id, step.run_id
FROM step
JOIN v ON v.run_id = step.run_id
ORDER BY v.ord;


-- name: steps_find_submit_keys
-- The runs of kind %(kind)s that hold the given submit keys (in any state, until they
-- are purged) and the step of each: what a duplicate enqueue returns. A key held by a
-- run of a workflow of the same name comes back with its def_version and no step.
SELECT r.submit_key, s.id AS step_id, r.id AS run_id, r.def_version
FROM cyclone_runs r
LEFT JOIN cyclone_steps s
       ON s.run_id = r.id AND s.node = r.workflow AND r.def_version = 'job'
WHERE r.workflow = %(kind)s
  AND r.submit_key = ANY(%(submit_keys)s::text[]);
