-- Read-only inspection for operators: the `cyclone` command, client statistics and the
-- database gauges of the Prometheus metrics (cyclone.observability).
--
-- Every statement here only reads, mostly through the monitoring views (cyclone_v_steps
-- and cyclone_v_kinds of the first migration, cyclone_queues_v1 of the ninth). Ages come
-- back as seconds (float8) so that callers need no interval parsing.


-- name: monitor_queues
-- One row per queue with unfinished steps or paused (cyclone_queues_v1: the counts of
-- cyclone_v_queues and the queue's pause), in queue name order.
SELECT v.queue,
       v.available,
       v.running,
       v.waiting,
       extract(epoch FROM v.oldest_available_age)::float8 AS oldest_available_age,
       v.expired_leases,
       v.paused
FROM cyclone_queues_v1 v
ORDER BY v.queue;


-- name: monitor_kinds
-- One row per (kind, state) of every step stored (cyclone_v_kinds).
SELECT v.kind,
       v.state,
       v.count,
       extract(epoch FROM v.oldest_available_age)::float8 AS oldest_available_age,
       v.expired_leases
FROM cyclone_v_kinds v
ORDER BY v.kind, v.state;


-- name: monitor_steps
-- Steps, newest first, each filter applied only when given (NULL means any). The
-- child run of a child node comes from idx_runs_parent.
SELECT v.id, v.run_id, v.node, v.kind, v.state, v.queue, v.priority, v.attempt,
       v.max_attempts, v.error, v.error_kind, v.panic_stack, v.lease_owner,
       v.lease_expiry, coalesce(v.lease_expired, false) AS lease_expired,
       v.heartbeat_at, v.reclaims, v.signal_name, v.item_of, v.item_index,
       v.scheduled_at, v.created_at, v.started_at, v.completed_at,
       c.id AS child_run_id
FROM cyclone_v_steps v
LEFT JOIN cyclone_runs c ON c.parent_run_id = v.run_id AND c.parent_node_id = v.node
WHERE (%(run_id)s::bigint IS NULL OR v.run_id = %(run_id)s::bigint)
  AND (%(state)s::text IS NULL OR v.state = %(state)s::text)
  AND (%(kind)s::text IS NULL OR v.kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR v.queue = %(queue)s::text)
ORDER BY v.id DESC
LIMIT %(limit)s;


-- name: monitor_run_deps
-- The edges of one run's DAG: each (node, dep_node) pair of cyclone_deps, node after
-- dep_node, whether a data or a control edge.
SELECT d.node, d.dep_node
FROM cyclone_deps d
WHERE d.run_id = %(run_id)s
ORDER BY d.node, d.dep_node;


-- name: monitor_schedules_overdue
-- Enabled schedules whose next fire is more than a minute late by the database clock
-- (what `cyclone schedules` marks overdue): no running client fires them. From
-- idx_schedules_due.
SELECT count(*) AS total
FROM cyclone_schedules c
WHERE c.enabled
  AND c.next_run_at < now() - interval '1 minute';
