-- Cyclone migration 9: flow control (docs/flow-control.md).
--
-- Steps gain the keys that group them for the claim's controls, and a snooze count:
-- * concurrency_key: the group a kind's max_concurrency counts in (NULL: the kind's
--   one group, which the claim of a limited kind writes as '' when it starts the step);
-- * rate_key: the bucket a kind's rate limit counts in (NULL: the kind's one bucket);
-- * fairness_key: the key claims rotate across within a queue and priority (NULL: no
--   rotation for that step);
-- * snoozes: how often a handler raised Snooze for the step (never an attempt);
-- * item_keys: on a fan-out node whose items take a key from their item
--   (cyclone.ItemKey), the field of each key, {"concurrency_key": "tenant"}; NULL on
--   every other step.
-- Nullable columns without a default, and one with a constant default: catalog
-- changes only, no row is rewritten.
--
-- Two partial indexes, each entered only by the steps that use a control:
-- * idx_steps_concurrency: running steps with a concurrency key, by (kind, key): the
--   claim of a limited kind counts a group's running steps from it;
-- * idx_steps_fairness: available steps with a fairness key, by (queue, key, priority,
--   scheduled_at): the claim steps from key to key through it and reads each key's
--   head in claim order. A queue with no such step costs the claim one probe of an
--   empty index.
--
-- Three tables:
-- * cyclone_kind_limits: each kind's declared limits, written by every client that
--   registers the kind when it starts (the newer start wins); what every claim applies;
-- * cyclone_rate_buckets: a rate limit's bucket per (kind, key): the start times of
--   the last window (a sliding log, at most count + burst entries) and a token count
--   for the burst, written only by claims, under the bucket's advisory lock;
-- * cyclone_queue_pauses: one row per paused queue; a claim takes nothing from it.
-- The function cyclone_item_key_v1(item, field): a fan-out item's key read from its
-- field (cyclone.ItemKey): the field's text (a string as it is, another JSON value in
-- its JSON form), NULL when the field is NULL, absent or empty, or the item is not an
-- object; a text over 1,024 bytes is replaced by 'md5:' and its MD5 digest, so that
-- distinct keys stay distinct and every key fits its index. An inlined SQL function.
-- And the view cyclone_queues_v1: cyclone_v_queues (unchanged) with each queue's pause.
--
-- Workers of earlier versions never name these objects: they ignore the controls
-- (they claim limited kinds and paused queues as before) and keep working beside them.

ALTER TABLE cyclone_steps
    ADD COLUMN concurrency_key text,
    ADD COLUMN rate_key text,
    ADD COLUMN fairness_key text,
    ADD COLUMN snoozes integer NOT NULL DEFAULT 0,
    ADD COLUMN item_keys jsonb;

CREATE INDEX idx_steps_concurrency ON cyclone_steps (kind, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

CREATE INDEX idx_steps_fairness ON cyclone_steps (queue, fairness_key, priority DESC, scheduled_at)
    WHERE state = 'available' AND fairness_key IS NOT NULL;

CREATE TABLE cyclone_kind_limits (
    kind            text        PRIMARY KEY,
    max_concurrency integer     CHECK (max_concurrency >= 1),
    rate_count      integer     CHECK (rate_count >= 1),
    rate_per        float8      CHECK (rate_per > 0),
    rate_burst      integer     NOT NULL DEFAULT 0 CHECK (rate_burst >= 0),
    max_snoozes     integer     NOT NULL DEFAULT 100 CHECK (max_snoozes >= 0),
    written_by      text        NOT NULL,
    written_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT cyclone_kind_limits_rate_check
        CHECK ((rate_count IS NULL) = (rate_per IS NULL))
);

CREATE TABLE cyclone_rate_buckets (
    kind       text          NOT NULL,
    key        text          NOT NULL,
    starts     timestamptz[] NOT NULL DEFAULT '{}',
    tokens     float8,
    updated_at timestamptz   NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, key)
);

CREATE TABLE cyclone_queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text
);

CREATE FUNCTION cyclone_item_key_v1(p_item jsonb, p_field text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN octet_length(p_item ->> p_field) > 1024 THEN 'md5:' || md5(p_item ->> p_field)
        ELSE nullif(p_item ->> p_field, '')
    END
$$;

CREATE VIEW cyclone_queues_v1 AS
SELECT coalesce(q.queue, p.queue) AS queue,
       coalesce(q.available, 0) AS available,
       coalesce(q.running, 0) AS running,
       coalesce(q.waiting, 0) AS waiting,
       q.oldest_available_age,
       coalesce(q.expired_leases, 0) AS expired_leases,
       p.queue IS NOT NULL AS paused,
       p.paused_at,
       p.paused_by
FROM cyclone_v_queues q
FULL JOIN cyclone_queue_pauses p ON p.queue = q.queue;
