-- Statements on cyclone_kind_limits: the flow control a kind declares
-- (docs/flow-control.md), written by every client that registers the kind when it
-- starts, read by the claim (claims.sql) and by `cyclone kinds`.


-- name: limits_write
-- Store the limits of the kinds a client registers (aligned arrays, one entry per
-- kind, in kind order so that two starting clients lock the rows in one order): the
-- newer start wins. Returns, for each kind whose stored limits differed, the values it
-- replaced and who wrote them, for the client's warning.
WITH v AS (
    SELECT *
    FROM unnest(%(kinds)s::text[], %(max_concurrency)s::integer[], %(rate_count)s::integer[],
                %(rate_per)s::float8[], %(rate_burst)s::integer[], %(max_snoozes)s::integer[])
        AS v (kind, max_concurrency, rate_count, rate_per, rate_burst, max_snoozes)
), before AS (
    SELECT l.kind, l.max_concurrency, l.rate_count, l.rate_per, l.rate_burst, l.max_snoozes,
           l.written_by
    FROM cyclone_kind_limits l
    JOIN v ON v.kind = l.kind
    WHERE (l.max_concurrency, l.rate_count, l.rate_per, l.rate_burst, l.max_snoozes)
          IS DISTINCT FROM (v.max_concurrency, v.rate_count, v.rate_per, v.rate_burst,
                            v.max_snoozes)
), written AS (
    INSERT INTO cyclone_kind_limits AS l (
        kind, max_concurrency, rate_count, rate_per, rate_burst, max_snoozes, written_by)
    SELECT v.kind, v.max_concurrency, v.rate_count, v.rate_per, v.rate_burst, v.max_snoozes,
           %(written_by)s
    FROM v
    ORDER BY v.kind
    ON CONFLICT (kind) DO UPDATE
    SET max_concurrency = EXCLUDED.max_concurrency,
        rate_count = EXCLUDED.rate_count,
        rate_per = EXCLUDED.rate_per,
        rate_burst = EXCLUDED.rate_burst,
        max_snoozes = EXCLUDED.max_snoozes,
        written_by = EXCLUDED.written_by,
        written_at = now()
)
SELECT kind, max_concurrency, rate_count, rate_per, rate_burst, max_snoozes, written_by
FROM before
ORDER BY kind;


-- name: limits_limited
-- Which of %(kinds)s are limited (a max_concurrency or a rate_limit stored): the
-- claim of those kinds goes through steps_claim_limited. A primary-key probe per kind.
SELECT l.kind
FROM cyclone_kind_limits l
WHERE l.kind = ANY(%(kinds)s::text[])
  AND (l.max_concurrency IS NOT NULL OR l.rate_count IS NOT NULL);


-- name: limits_list
-- Every kind's stored limits, by kind, for `cyclone kinds`.
SELECT kind, max_concurrency, rate_count, rate_per, rate_burst, max_snoozes, written_by,
       written_at
FROM cyclone_kind_limits
ORDER BY kind;
