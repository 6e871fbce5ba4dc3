-- Statements of the migration runner (cyclone/migrate.py).


-- name: migrate_lock
-- Session-level advisory lock: one migration at a time per database and schema.
SELECT pg_advisory_lock(hashtextextended('cyclone.migrate:' || %(schema)s, 0));


-- name: migrate_unlock
SELECT pg_advisory_unlock(hashtextextended('cyclone.migrate:' || %(schema)s, 0));


-- name: migrate_version_table
-- The version table (decisions.md, Schema details).
CREATE TABLE IF NOT EXISTS cyclone_schema_version (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);


-- name: migrate_applied
SELECT version FROM cyclone_schema_version ORDER BY version;


-- name: migrate_current
-- The newest applied version (fails with undefined_table before the first migrate).
SELECT coalesce(max(version), 0) FROM cyclone_schema_version;


-- name: migrate_record
INSERT INTO cyclone_schema_version (version) VALUES (%(version)s);
