"""A test-only guard that makes the transition table the truth in every database test.

:func:`install` adds, to a migrated database (the session's template, so every database
cloned from it has it), a schema ``cyclone_test_guard`` with the table of legal moves,
filled from :data:`cyclone.states.STEP_TRANSITIONS` and
:data:`cyclone.states.RUN_TRANSITIONS`, and a ``BEFORE INSERT OR UPDATE`` trigger on
``cyclone_steps`` and on ``cyclone_runs`` that rejects (raises, so the statement and its
transaction fail) any row that:

* changes ``state`` by a move the table does not list (an ``UPDATE``; an ``INSERT`` may
  start a row in any state, as the tests' own hand-written rows do);
* breaks a row invariant, on ``INSERT`` and ``UPDATE`` alike: a step has
  ``completed_at`` set exactly in a terminal state and ``lease_owner`` set exactly while
  ``running``; a run has ``finished_at`` set exactly in a terminal state;
* claims a step (``available`` -> ``running``) one of whose parents (``cyclone_deps``)
  is not ``completed`` in what the claim's transaction sees: no dependency policy runs
  a node after a parent that did not complete.

Nothing here touches the base schema's table definitions: the trigger and its function
live in the guard's own schema and exist only in test databases. Tests of the schema
itself, which write rows by hand to probe its constraints, turn it off in their own
database (:func:`disable`).
"""

from __future__ import annotations

from typing import Any

import psycopg

from cyclone.states import (
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    TERMINAL_RUN_STATES,
    TERMINAL_STEP_STATES,
)

__all__ = ["GUARD_SCHEMA", "disable", "install", "legal_moves"]

GUARD_SCHEMA = "cyclone_test_guard"

_DDL = """
CREATE SCHEMA cyclone_test_guard;

CREATE TABLE cyclone_test_guard.moves (
    entity     text NOT NULL,
    from_state text NOT NULL,
    to_state   text NOT NULL,
    PRIMARY KEY (entity, from_state, to_state)
);

CREATE TABLE cyclone_test_guard.terminal (
    entity text NOT NULL,
    state  text NOT NULL,
    PRIMARY KEY (entity, state)
);

CREATE FUNCTION cyclone_test_guard.check_step() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    parent text;
    parent_state text;
    terminal boolean := EXISTS (
        SELECT 1 FROM cyclone_test_guard.terminal t
        WHERE t.entity = 'step' AND t.state = NEW.state);
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IS DISTINCT FROM OLD.state AND NOT EXISTS (
        SELECT 1 FROM cyclone_test_guard.moves m
        WHERE m.entity = 'step' AND m.from_state = OLD.state AND m.to_state = NEW.state)
    THEN
        RAISE EXCEPTION 'test guard: step % (%) moved % -> %, not a move of STEP_TRANSITIONS',
            OLD.id, OLD.node, OLD.state, NEW.state;
    END IF;
    IF terminal <> (NEW.completed_at IS NOT NULL) THEN
        RAISE EXCEPTION 'test guard: step % (%) is % with completed_at %',
            NEW.id, NEW.node, NEW.state, coalesce(NEW.completed_at::text, 'NULL');
    END IF;
    IF (NEW.state = 'running') <> (NEW.lease_owner IS NOT NULL) THEN
        RAISE EXCEPTION 'test guard: step % (%) is % with lease_owner %',
            NEW.id, NEW.node, NEW.state, coalesce(NEW.lease_owner, 'NULL');
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.state = 'available' AND NEW.state = 'running' THEN
        SELECT p.node, p.state INTO parent, parent_state
        FROM cyclone_deps d
        JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
        WHERE d.run_id = NEW.run_id AND d.node = NEW.node AND p.state <> 'completed'
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'test guard: step % (%) claimed while its parent % is %',
                NEW.id, NEW.node, parent, parent_state;
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE FUNCTION cyclone_test_guard.check_run() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    terminal boolean := EXISTS (
        SELECT 1 FROM cyclone_test_guard.terminal t
        WHERE t.entity = 'run' AND t.state = NEW.state);
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.state IS DISTINCT FROM OLD.state AND NOT EXISTS (
        SELECT 1 FROM cyclone_test_guard.moves m
        WHERE m.entity = 'run' AND m.from_state = OLD.state AND m.to_state = NEW.state)
    THEN
        RAISE EXCEPTION 'test guard: run % moved % -> %, not a move of RUN_TRANSITIONS',
            OLD.id, OLD.state, NEW.state;
    END IF;
    IF terminal <> (NEW.finished_at IS NOT NULL) THEN
        RAISE EXCEPTION 'test guard: run % is % with finished_at %',
            NEW.id, NEW.state, coalesce(NEW.finished_at::text, 'NULL');
    END IF;
    RETURN NEW;
END
$$;

-- every role a test connects as writes through the triggers
GRANT USAGE ON SCHEMA cyclone_test_guard TO PUBLIC;
GRANT SELECT ON ALL TABLES IN SCHEMA cyclone_test_guard TO PUBLIC;

CREATE TRIGGER cyclone_test_guard BEFORE INSERT OR UPDATE ON cyclone_steps
    FOR EACH ROW EXECUTE FUNCTION cyclone_test_guard.check_step();
CREATE TRIGGER cyclone_test_guard BEFORE INSERT OR UPDATE ON cyclone_runs
    FOR EACH ROW EXECUTE FUNCTION cyclone_test_guard.check_run();
"""


def legal_moves() -> list[tuple[str, str, str]]:
    """``(entity, from_state, to_state)`` for every move of the two tables."""
    steps = [("step", str(a), str(b)) for a, b in STEP_TRANSITIONS]
    runs = [("run", str(a), str(b)) for a, b in RUN_TRANSITIONS]
    return steps + runs


def install(conn: psycopg.Connection[Any]) -> None:
    """Add the guard to the migrated database of ``conn`` (in public), committed."""
    with conn.transaction():
        conn.execute(_DDL)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO cyclone_test_guard.moves VALUES (%s, %s, %s)", legal_moves()
            )
            cur.executemany(
                "INSERT INTO cyclone_test_guard.terminal VALUES (%s, %s)",
                [("step", str(s)) for s in TERMINAL_STEP_STATES]
                + [("run", str(s)) for s in TERMINAL_RUN_STATES],
            )


def disable(conn: psycopg.Connection[Any]) -> None:
    """Turn the guard off in the database of ``conn`` (for tests of the bare schema)."""
    with conn.transaction():
        conn.execute("ALTER TABLE cyclone_steps DISABLE TRIGGER cyclone_test_guard")
        conn.execute("ALTER TABLE cyclone_runs DISABLE TRIGGER cyclone_test_guard")
