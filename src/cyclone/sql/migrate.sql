-- Statements of the migration runner (cyclone/migrate.py).
--
-- Each migration file is applied in a transaction of its own that first takes the
-- transaction-scoped advisory lock of the schema, then (re)reads the applied versions:
-- nothing outlives the transaction, so the runner is safe through a transaction-mode
-- pooler, where a session lock could be taken on one server connection and released
-- on another (or never).


-- name: migrate_lock
-- One migration transaction at a time per database and schema; released at COMMIT or
-- ROLLBACK.
SELECT pg_advisory_xact_lock(hashtextextended('cyclone.migrate:' || %(schema)s, 0));


-- name: migrate_version_table
-- The version table (docs/schema.md, cyclone_schema_version).
CREATE TABLE IF NOT EXISTS cyclone_schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);


-- name: migrate_applied
SELECT version FROM cyclone_schema_version ORDER BY version;


-- name: migrate_current
-- The newest applied version (fails with undefined_table before the first migrate).
SELECT coalesce(max(version), 0) AS version FROM cyclone_schema_version;


-- name: migrate_record
INSERT INTO cyclone_schema_version (version) VALUES (%(version)s);
