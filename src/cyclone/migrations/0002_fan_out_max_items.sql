-- Cyclone migration 2: the item cap of a fan-out node (wf.fan_out(..., max_items=)).
--
-- One nullable column without a default: PostgreSQL records it in the catalog and
-- rewrites no row, so the brief ACCESS EXCLUSIVE lock of ADD COLUMN is held only for
-- the catalog change. Set on a fan-out node only (0 means no cap); NULL everywhere
-- else, and on the fan-out nodes that workers of version 1 submit (no cap). Workers of
-- version 1 never name the column, so they keep working beside it.

ALTER TABLE cyclone_steps ADD COLUMN fan_out_max_items integer;
