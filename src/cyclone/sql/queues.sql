-- Statements on cyclone_queue_pauses: pausing and resuming a queue (migration 9).
--
-- A queue is paused while it has a row here; every claim statement checks that no row
-- names its queue, in the snapshot it starts with. A pause is committed by the time
-- `pause_queue` returns, so a claim that starts afterwards takes nothing from the
-- queue. Each statement is one autocommit statement: no lock is held beyond it.


-- name: queues_pause
-- Pause a queue. No row comes back when it was paused already (its first paused_at
-- and paused_by stay); a queue need not have any step to be paused.
INSERT INTO cyclone_queue_pauses (queue, paused_by)
VALUES (%(queue)s, %(paused_by)s)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;


-- name: queues_resume
-- Resume a queue. No row comes back when it was not paused.
DELETE FROM cyclone_queue_pauses
WHERE queue = %(queue)s
RETURNING queue;
