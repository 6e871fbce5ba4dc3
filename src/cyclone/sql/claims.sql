-- The claim: the statements that move available steps to running under a fresh lease,
-- and flow control (docs/flow-control.md), which acts nowhere else. The conventions
-- of steps.sql hold here.
--
-- A claim names one queue, the kinds its worker registers and the def_versions it has
-- found foreign. Every claim statement starts with the CTE "here", one row: the queue,
-- the kinds this statement may take, the foreign versions, whether the queue is open
-- (no row in cyclone_queue_pauses) and whether it holds steps with a fairness key
-- (fair). The kinds split by cyclone_kind_limits, read in the statement: a kind with a
-- max_concurrency or a rate_limit stored there is taken only by the limited claim
-- (steps_claim_limited or steps_claim_limited_fair, then steps_claim_admit), every
-- other kind only by steps_claim or steps_claim_fair. A worker runs the limited claim
-- only while the limits it last read say one of its kinds is limited; a kind limited
-- since is skipped by the other claim until then, never claimed past its limit. Each
-- has a statement for a queue without fairness keys and one for a queue with them
-- (each a plan of its own, so that a claim without fairness pays nothing for it): run
-- in the wrong one, a claim takes nothing and tells, and the worker runs the other.
--
-- Plan: the LIMIT is a constant (cyclone.sql.claim_sql writes one of CLAIM_LIMITS), and
-- the queue, the kinds and the foreign versions are read through one-row sub-SELECTs
-- of "here", which no plan can look into: the generic plan of the prepared claim then
-- costs what a custom one does, so PostgreSQL keeps it after five executions and stops
-- planning every claim (half of the claim's server time).


-- fragment: claim_filter
-- The conditions every claim puts on an available step s of the queue, beyond its
-- queue and state: due; of a kind of "here"; not a fan-out node (the scanner's); not
-- of a run whose def_version this worker found foreign (a def_version names its
-- workflow too; OFFSET 0 keeps a primary-key probe per row, never a hash of every
-- run); at the head of its sequence key if it has one.
AND s.scheduled_at <= now()
AND s.kind = ANY((SELECT kinds FROM here)::text[])
AND s.fan_out_parallel IS NULL
AND (cardinality((SELECT foreign_versions FROM here)) = 0 OR NOT EXISTS (
        SELECT 1
        FROM cyclone_runs f
        WHERE f.id = s.run_id
          AND f.def_version = ANY((SELECT foreign_versions FROM here)::text[])
        OFFSET 0))
AND (s.sequence_key IS NULL OR NOT EXISTS (
        -- use: sequence_step_ahead
    ))


-- fragment: claim_limit_filter
-- The limited claim's further conditions on a step s: not in a concurrency group that
-- is full, nor in a rate bucket that is spent, in this statement's snapshot
-- (steps_claim_admit decides, under the groups' locks).
AND NOT EXISTS (
    SELECT 1
    FROM group_places g
    WHERE g.kind = s.kind
      AND g.key = coalesce(s.concurrency_key, '')
      AND g.free <= 0)
AND NOT EXISTS (
    SELECT 1
    FROM cyclone_rate_buckets b
    JOIN cyclone_kind_limits l ON l.kind = b.kind
    WHERE b.kind = s.kind
      AND b.key = coalesce(s.rate_key, '')
      AND l.rate_count IS NOT NULL
      AND ((cardinality(b.starts) >= l.rate_count + l.rate_burst
            AND b.starts[cardinality(b.starts) - l.rate_count - l.rate_burst + 1]
                > now() - l.rate_per * interval '1 second')
           OR (l.rate_burst > 0
               AND b.tokens + extract(epoch FROM now() - b.updated_at)
                              * l.rate_count / l.rate_per < 1)))


-- fragment: claim_here
-- The rest of "here" after its kinds: the queue, the foreign versions, the fairness key
-- this worker's last claim of the queue ended its turn with (after), the pause and
-- the fairness probe (the first key in idx_steps_fairness order: one probe of that
-- index, empty unless steps have a fairness key, whatever the statistics say), from
-- q, the claim's parameters.
q.queue,
q.foreign_versions,
q.after,
NOT EXISTS (SELECT 1 FROM cyclone_queue_pauses p WHERE p.queue = q.queue) AS open,
(SELECT f.fairness_key
 FROM cyclone_steps f
 WHERE f.queue = q.queue
   AND f.state = 'available'
   AND f.fairness_key IS NOT NULL
 ORDER BY f.fairness_key
 LIMIT 1) IS NOT NULL AS fair


-- fragment: claim_params
-- q: the claim's parameters as one row.
(SELECT %(queue)s::text AS queue, %(kinds)s::text[] AS kinds,
        %(foreign)s::text[] AS foreign_versions, %(after)s::text AS after) AS q


-- fragment: group_places
-- The concurrency groups of the limited kinds with running steps, and their free
-- places in this snapshot (zero or less: full): the running steps counted from
-- idx_steps_concurrency (every running step of a limited kind has a key there:
-- steps_claim_admit writes '' for none). Empty outside the limited claim.
group_places AS (
    SELECT s.kind, s.concurrency_key AS key, l.max_concurrency - count(*) AS free
    FROM cyclone_kind_limits l
    JOIN cyclone_steps s ON s.kind = l.kind
    WHERE l.kind = ANY((SELECT kinds FROM here)::text[])
      AND l.max_concurrency IS NOT NULL
      AND s.state = 'running'
      AND s.concurrency_key IS NOT NULL
    GROUP BY s.kind, s.concurrency_key, l.max_concurrency
)


-- fragment: fair_heads
-- Fairness: while the queue holds steps with a fairness key, claims rotate across the
-- keys. fair_keys steps from key to key of the queue through idx_steps_fairness (one
-- probe per key); fair_heads reads the first %(limit)s claimable steps of each key in
-- claim order, numbered (rn), and as many of the steps without a key (one more key of
-- the rotation, fkey ''). The claim then takes them by (priority, rn, turn): the first
-- step of every key before the second of any, within a priority, and the keys in
-- turn, starting after the key this worker's last claim of the queue ended with (after)
-- and wrapping around, so that claims of one step at a time still go round every key.
-- Steps of a concurrency group that is full (full_groups, which the statement defines:
-- empty without limits) are read past, so that they cannot hide a key's other steps.
-- The cost is a probe per key with available steps, and up to %(limit)s rows per key,
-- at every claim.
fair_keys (key) AS (
    SELECT (SELECT f.fairness_key
            FROM cyclone_steps f
            WHERE f.queue = (SELECT queue FROM here)
              AND f.state = 'available'
              AND f.fairness_key IS NOT NULL
            ORDER BY f.fairness_key
            LIMIT 1)
    WHERE (SELECT open AND fair FROM here)
    UNION ALL
    SELECT (SELECT f.fairness_key
            FROM cyclone_steps f
            WHERE f.queue = (SELECT queue FROM here)
              AND f.state = 'available'
              AND f.fairness_key > k.key
            ORDER BY f.fairness_key
            LIMIT 1)
    FROM fair_keys k
    WHERE k.key IS NOT NULL
), fair_heads AS (
    SELECT h.id, h.priority, h.rn, h.scheduled_at, h.kind, h.concurrency_key, h.rate_key,
           h.fkey, (h.fkey <= (SELECT after FROM here), h.fkey) AS turn
    FROM fair_keys k
    CROSS JOIN LATERAL (
        SELECT s.id, s.priority, s.scheduled_at, s.kind, s.concurrency_key, s.rate_key,
               s.fairness_key AS fkey,
               row_number() OVER (ORDER BY s.priority DESC, s.scheduled_at) AS rn
        FROM cyclone_steps s
        WHERE s.queue = (SELECT queue FROM here)
          AND s.fairness_key = k.key
          AND s.state = 'available'
          -- use: claim_filter
          AND NOT EXISTS (
              SELECT 1
              FROM full_groups g
              WHERE g.kind = s.kind AND g.key = coalesce(s.concurrency_key, ''))
        ORDER BY s.priority DESC, s.scheduled_at
        LIMIT %(limit)s) h
    WHERE k.key IS NOT NULL
    UNION ALL
    SELECT h.id, h.priority, h.rn, h.scheduled_at, h.kind, h.concurrency_key, h.rate_key,
           h.fkey, (h.fkey <= (SELECT after FROM here), h.fkey) AS turn
    FROM (
        SELECT s.id, s.priority, s.scheduled_at, s.kind, s.concurrency_key, s.rate_key,
               ''::text AS fkey,
               row_number() OVER (ORDER BY s.priority DESC, s.scheduled_at) AS rn
        FROM cyclone_steps s
        WHERE (SELECT open AND fair FROM here)
          AND s.queue = (SELECT queue FROM here)
          AND s.state = 'available'
          AND s.fairness_key IS NULL
          -- use: claim_filter
          AND NOT EXISTS (
              SELECT 1
              FROM full_groups g
              WHERE g.kind = s.kind AND g.key = coalesce(s.concurrency_key, ''))
        ORDER BY s.priority DESC, s.scheduled_at
        LIMIT %(limit)s) h
)


-- fragment: claim_clock
-- The start time a claim writes (started_at): the clock read once, when the statement
-- first needs it, which is after its snapshot was taken. now() is the start of the
-- statement's transaction, before its planning (a few milliseconds for a custom plan):
-- a step made available by a completion that committed meanwhile would then seem to
-- start before its upstream step completed.
SELECT clock_timestamp() AS at


-- fragment: claim_returning
-- What a claim returns of each step it moved to running (see steps_claim), and
-- whether the queue holds steps with a fairness key (the same on every row). The
-- input is the step's own (a constant, a fan-out item) or else its run's; none for a
-- step with a data edge (the worker assembles it from upstream outputs). run_input is
-- the run's input as JSON text, read by ctx.run_input, and only for a workflow step
-- whose input is not the run input: a standalone job's run input is its input, and
-- so is that of a workflow step that takes the run input.
RETURNING s.id, s.run_id, s.node, s.kind,
          CASE WHEN s.input_from IS NULL AND c.binding_nodes IS NULL
               THEN coalesce(s.input, c.input) END AS input,
          CASE WHEN c.def_version <> 'job'
                    AND (s.input IS NOT NULL OR s.input_from IS NOT NULL
                         OR c.binding_nodes IS NOT NULL)
               THEN coalesce(c.input::text, 'null') END AS run_input,
          s.attempt, s.max_attempts, s.lease_generation,
          extract(epoch FROM s.timeout)::float8 AS timeout_s,
          s.sequence_key, c.workflow, c.def_version, s.input_from, c.has_fan_out,
          c.binding_nodes, c.binding_modes, c.binding_names, s.reclaims, c.traceparent,
          s.fairness_key,
          extract(epoch FROM s.started_at - CASE
              WHEN c.def_version = 'job' OR NOT (SELECT %(latency)s::boolean) THEN s.scheduled_at
              ELSE greatest(s.scheduled_at, (
                  SELECT max(p.completed_at)
                  FROM cyclone_deps d
                  JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
                  WHERE d.run_id = s.run_id AND d.node = s.node)) END
          )::float8 AS queue_latency_s,
          (SELECT fair FROM here) AS fair


-- fragment: claim_marker
-- The row a claim returns when the queue's mode (fair or not) is not the one it was
-- run for: it claimed nothing, and the worker runs the other claim at once.
SELECT NULL::bigint, NULL::bigint, NULL::text, NULL::text, NULL::jsonb, NULL::text,
       NULL::integer, NULL::integer, NULL::bigint, NULL::float8, NULL::text, NULL::text,
       NULL::text, NULL::text, NULL::boolean, NULL::text[], NULL::text[], NULL::text[],
       NULL::integer, NULL::text, NULL::text, NULL::float8, (SELECT fair FROM here)


-- fragment: claim_here_unlimited
-- "here" of the claim of the kinds without limits: the worker's kinds that
-- cyclone_kind_limits does not list as limited (a primary-key probe per kind).
here AS (
    SELECT ARRAY(SELECT k
                 FROM unnest(q.kinds) AS k
                 WHERE NOT EXISTS (
                     SELECT 1
                     FROM cyclone_kind_limits l
                     WHERE l.kind = k
                       AND (l.max_concurrency IS NOT NULL OR l.rate_count IS NOT NULL)))
               AS kinds,
           -- use: claim_here
    FROM
        -- use: claim_params
), clock AS (
    -- use: claim_clock
)


-- fragment: claim_runnable
-- The steps of a claim's CTE claimable (id, run_id, node, state, max_concurrency) whose
-- run is running (a paused run's step is never taken, whatever raced it back to
-- available), with what the claim returns of the run: its input, workflow,
-- def_version, fan-out flag and trace context, and a workflow step's input bindings
-- (with their names when named).
runnable AS (
    SELECT c.id, c.state, c.max_concurrency, r.input, r.workflow, r.def_version,
           r.has_fan_out, r.traceparent, b.binding_nodes, b.binding_modes, b.binding_names
    FROM claimable c
    CROSS JOIN LATERAL (
        SELECT r.state, r.input, r.workflow, r.def_version, r.has_fan_out, r.traceparent
        FROM cyclone_runs r
        WHERE r.id = c.run_id
        OFFSET 0) r
    CROSS JOIN LATERAL (
        -- use: step_bindings
        WHERE r.def_version <> 'job'
          AND i.run_id = c.run_id AND i.node = c.node) b
    WHERE r.state = 'running'
)


-- fragment: claim_update
-- The end of a claim of the kinds without limits, after its CTE claimable (the locked
-- steps: claim_runnable): each step of a run that is running moves to running under a
-- lease the database clock computes from the TTL, taking the timeout its kind declares
-- (%(timeouts_us)s, aligned with %(kinds)s) if it was enqueued without one (by a
-- producer that does not know the kind), so that it is durable from the claim on.
-- use: claim_runnable
, claimed AS (
    UPDATE cyclone_steps s
    SET state = 'running',
        lease_owner = %(owner)s,
        lease_expiry = now() + %(ttl_us)s::bigint * interval '1 microsecond',
        heartbeat_at = now(),
        started_at = (SELECT at FROM clock),
        lease_generation = s.lease_generation + 1,
        timeout = coalesce(s.timeout, k.timeout_us * interval '1 microsecond')
    FROM runnable c,
         unnest((SELECT %(kinds)s::text[]), (SELECT %(timeouts_us)s::bigint[]))
             AS k (kind, timeout_us)
    WHERE s.id = c.id
      AND s.state = c.state
      AND k.kind = s.kind
    -- use: claim_returning
)


-- name: steps_claim
-- The claim of the kinds without limits, in a queue without fairness keys: lock up to
-- %(limit)s due, available steps of one queue and of the kinds this worker registers,
-- highest priority first, then earliest scheduled_at; skip rows other workers hold;
-- move them to running (claim_update). Nothing while the queue is paused: a claim that
-- starts after pause_queue committed takes no step of the queue. While the queue holds
-- steps with a fairness key it claims nothing and returns the marker row
-- (claim_marker): the worker runs steps_claim_fair instead.
-- A workflow step also returns its data edge (input_from) and its input bindings
-- (binding_nodes and binding_modes, aligned, in slot order, and binding_names when
-- they are named), which the worker resolves from upstream outputs; a standalone job
-- (def_version 'job') skips that lookup. Each
-- step also returns what its trace span and metrics need: its reclaims, its run's
-- trace context and how long it waited since it was ready: since it was due
-- (scheduled_at), and for a workflow step since its last upstream step completed if
-- that came later (a node keeps the scheduled_at of its submit while it waits for its
-- dependencies): two index probes per dependency, and only when %(latency)s (tracing
-- or metrics are on; otherwise a workflow step's figure is since its scheduled_at).
-- The ORDER BY is exactly the order of idx_steps_claim, so a backlog of any size is
-- read from the index, never sorted; equal keys come in index (insertion) order. A
-- sequenced step (sequence_key) is claimable only at the head of its key
-- (sequence_step_ahead); steps_sequence_release rechecks the rule under the key's lock
-- after the claim commits.
WITH
-- use: claim_here_unlimited
, claimable AS (
    SELECT s.id, s.run_id, s.node, s.state, NULL::integer AS max_concurrency
    FROM cyclone_steps s
    WHERE (SELECT open AND NOT fair FROM here)
      AND s.state = 'available'
      AND s.queue = (SELECT queue FROM here)
      -- use: claim_filter
    ORDER BY s.priority DESC, s.scheduled_at
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
),
-- use: claim_update
SELECT * FROM claimed
UNION ALL
-- use: claim_marker
WHERE (SELECT fair FROM here);


-- name: steps_claim_fair
-- The claim of the kinds without limits, in a queue holding steps with a fairness key:
-- as steps_claim, the steps taken in fairness order (fair_heads): the first step of
-- every key before the second of any, the keys in turn. A row lock is taken on a step
-- fair_heads read in an earlier snapshot: the step is checked again once locked
-- (available, in the queue, due). When the queue holds no step with a fairness key
-- any more it claims nothing and returns the marker row: the worker runs steps_claim.
WITH RECURSIVE
-- use: claim_here_unlimited
, full_groups AS (
    SELECT NULL::text AS kind, NULL::text AS key
    WHERE false
),
-- use: fair_heads
, claimable AS (
    SELECT s.id, s.run_id, s.node, s.state, NULL::integer AS max_concurrency
    FROM unnest(ARRAY(
             SELECT id FROM fair_heads ORDER BY priority DESC, rn, turn
             LIMIT 2 * %(limit)s)) WITH ORDINALITY AS c (id, ord)
    JOIN cyclone_steps s ON s.id = c.id
    WHERE s.state = 'available'
      AND s.queue = (SELECT queue FROM here)
      AND s.scheduled_at <= now()
    ORDER BY c.ord
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
),
-- use: claim_update
SELECT * FROM claimed
UNION ALL
-- use: claim_marker
WHERE (SELECT NOT fair FROM here);


-- fragment: claim_here_limited
-- "here" of the claim of limited kinds: the worker's kinds that cyclone_kind_limits
-- lists as limited; then the concurrency groups' free places.
here AS (
    SELECT ARRAY(SELECT l.kind
                 FROM cyclone_kind_limits l
                 WHERE l.kind = ANY(q.kinds)
                   AND (l.max_concurrency IS NOT NULL OR l.rate_count IS NOT NULL)
                 ORDER BY l.kind) AS kinds,
           -- use: claim_here
    FROM
        -- use: claim_params
),
-- use: group_places


-- fragment: limited_lock
-- The end of the first statement of a claim of limited kinds, after its CTE heads (the
-- candidates read in this snapshot: id, priority, rn, turn, kind, concurrency_key,
-- rate_key), in claim order: at most the free places of each concurrency group and
-- the room of each rate bucket (in this snapshot), so that one group or bucket cannot
-- fill the claim; the steps locked (checked again once locked: available, in the
-- queue, due); the advisory lock of each concurrency group and rate bucket among them,
-- taken in one sorted order (two claims never deadlock; completions take none); the
-- steps' ids in claim order and the groups locked left in the transaction's settings
-- cyclone.claimed and cyclone.locked for steps_claim_admit. The row returned says
-- whether the queue holds steps with a fairness key, and whether a limit held steps
-- back (a full group, or candidates past a group's free places or a bucket's room).
picked AS (
    SELECT p.id, p.ord
    FROM (
        SELECT h.id, h.ord, l.max_concurrency, coalesce(g.free, l.max_concurrency) AS free,
               row_number() OVER (
                   PARTITION BY h.kind, coalesce(h.concurrency_key, '') ORDER BY h.ord) AS place,
               l.rate_count,
               l.rate_count + l.rate_burst - coalesce((
                   SELECT count(*)
                   FROM unnest(b.starts) AS t
                   WHERE t > now() - l.rate_per * interval '1 second'), 0) AS room,
               row_number() OVER (
                   PARTITION BY h.kind, coalesce(h.rate_key, '') ORDER BY h.ord) AS turn
        FROM (SELECT u.id, u.kind, u.concurrency_key, u.rate_key,
                     row_number() OVER (ORDER BY u.priority DESC, u.rn, u.turn) AS ord
              FROM heads AS u) AS h
        JOIN cyclone_kind_limits l ON l.kind = h.kind
        LEFT JOIN group_places g ON g.kind = h.kind AND g.key = coalesce(h.concurrency_key, '')
        LEFT JOIN cyclone_rate_buckets b
            ON b.kind = h.kind AND b.key = coalesce(h.rate_key, '') AND l.rate_count IS NOT NULL
    ) AS p
    WHERE (p.max_concurrency IS NULL OR p.place <= p.free)
      AND (p.rate_count IS NULL OR p.turn <= p.room)
), claimable AS (
    SELECT s.id, s.kind, s.concurrency_key, s.rate_key, c.ord
    FROM (SELECT id, ord FROM picked ORDER BY ord LIMIT 2 * %(limit)s) AS c
    JOIN cyclone_steps s ON s.id = c.id
    WHERE s.state = 'available'
      AND s.queue = (SELECT queue FROM here)
      AND s.scheduled_at <= now()
    ORDER BY c.ord
    LIMIT %(limit)s
    FOR UPDATE OF s SKIP LOCKED
), groups AS (
    SELECT DISTINCT x.g
    FROM claimable c
    JOIN cyclone_kind_limits l ON l.kind = c.kind
    CROSS JOIN LATERAL (VALUES
        (CASE WHEN l.max_concurrency IS NOT NULL
              THEN jsonb_build_array('concurrency', c.kind, coalesce(c.concurrency_key, ''))
         END),
        (CASE WHEN l.rate_count IS NOT NULL
              THEN jsonb_build_array('rate', c.kind, coalesce(c.rate_key, ''))
         END)) AS x (g)
    WHERE x.g IS NOT NULL
), locked AS (
    SELECT count(*) AS groups
    FROM (SELECT pg_advisory_xact_lock(hashtextextended('cyclone.flow:' || o.g::text, 0))
          FROM (SELECT g FROM groups ORDER BY g::text) AS o) AS l
)
SELECT set_config(
           'cyclone.claimed',
           coalesce((SELECT array_agg(c.id ORDER BY c.ord) FROM claimable c, locked), '{}')::text,
           true) AS ids,
       set_config(
           'cyclone.locked',
           coalesce((SELECT array_agg(g.g::text ORDER BY g.g::text) FROM groups g, locked),
                    '{}')::text,
           true) AS groups,
       (SELECT fair FROM here) AS fair,
       (SELECT count(*) FROM heads) > (SELECT count(*) FROM picked)
           OR EXISTS (SELECT 1 FROM group_places WHERE free <= 0) AS held


-- name: steps_claim_limited
-- The first statement of the claim of limited kinds (a kind with a max_concurrency or
-- a rate_limit in cyclone_kind_limits) in a queue without fairness keys, in one
-- transaction with steps_claim_admit: up to %(limit)s claimable steps of those kinds
-- in claim order, skipping groups that are full and buckets that are spent in this
-- snapshot, locked with their groups (limited_lock). Nothing moves here: the count
-- that decides must be read by a statement that starts after the locks are held, with
-- a snapshot that sees every claim of those groups committed before
-- (steps_claim_admit); the transaction, both statements and its commit, is one round
-- trip. Reading past a full group's backlog costs one row each: give such steps a
-- fairness_key (the same value as their concurrency_key) and each key's head is read
-- through idx_steps_fairness instead. In a queue with fairness keys it locks nothing
-- and says so: the worker runs steps_claim_limited_fair.
WITH
-- use: claim_here_limited
, heads AS (
    SELECT s.id, s.priority, row_number() OVER (ORDER BY s.priority DESC, s.scheduled_at) AS rn,
           (false, ''::text) AS turn, s.kind, s.concurrency_key, s.rate_key
    FROM (
        SELECT s.id, s.priority, s.scheduled_at, s.kind, s.concurrency_key, s.rate_key
        FROM cyclone_steps s
        WHERE (SELECT open AND NOT fair FROM here)
          AND s.state = 'available'
          AND s.queue = (SELECT queue FROM here)
          -- use: claim_filter
          -- use: claim_limit_filter
        ORDER BY s.priority DESC, s.scheduled_at
        LIMIT 4 * %(limit)s) s
),
-- use: limited_lock
;


-- name: steps_claim_limited_fair
-- steps_claim_limited in a queue holding steps with a fairness key: the candidates in
-- fairness order (fair_heads). In a queue without fairness keys it locks nothing and
-- says so: the worker runs steps_claim_limited.
WITH RECURSIVE
-- use: claim_here_limited
, full_groups AS (
    SELECT kind, key FROM group_places WHERE free <= 0
),
-- use: fair_heads
, heads AS (
    SELECT id, priority, rn, turn, kind, concurrency_key, rate_key
    FROM fair_heads
),
-- use: limited_lock
;


-- name: steps_claim_admit
-- The second statement of the claim of limited kinds, in its transaction, after
-- steps_claim_limited locked the steps of cyclone.claimed (in claim order) and their
-- groups' advisory locks: its snapshot sees every claim of those groups that committed before,
-- and every step that stopped running since (a completion, a retry, a release, a
-- reclaim, a timeout or a cancel frees its place in the transaction that changes its
-- state). It moves to running, in claim order, the steps whose concurrency group has a
-- free place (max_concurrency minus the group's running steps) and whose rate bucket
-- has room (fewer than count + burst starts in the last per seconds, the bucket's
-- sliding log; with a burst, a token as well: count + burst tokens refilled at count /
-- per a second), and records their starts in their buckets. The others stay available
-- (their row locks end with the transaction). A started step without a concurrency
-- key gets '' (its kind's one group), so that idx_steps_concurrency holds every
-- running step of a limited kind. Its times are its clock (claim_clock): read once
-- the statement runs, after its locks were granted and its snapshot taken, so the
-- starts of one bucket are written in the order they happened, however long the lock
-- wait. Otherwise as steps_claim.
WITH here AS (
    SELECT NULL::boolean AS fair
), clock AS (
    -- use: claim_clock
), c AS (
    SELECT s.id, s.run_id, s.node, s.state, s.kind, v.ord,
           coalesce(s.concurrency_key, '') AS ckey, coalesce(s.rate_key, '') AS rkey,
           l.max_concurrency, l.rate_count, l.rate_per, l.rate_burst
    FROM unnest(current_setting('cyclone.claimed')::bigint[]) WITH ORDINALITY AS v (id, ord)
    JOIN cyclone_steps s ON s.id = v.id
    JOIN cyclone_kind_limits l ON l.kind = s.kind
    WHERE (s.state = 'available') IS TRUE
      -- the limits read here are those steps_claim_limited locked for: a limit stored
      -- in between, whose group or bucket it did not lock, waits for the next claim
      AND (l.max_concurrency IS NULL
           OR jsonb_build_array('concurrency', s.kind, coalesce(s.concurrency_key, ''))::text
              = ANY(current_setting('cyclone.locked')::text[]))
      AND (l.rate_count IS NULL
           OR jsonb_build_array('rate', s.kind, coalesce(s.rate_key, ''))::text
              = ANY(current_setting('cyclone.locked')::text[]))
      AND EXISTS (SELECT 1 FROM cyclone_runs r WHERE r.id = s.run_id AND r.state = 'running')
), running AS (
    SELECT s.kind, s.concurrency_key AS ckey, count(*) AS n
    FROM cyclone_steps s
    WHERE s.state = 'running'
      AND s.concurrency_key IS NOT NULL
      AND (s.kind, s.concurrency_key) IN (
          SELECT kind, ckey FROM c WHERE max_concurrency IS NOT NULL)
    GROUP BY s.kind, s.concurrency_key
), placed AS (
    SELECT p.*
    FROM (
        SELECT c.*, coalesce(r.n, 0) AS running,
               row_number() OVER (PARTITION BY c.kind, c.ckey ORDER BY c.ord) AS place
        FROM c
        LEFT JOIN running r ON r.kind = c.kind AND r.ckey = c.ckey) AS p
    WHERE p.max_concurrency IS NULL OR p.running + p.place <= p.max_concurrency
), buckets AS (
    SELECT DISTINCT ON (p.kind, p.rkey)
           p.kind, p.rkey,
           ARRAY(SELECT t
                 FROM unnest(b.starts) AS t
                 WHERE t > (SELECT at FROM clock) - p.rate_per * interval '1 second'
                 ORDER BY t) AS kept,
           CASE WHEN p.rate_burst > 0 THEN
               least(p.rate_count + p.rate_burst,
                     coalesce(b.tokens + extract(epoch FROM (SELECT at FROM clock) - b.updated_at)
                                         * p.rate_count / p.rate_per,
                              p.rate_count + p.rate_burst))
           END AS tokens
    FROM placed p
    LEFT JOIN cyclone_rate_buckets b ON b.kind = p.kind AND b.key = p.rkey
    WHERE p.rate_count IS NOT NULL
    ORDER BY p.kind, p.rkey
), claimable AS (
    -- the admitted steps
    SELECT p.id, p.run_id, p.node, p.state, p.kind, p.rkey, p.rate_count, p.max_concurrency
    FROM (
        SELECT placed.*,
               row_number() OVER (PARTITION BY placed.kind, placed.rkey ORDER BY placed.ord)
                   AS turn
        FROM placed) AS p
    LEFT JOIN buckets b ON b.kind = p.kind AND b.rkey = p.rkey
    WHERE p.rate_count IS NULL
       OR (p.turn <= p.rate_count + p.rate_burst - cardinality(b.kept)
           AND (b.tokens IS NULL OR p.turn <= floor(b.tokens)))
), spent AS (
    INSERT INTO cyclone_rate_buckets AS t (kind, key, starts, tokens, updated_at)
    SELECT b.kind, b.rkey,
           b.kept || array_fill((SELECT at FROM clock), ARRAY[n.n]),
           b.tokens - n.n,
           (SELECT at FROM clock)
    FROM buckets b
    JOIN (SELECT kind, rkey, count(*)::integer AS n
          FROM claimable
          WHERE rate_count IS NOT NULL
          GROUP BY kind, rkey) AS n ON n.kind = b.kind AND n.rkey = b.rkey
    ON CONFLICT (kind, key) DO UPDATE
    SET starts = EXCLUDED.starts,
        tokens = EXCLUDED.tokens,
        updated_at = EXCLUDED.updated_at
),
-- use: claim_runnable
UPDATE cyclone_steps s
SET state = 'running',
    lease_owner = %(owner)s,
    lease_expiry = (SELECT at FROM clock) + %(ttl_us)s::bigint * interval '1 microsecond',
    heartbeat_at = (SELECT at FROM clock),
    started_at = (SELECT at FROM clock),
    lease_generation = s.lease_generation + 1,
    timeout = coalesce(s.timeout, k.timeout_us * interval '1 microsecond'),
    concurrency_key = CASE WHEN c.max_concurrency IS NOT NULL
                           THEN coalesce(s.concurrency_key, '')
                           ELSE s.concurrency_key END
FROM runnable c,
     unnest((SELECT %(kinds)s::text[]), (SELECT %(timeouts_us)s::bigint[])) AS k (kind, timeout_us)
WHERE s.id = c.id
  AND s.state = c.state
  AND k.kind = s.kind
-- use: claim_returning

