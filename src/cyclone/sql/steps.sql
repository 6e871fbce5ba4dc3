-- Statements on cyclone_steps: heartbeat, outcomes, recovery (the claim is in
-- claims.sql, the enqueue in enqueue.sql, the wait scanner's statements in waits.sql).
--
-- Every state transition here is a compare-and-swap: the WHERE clause names the state
-- the row must be in and, for a worker's transition, the lease owner and the lease
-- generation of its claim. Zero rows changed is a benign stale transition.
-- Durations arrive as microseconds (bigint) so that now() on the database computes
-- every timestamp: one clock for the whole lease model. The completion statements use
-- statement_timestamp(), the same clock read when they run: a completion transaction
-- opened by ctx.completion_tx() at a handler's start may last long, and now() would
-- date the completion (and a wait it reaches) back to that start.
--
-- A row that a statement reaches through its primary key (a held step, the run of a
-- completed step) writes its state guard as "(state = '...') IS TRUE": the same test,
-- in a form the planner cannot match against a partial index on state (idx_steps_lease,
-- idx_steps_claim) or lead with in idx_runs_state_id. With statistics taken while
-- nothing ran, those indexes look empty, and a guard written plainly lets the planner
-- read every running step or run there instead of the one row by its key. A batch of
-- rows named by id (a completion batch) also names them as "s.id = ANY(ARRAY(...))":
-- an array the planner prices at a few rows, so that it never hashes a scan of the
-- whole table for them. The plan test (tests/db/test_history_plans.py) holds every hot
-- statement to this.


-- fragment: step_given_back
-- The assignments that give a held step s back: claimable again (available, or paused
-- in a paused run), its lease cleared. Last in its SET list.
state = CASE WHEN EXISTS (
        SELECT 1 FROM cyclone_runs r WHERE r.id = s.run_id AND r.state = 'paused')
    THEN 'paused' ELSE 'available' END,
lease_owner = NULL,
lease_expiry = NULL


-- fragment: lease_cas
-- The CAS of a statement on held steps s, each named with its lease by a row of v (id,
-- generation, owner): a row changes only while its step runs under that lease.
AND (s.state = 'running') IS TRUE
AND s.lease_owner = v.owner
AND s.lease_generation = v.generation


-- fragment: sequence_step_ahead
-- A step e of the sequence key of step s that keeps s from the head of its key: e is
-- active and running, or comes first in the key's order (steps started before, a
-- failed attempt waiting out its backoff, a reclaim or a snooze, first; then by
-- (scheduled_at, id)). The row comparison reads: e comes first if e is started and s
-- is not, or both are alike and e is earlier.
SELECT 1
FROM cyclone_steps e
WHERE e.sequence_key = s.sequence_key
  AND e.state NOT IN ('completed', 'discarded', 'cancelled')
  AND e.id <> s.id
  AND (e.state = 'running'
       OR ((e.attempt > 0 OR e.reclaims > 0 OR e.snoozes > 0), s.scheduled_at, s.id)
          > ((s.attempt > 0 OR s.reclaims > 0 OR s.snoozes > 0), e.scheduled_at, e.id))


-- fragment: step_bindings
-- A workflow step's input bindings in slot order, as two aligned arrays (upstream node,
-- assembly mode; NULL for none), and a third aligned with them when the bindings are
-- named (their input names, migration 10; NULL for positional bindings): the caller
-- adds the WHERE that names the step.
SELECT array_agg(i.dep_node ORDER BY i.slot) AS binding_nodes,
       array_agg(i.assembly_mode ORDER BY i.slot) AS binding_modes,
       array_agg(i.input_name ORDER BY i.slot) FILTER (WHERE i.input_name IS NOT NULL)
           AS binding_names
FROM cyclone_step_inputs i


-- name: steps_sequence_lock
-- Take the transaction-scoped advisory lock of each sequence key, in a fixed order so
-- that two rechecks never deadlock. Held until the recheck commits.
SELECT pg_advisory_xact_lock(hashtextextended('cyclone.sequence:' || k, 0))
FROM (SELECT DISTINCT k FROM unnest(%(keys)s::text[]) AS k ORDER BY k) AS keys;


-- name: steps_sequence_release
-- Under the key locks and with a snapshot taken after them, give back each freshly
-- claimed sequenced step that is not the head of its key after all (a competing claim
-- or an earlier step committed concurrently). No attempt and no reclaim is counted.
UPDATE cyclone_steps s
SET state = 'available',
    lease_owner = NULL,
    lease_expiry = NULL
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[], %(owners)s::text[])
    AS v (id, generation, owner)
WHERE s.id = v.id
  -- use: lease_cas
  AND EXISTS (
      -- use: sequence_step_ahead
  )
RETURNING s.id;


-- name: steps_heartbeat
-- Leases and heartbeats: renew the leases of held steps, every renewal a
-- client has due in one statement per heartbeat tick. %(ids)s, %(owners)s and
-- %(generations)s are aligned array literals (one text parameter each). Each row keeps
-- its own guard (state, owner, generation); the timeout clause makes the per-step
-- timeout durable: past started_at + timeout the lease is no longer renewed and the
-- sweep takes the step. The statement never waits for a row lock (SKIP LOCKED): it
-- renews many rows that a completion, a cancel or the sweep may be changing in another
-- order at the same moment, and a statement that waits for nothing cannot deadlock.
-- Rows back: (id, owner, true) renewed; (id, owner, false) busy (still held in this
-- statement's snapshot but locked elsewhere: try again at the next tick). A step with
-- no row back lost its lease.
WITH v AS (
    SELECT *
    FROM unnest(%(ids)s::bigint[], %(owners)s::text[], %(generations)s::bigint[])
        AS v (id, owner, generation)
), held AS (
    -- one primary-key probe per renewal, whatever the table's size and statistics
    SELECT h.id
    FROM v
    CROSS JOIN LATERAL (
        SELECT s.id
        FROM cyclone_steps s
        WHERE s.id = v.id
          -- use: lease_cas
          AND (s.timeout IS NULL OR s.started_at + s.timeout > now())
        FOR NO KEY UPDATE OF s SKIP LOCKED) h
), renewed AS (
    UPDATE cyclone_steps s
    SET lease_expiry = now() + %(ttl_us)s::bigint * interval '1 microsecond',
        heartbeat_at = now()
    FROM held, v
    WHERE s.id = ANY(ARRAY(SELECT id FROM held))
      AND s.id = held.id
      AND v.id = s.id
      -- use: lease_cas
      AND (s.timeout IS NULL OR s.started_at + s.timeout > now())
    RETURNING s.id, s.lease_owner
)
SELECT id, lease_owner AS owner, true AS renewed
FROM renewed
UNION ALL
SELECT v.id, v.owner, false
FROM v
WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.id = v.id AND r.lease_owner = v.owner)
  -- a primary-key probe per busy row (OFFSET 0 keeps it a subplan, never a join)
  AND EXISTS (
      SELECT 1
      FROM cyclone_steps s
      WHERE s.id = v.id
        -- use: lease_cas
        AND (s.timeout IS NULL OR s.started_at + s.timeout > now())
      OFFSET 0);


-- name: steps_complete
-- Complete held steps of standalone runs (one step per run), each row guarded by its
-- own CAS, and finish their runs. Runs in the transaction that locked those runs
-- (runs_lock), after the handler's completion_tx() writes when there are any.
-- The steps come as aligned arrays (%(job_ids)s, %(job_generations)s, %(job_owners)s,
-- %(job_outputs)s); a null output is stored as SQL NULL. The hot path of jobs: a run of
-- one step has no dependents to advance (graph_advance does).
WITH v AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(job_generations)s::bigint[],
                %(job_owners)s::text[], %(job_outputs)s::jsonb[])
        AS v (id, generation, owner, output)
), done AS (
    -- use: complete_steps_in_v
      -- use: lease_cas
    RETURNING s.id, s.run_id
), finished AS (
    -- use: run_completed_by_statement
    FROM done
    WHERE r.id = done.run_id
      AND (r.state IN ('running', 'paused')) IS TRUE
      AND NOT EXISTS (
          SELECT 1
          FROM cyclone_steps o
          WHERE o.run_id = r.id
            AND o.id <> done.id
            AND o.state NOT IN ('completed', 'discarded', 'cancelled'))
    RETURNING r.id
)
SELECT done.id, done.run_id, finished.id IS NOT NULL AS run_finished, NULL::text[] AS queues,
       false AS signals, false AS children, false AS fan_outs
FROM done
LEFT JOIN finished ON finished.id = done.run_id;


-- name: steps_outputs
-- Output Resolution: the outputs of upstream steps by (run_id, node), as JSON text (the
-- worker measures and caches the text). Only completed steps have one.
SELECT s.run_id, s.node, s.output::text
FROM unnest(%(run_ids)s::bigint[], %(nodes)s::text[]) AS k (run_id, node)
JOIN cyclone_steps s ON s.run_id = k.run_id AND s.node = k.node
WHERE s.state = 'completed';


-- name: steps_release_mismatch
-- docs/design.md, Who claims what: a worker whose definition of the run's workflow differs
-- gives the freshly claimed steps back after a short delay, for a worker that has the
-- run's definition. No attempt and no reclaim is counted; error_kind tells the operator.
UPDATE cyclone_steps s
SET state = 'available',
    lease_owner = NULL,
    lease_expiry = NULL,
    scheduled_at = now() + %(delay_us)s::bigint * interval '1 microsecond',
    error = v.error,
    error_kind = 'def_version_mismatch'
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[], %(owners)s::text[], %(errors)s::text[])
    AS v (id, generation, owner, error)
WHERE s.id = v.id
  -- use: lease_cas
RETURNING s.id, s.queue;


-- name: steps_retry
-- A failed attempt with attempts left: count it, record the error, and make the step
-- claimable again after the backoff delay (computed by the caller, applied on the
-- database clock); in a paused run it is parked as paused until resume.
UPDATE cyclone_steps s
SET attempt = attempt + 1,
    error = %(error)s,
    error_kind = %(error_kind)s,
    panic_stack = %(panic_stack)s,
    scheduled_at = now() + %(delay_us)s::bigint * interval '1 microsecond',
    -- use: step_given_back
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_owner = %(owner)s
  AND lease_generation = %(generation)s
RETURNING id;


-- name: steps_discard
-- A failed attempt with no attempts left, or a Discard: the step is dead-lettered.
-- Runs after runs_lock and before graph_resolve_discard in one transaction.
UPDATE cyclone_steps
SET state = 'discarded',
    attempt = attempt + 1,
    error = %(error)s,
    error_kind = %(error_kind)s,
    panic_stack = %(panic_stack)s,
    -- use: step_closed
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_owner = %(owner)s
  AND lease_generation = %(generation)s
RETURNING id;


-- name: steps_release
-- Give held steps back without counting an attempt or a reclaim (graceful shutdown).
-- scheduled_at is unchanged: another worker may claim them at once (in a paused run
-- they are parked as paused).
UPDATE cyclone_steps s
SET
    -- use: step_given_back
FROM unnest(%(ids)s::bigint[], %(generations)s::bigint[], %(owners)s::text[])
    AS v (id, generation, owner)
WHERE s.id = v.id
  -- use: lease_cas
RETURNING s.id, s.queue;


-- name: steps_sweep_candidates
-- Running steps whose timeout passed (idx_steps_timeout), even while their heartbeats
-- still run, then those whose lease expired (idx_steps_lease). A step in both lists
-- comes first as a timeout.
(SELECT id, run_id, lease_generation, reclaims, true AS timed_out, node, kind, queue
 FROM cyclone_steps
 WHERE state = 'running'
   AND timeout IS NOT NULL
   AND started_at + timeout <= now()
 LIMIT %(limit)s)
UNION ALL
(SELECT id, run_id, lease_generation, reclaims, false AS timed_out, node, kind, queue
 FROM cyclone_steps
 WHERE state = 'running'
   AND lease_expiry < now()
 LIMIT %(limit)s);


-- name: steps_reclaim
-- The recovery sweep gives one step back: available again at once (scheduled_at
-- unchanged), lease cleared, reclaims + 1, attempt unchanged (a reclaim is not an
-- attempt; parked as paused in a paused run). Guarded on the generation the sweep read
-- and on the expiry still holding.
UPDATE cyclone_steps s
SET reclaims = reclaims + 1,
    error = %(error)s,
    error_kind = %(error_kind)s,
    -- use: step_given_back
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_generation = %(generation)s
  AND (lease_expiry < now() OR (timeout IS NOT NULL AND started_at + timeout <= now()))
RETURNING id, queue;


-- name: steps_reclaim_discard
-- The recovery sweep dead-letters a step past max_reclaims (error_kind reclaim_limit);
-- this is not a reclaim, so reclaims stays at the limit. Runs after runs_lock and
-- before graph_resolve_discard in one transaction.
UPDATE cyclone_steps
SET state = 'discarded',
    error = %(error)s,
    error_kind = 'reclaim_limit',
    -- use: step_closed
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_generation = %(generation)s
  AND (lease_expiry < now() OR (timeout IS NOT NULL AND started_at + timeout <= now()))
RETURNING id;


-- name: steps_list
-- Every step of one run, in insertion order (topological, then definition order). The
-- input shown is the constant or the run input; for a data edge the upstream output
-- once it exists; for a fan-in (cyclone_step_inputs) nothing.
-- use: step_record
WHERE s.run_id = %(run_id)s
ORDER BY s.id;


-- name: steps_get
-- One step by its id (the step_id of a handle, a context or a log line), as steps_list
-- shows it; no row for an unknown id. By the primary key.
-- use: step_record
WHERE s.id = %(step_id)s;


-- name: steps_tx_backend
-- The server process of the current completion transaction and the transaction's start
-- (what pg_stat_activity shows as xact_start): behind a pooler the process id the
-- connection reports is the pooler's, and the process serves other clients once the
-- transaction ends. On a connection pinned to a schema (a transaction pooler) this
-- statement also sets the schema for the handler's own statements.
SELECT pg_backend_pid() AS pid, now() AS xact_start;


-- name: steps_end_tx_backend
-- End the completion transaction of a sync handler that overran its timeout: terminate
-- its server process (which rolls the transaction back and releases its locks) while
-- that process still runs that transaction. A process whose transaction ended, or that
-- a pooler lent on to another client since, is left alone. The engine's role may
-- signal processes of its own role.
SELECT pg_terminate_backend(a.pid) AS terminated
FROM pg_stat_activity a
WHERE a.pid = %(pid)s
  AND a.xact_start = %(xact_start)s
  AND a.backend_type = 'client backend';


-- name: steps_snooze
-- A handler raised Snooze (cyclone.snoozing): give the held step back for later without
-- counting an attempt. snoozes + 1, claimable again at now() + %(delay_us)s on the
-- database clock (in a paused run it is parked as paused until resume), lease cleared;
-- attempt, error, error_kind and panic_stack stay as they were (a snooze is not a
-- failure: they keep telling the last failed attempt, if any). Only while the step has
-- snoozed fewer than %(max_snoozes)s times: no row back is either a step at its limit
-- (steps_snooze_discard follows) or a stale snooze (the lease was lost before it).
UPDATE cyclone_steps s
SET snoozes = snoozes + 1,
    scheduled_at = now() + %(delay_us)s::bigint * interval '1 microsecond',
    -- use: step_given_back
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_owner = %(owner)s
  AND lease_generation = %(generation)s
  AND snoozes < %(max_snoozes)s
RETURNING id, snoozes;


-- name: steps_snooze_discard
-- A handler raised Snooze once more than its kind's max_snoozes allows: the step is
-- dead-lettered with error_kind 'snooze_limit' (the error names the count and the
-- limit; panic_stack is where the handler raised it). Not a snooze (snoozes stays at the
-- limit) but a failed attempt, as a Discard is (attempt + 1). Runs after runs_lock and
-- before graph_resolve_discard in one transaction, as steps_discard; no row back is a
-- stale snooze.
UPDATE cyclone_steps
SET state = 'discarded',
    attempt = attempt + 1,
    error = 'snoozed ' || snoozes || ' times, max_snoozes is ' || %(max_snoozes)s::int,
    error_kind = 'snooze_limit',
    panic_stack = %(panic_stack)s,
    -- use: step_closed
WHERE id = %(id)s
  AND (state = 'running') IS TRUE
  AND lease_owner = %(owner)s
  AND lease_generation = %(generation)s
  AND snoozes >= %(max_snoozes)s
RETURNING id;
