-- Statements of the wakeup channels (engine-design, LISTEN/NOTIFY and the Polling Floor).
-- Channels: cyclone_available (payload {"queue": ...}) and cyclone_run_done (payload
-- {"runs": [...]}). Always sent in their own transaction, after the work they announce
-- has committed. Skipped while the server's notification queue is over half full, so
-- a stuck listener can never make them fail: polling is the floor.


-- name: notify_publish
-- Send many notifications in one transaction (one per channel and payload pair).
SELECT pg_notify(t.channel, t.payload)
FROM unnest(%(channels)s::text[], %(payloads)s::text[]) AS t (channel, payload)
WHERE pg_notification_queue_usage() < 0.5;


-- name: notify_available
-- Announce one queue (the common case: a prepared statement with one parameter).
SELECT pg_notify('cyclone_available', %(payload)s)
WHERE pg_notification_queue_usage() < 0.5;


-- name: notify_runs_done
-- Announce which of the given runs are terminal now. Sent after the transaction that
-- ended them (as a statement after its COMMIT), so a listener that wakes sees them.
SELECT pg_notify('cyclone_run_done', json_build_object('runs', array_agg(id ORDER BY id))::text)
FROM cyclone_runs
WHERE id = ANY(%(run_ids)s::bigint[])
  AND state IN ('completed', 'failed', 'cancelled')
  AND pg_notification_queue_usage() < 0.5
HAVING count(*) > 0;


-- name: notify_listen
-- Subscribe the listener connection to both channels.
LISTEN cyclone_available;


-- name: notify_listen_done
LISTEN cyclone_run_done;
