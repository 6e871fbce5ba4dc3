-- Statements of the wakeup channels (LISTEN/NOTIFY; polling is the floor).
-- Channels: cyclone_available (payload {"queue": ...}) and cyclone_run_done (payload
-- {"runs": [...]}). Always sent in their own transaction, after the work they announce
-- has committed, and never in the message of its COMMIT: a NOTIFY that fails must not
-- turn committed work into an error. Skipped while the server's notification queue is
-- over half full, so a stuck listener cannot fill it further: polling is the floor.


-- name: notify_publish
-- Send many notifications in one transaction (one per channel and payload pair).
SELECT pg_notify(t.channel, t.payload)
FROM unnest(%(channels)s::text[], %(payloads)s::text[]) AS t (channel, payload)
WHERE pg_notification_queue_usage() < 0.5;


-- name: notify_available
-- Announce one queue (the common case: a prepared statement with one parameter).
SELECT pg_notify('cyclone_available', %(payload)s)
WHERE pg_notification_queue_usage() < 0.5;


-- name: notify_listen
-- Subscribe the listener connection of a client with workers to the work channel, for
-- as long as the connection lasts.
LISTEN cyclone_available;


-- name: notify_listen_done
-- Subscribe the listener connection to the run-done channel: only while a wait of its
-- client is pending (notify.Listener), so that no worker decodes run-done notifications
-- nobody waits for.
LISTEN cyclone_run_done;


-- name: notify_unlisten_done
-- Unsubscribe from the run-done channel, a while after the client's last wait ended.
UNLISTEN cyclone_run_done;
