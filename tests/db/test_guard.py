"""The test-only transition guard (tests/guard.py) is on in every test database: it
rejects a state change the transition tables do not list and a row that breaks a state
invariant, and lets every listed move through."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.states import (
    STEP_TRANSITIONS,
    TERMINAL_RUN_STATES,
    TERMINAL_STEP_STATES,
    StepState,
)
from tests.guard import legal_moves


@pytest.fixture
def step_id(dsn: str, db: psycopg.Connection[Any]) -> int:
    with cyclone.SyncClient(dsn) as client:
        return client.enqueue("guarded", {}).step_id


def test_a_move_the_table_does_not_list_is_rejected(
    db: psycopg.Connection[Any], step_id: int
) -> None:
    assert (StepState.AVAILABLE, StepState.WAITING_TIMER) not in STEP_TRANSITIONS
    with pytest.raises(psycopg.errors.RaiseException, match="available -> waiting_timer"):
        db.execute("UPDATE cyclone_steps SET state = 'waiting_timer' WHERE id = %s", [step_id])
    row = db.execute("SELECT state FROM cyclone_steps WHERE id = %s", [step_id]).fetchone()
    assert row == ("available",)


def test_a_listed_move_goes_through(db: psycopg.Connection[Any], step_id: int) -> None:
    db.execute("UPDATE cyclone_steps SET state = 'paused' WHERE id = %s", [step_id])
    row = db.execute("SELECT state FROM cyclone_steps WHERE id = %s", [step_id]).fetchone()
    assert row == ("paused",)


def test_a_terminal_step_without_completed_at_is_rejected(
    db: psycopg.Connection[Any], step_id: int
) -> None:
    db.execute("UPDATE cyclone_steps SET state = 'paused' WHERE id = %s", [step_id])
    with pytest.raises(psycopg.errors.RaiseException, match="cancelled with completed_at NULL"):
        db.execute("UPDATE cyclone_steps SET state = 'cancelled' WHERE id = %s", [step_id])


def test_a_running_step_without_a_lease_owner_is_rejected(
    db: psycopg.Connection[Any], step_id: int
) -> None:
    with pytest.raises(psycopg.errors.RaiseException, match="running with lease_owner NULL"):
        db.execute("UPDATE cyclone_steps SET state = 'running' WHERE id = %s", [step_id])


def test_a_terminal_run_without_finished_at_is_rejected(
    db: psycopg.Connection[Any], step_id: int
) -> None:
    with pytest.raises(psycopg.errors.RaiseException, match="completed with finished_at NULL"):
        db.execute(
            "UPDATE cyclone_runs SET state = 'completed'"
            " WHERE id = (SELECT run_id FROM cyclone_steps WHERE id = %s)",
            [step_id],
        )


def test_the_guard_holds_exactly_the_tables(db: psycopg.Connection[Any]) -> None:
    rows = db.execute("SELECT entity, from_state, to_state FROM cyclone_test_guard.moves")
    assert sorted(rows.fetchall()) == sorted(legal_moves())


def test_an_inserted_row_must_keep_the_invariants(db: psycopg.Connection[Any]) -> None:
    db.execute(
        "INSERT INTO cyclone_runs (id, workflow, def_version) OVERRIDING SYSTEM VALUE"
        " VALUES (900, 'k', 'job')"
    )
    with pytest.raises(psycopg.errors.RaiseException, match="completed with completed_at NULL"):
        db.execute(
            "INSERT INTO cyclone_steps (run_id, node, kind, state)"
            " VALUES (900, 'a', 'k', 'completed')"
        )
    with pytest.raises(psycopg.errors.RaiseException, match="failed with finished_at NULL"):
        db.execute(
            "INSERT INTO cyclone_runs (workflow, def_version, state) VALUES ('k', 'job', 'failed')"
        )


def test_the_guard_knows_exactly_the_terminal_states(db: psycopg.Connection[Any]) -> None:
    rows = db.execute("SELECT entity, state FROM cyclone_test_guard.terminal").fetchall()
    expected = [("step", str(s)) for s in TERMINAL_STEP_STATES] + [
        ("run", str(s)) for s in TERMINAL_RUN_STATES
    ]
    assert sorted(rows) == sorted(expected)


def test_a_claim_before_every_parent_completed_is_rejected(db: psycopg.Connection[Any]) -> None:
    db.execute(
        "INSERT INTO cyclone_runs (id, workflow, def_version) OVERRIDING SYSTEM VALUE"
        " VALUES (901, 'w', 'v1')"
    )
    db.execute(
        "INSERT INTO cyclone_steps (run_id, node, kind, state) VALUES"
        " (901, 'up', 'k', 'available'), (901, 'down', 'k', 'available')"
    )
    db.execute(
        "INSERT INTO cyclone_deps (run_id, node, dep_node, dep_type)"
        " VALUES (901, 'down', 'up', 'data')"
    )
    with pytest.raises(psycopg.errors.RaiseException, match="claimed while its parent up is"):
        db.execute(
            "UPDATE cyclone_steps SET state = 'running', lease_owner = 'w'"
            " WHERE run_id = 901 AND node = 'down'"
        )
    db.execute(
        "UPDATE cyclone_steps SET state = 'running', lease_owner = 'w'"
        " WHERE run_id = 901 AND node = 'up'"
    )  # a root: nothing to wait for
