-- Statements on cyclone_signals: the durable mailbox of signal waits.
--
-- A signal is stored only up to the useful capacity of the wait that declares its name
-- (1 for wait_signal and wait_any, N for wait_n) and only while that wait has not
-- completed; consumption marks consumed_by and consumed_at, and the row stays for audit
-- until its run is purged. Every statement here runs after the run row is locked.


-- name: signals_run_lock
-- Lock one run for a signal delivery; its state tells whether it can still receive.
SELECT id, state
FROM cyclone_runs
WHERE id = %(run_id)s
FOR UPDATE;


-- name: signals_waits
-- The wait nodes of the given runs that declare signal names (wait_count: wait_n's N).
SELECT s.id, s.run_id, s.node, s.state, s.signal_name, s.signal_names, s.wait_count
FROM cyclone_steps s
WHERE s.run_id = ANY(%(run_ids)s::bigint[])
  AND s.kind = '@signal';


-- name: signals_unconsumed
-- The mailbox rows of the given runs not consumed yet, in delivery order
-- (idx_signals_unconsumed).
SELECT g.id, g.run_id, g.name, g.payload
FROM cyclone_signals g
WHERE g.run_id = ANY(%(run_ids)s::bigint[])
  AND g.consumed_by IS NULL
ORDER BY g.id;


-- name: signals_insert
-- Store one delivered signal.
INSERT INTO cyclone_signals (run_id, name, payload)
VALUES (%(run_id)s, %(name)s, %(payload)s::jsonb)
RETURNING id;


-- name: signals_consume
-- Mark mailbox rows consumed by the wait nodes that take them (CAS on not consumed).
UPDATE cyclone_signals g
SET consumed_by = v.node,
    consumed_at = now()
FROM unnest(%(ids)s::bigint[], %(nodes)s::text[]) AS v (id, node)
WHERE g.id = v.id
  AND g.consumed_by IS NULL
RETURNING g.id;


-- name: signals_ready_runs
-- The wait scanner's signal pass: lock runs (skipping those another transaction holds)
-- that have a signal wait whose mailbox holds all it needs (signals that came before the
-- wait was reached). Partly filled waits are not selected, so they cannot crowd out
-- the ones ready.
SELECT r.id
FROM cyclone_runs r
WHERE r.id IN (
    SELECT s.run_id
    FROM cyclone_steps s
    WHERE s.state = 'waiting_signal'
      AND (SELECT count(*)
           FROM cyclone_signals g
           WHERE g.run_id = s.run_id
             AND g.consumed_by IS NULL
             AND (g.name = s.signal_name OR g.name = ANY(s.signal_names)))
          >= coalesce(s.wait_count, 1)
    ORDER BY s.id
    LIMIT %(limit)s)
ORDER BY r.id
FOR UPDATE SKIP LOCKED;
