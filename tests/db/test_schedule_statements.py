"""The schedule statements on their own: the lease and next_run_at guards of a fire, the
fire row's primary key, and the purge statement's choice of runs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest

from cyclone.dbio import Stmt
from cyclone.sql import Q
from tests.helpers import set_database_timezone

SESSION_ZONE = "America/Los_Angeles"
"""Every database of this module runs its sessions in a zone with daylight saving, so
timestamptz values come back in it (psycopg gives them the session's zone)."""


@pytest.fixture
def dsn(dsn: str) -> str:
    """The test's database, its sessions in :data:`SESSION_ZONE`."""
    return set_database_timezone(dsn, SESSION_ZONE)


def run(db: psycopg.Connection[Any], stmt: Stmt[Any]) -> list[tuple[Any, ...]]:
    return db.execute(stmt.sql, stmt.params).fetchall()


def claim(db: psycopg.Connection[Any], owner: str) -> list[tuple[Any, ...]]:
    return run(
        db,
        Stmt(
            Q.schedules_claim, {"owner": owner, "ttl_us": 30_000_000, "limit": 10, "versions": []}
        ),
    )


def fired(
    db: psycopg.Connection[Any], owner: str, due: datetime, slot: datetime, run_id: int
) -> list[tuple[Any, ...]]:
    return run(
        db,
        Stmt(
            Q.schedules_fired,
            {
                "id": "s",
                "owner": owner,
                "due": due,
                "slot": slot,
                "next_run_at": slot.replace(year=slot.year + 1),
                "run_id": run_id,
            },
        ),
    )


@pytest.fixture
def due(db: psycopg.Connection[Any]) -> datetime:
    db.execute(
        "INSERT INTO cyclone_schedules (id, kind, input, cron_spec, location, next_run_at) "
        "VALUES ('s', 'k', 'null', '0 0 1 1 *', 'UTC', date_trunc('year', now()))"
    )
    db.execute(
        "INSERT INTO cyclone_runs (id, workflow, def_version) OVERRIDING SYSTEM VALUE "
        "VALUES (1, 'k', 'job'), (2, 'k', 'job')"
    )
    row = db.execute("SELECT next_run_at FROM cyclone_schedules").fetchone()
    assert row is not None
    next_run_at: datetime = row[0]
    return next_run_at


def test_a_scanner_whose_lease_passed_to_another_cannot_fire(
    db: psycopg.Connection[Any], due: datetime
) -> None:
    assert len(claim(db, "A")) == 1
    assert claim(db, "B") == []  # A's lease holds it
    db.execute("UPDATE cyclone_schedules SET lease_expiry = now() - interval '1 second'")
    assert len(claim(db, "B")) == 1  # A looks dead: B takes the lease
    assert fired(db, "A", due, due, 1) == []  # A's late fire matches nothing
    assert fired(db, "B", due, due, 2) == [("s",)]
    assert fired(db, "B", due, due, 2) == []  # next_run_at moved on: no second fire
    rows = db.execute("SELECT schedule_id, run_id FROM cyclone_schedule_fires").fetchall()
    assert rows == [("s", 2)]
    state = db.execute(
        "SELECT last_run_id, lease_owner, lease_expiry FROM cyclone_schedules"
    ).fetchone()
    assert state == (2, None, None)


def test_the_fire_rows_primary_key_refuses_a_second_fire_of_a_slot(
    db: psycopg.Connection[Any], due: datetime
) -> None:
    claim(db, "A")
    assert fired(db, "A", due, due, 1) == [("s",)]
    # even if next_run_at were moved back by hand, the slot cannot fire twice
    db.execute("UPDATE cyclone_schedules SET next_run_at = %s, lease_owner = 'A'", (due,))
    with pytest.raises(psycopg.errors.UniqueViolation):
        fired(db, "A", due, due, 2)
