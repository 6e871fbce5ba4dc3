-- Cyclone migration 8: the trace context of a run (cyclone.observability).
--
-- cyclone_runs.traceparent holds the W3C trace context (the "traceparent" header
-- form, 55 characters: version, trace id, parent span id, flags) that was current
-- when the run was enqueued or submitted, or of the schedule fire or parent step that
-- started it. Every step span of the run, on any worker host and however much later,
-- is made a child of it, so one trace shows the request that enqueued the work and
-- every attempt of every step. NULL when no tracing was configured at enqueue.
--
-- Nullable and without a default: ADD COLUMN only updates the catalog (a brief ACCESS
-- EXCLUSIVE lock on cyclone_runs, no rewrite). No index: the column is only read with
-- a run found by its id. Workers of earlier versions never name it and keep working
-- beside it (their runs carry no trace context).

ALTER TABLE cyclone_runs ADD COLUMN traceparent text;
