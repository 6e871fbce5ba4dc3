"""steps_heartbeat: many leases renewed in one statement, each row with its own guard.

docs/design.md, Claims, leases and heartbeats: a renewal is guarded by state, owner, generation
and the step's timeout; one statement carries every lease a worker has due, and a row
locked by another transaction is reported busy instead of waited for.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from cyclone.dbio import fetch_sync, pin_search_path, text_array
from cyclone.transitions import Claimed, heartbeat_stmt, parse_heartbeat
from tests.helpers import held_step

ODD_OWNER = 'host:1:{a,b} "NULL"\\x/7'
"""A lease owner with every character an array literal treats specially."""


def _running(db: psycopg.Connection[Any], owner: str, *, timeout: str | None = None) -> Claimed:
    """A standalone run whose step is running under ``owner``, generation 1."""
    row = db.execute(
        """
        WITH r AS (INSERT INTO cyclone_runs (workflow, def_version) VALUES ('k', 'job')
                   RETURNING id)
        INSERT INTO cyclone_steps (run_id, node, kind, state, lease_owner, lease_generation,
                                   lease_expiry, started_at, timeout)
        SELECT id, 'k', 'k', 'running', %s, 1, now() + interval '30 seconds', now(),
               %s::interval
        FROM r
        RETURNING id, run_id
        """,
        (owner, timeout),
    ).fetchone()
    assert row is not None
    return held_step(row[0], row[1], owner=owner)


def _expiry(db: psycopg.Connection[Any], step: Claimed) -> datetime:
    value = db.execute("SELECT lease_expiry FROM cyclone_steps WHERE id = %s", (step.id,))
    row = value.fetchone()
    assert row is not None
    expiry: datetime = row[0]
    return expiry


def test_text_array_round_trips_any_text(db: psycopg.Connection[Any]) -> None:
    values = [ODD_OWNER, "", "NULL", "a,b", "{}", '"', "\\", "é ü"]
    row = db.execute("SELECT %s::text[]", (text_array(values),)).fetchone()
    assert row is not None and row[0] == values


def test_one_statement_renews_each_held_lease_and_reports_the_others(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Held leases (one owner full of quotes and braces) are renewed; a stolen lease, a
    timed-out step and a stale claim of a renewed step come back as nothing (lost); a
    row locked by an open transaction comes back busy, at once, without a wait."""
    plain = _running(db, "w/1")
    odd = _running(db, ODD_OWNER)
    stolen = _running(db, "w/1")
    timed_out = _running(db, "w/1", timeout="1 minute")
    locked = _running(db, "w/1")
    db.execute("UPDATE cyclone_steps SET lease_generation = 2 WHERE id = %s", (stolen.id,))
    db.execute(
        "UPDATE cyclone_steps SET started_at = now() - interval '1 hour' WHERE id = %s",
        (timed_out.id,),
    )
    db.execute("UPDATE cyclone_steps SET lease_expiry = now() + interval '1 second'")
    before = {s.id: _expiry(db, s) for s in (plain, odd, stolen, timed_out, locked)}
    stale = replace(plain, owner="w/0")  # an older claim of the same step
    batch = [plain, odd, stolen, timed_out, locked, stale]
    with psycopg.connect(dsn) as other, psycopg.connect(dsn, autocommit=True) as worker:
        other.execute("SELECT 1 FROM cyclone_steps WHERE id = %s FOR UPDATE", (locked.id,))
        worker.execute("SET lock_timeout = '10s'")  # a wait would fail, not hang
        renewed, busy = parse_heartbeat(fetch_sync(worker, heartbeat_stmt(batch, ttl=30)))
        other.rollback()
    assert renewed == {(plain.id, plain.owner), (odd.id, ODD_OWNER)}
    assert busy == {(locked.id, locked.owner)}
    after = {s.id: _expiry(db, s) for s in (plain, odd, stolen, timed_out, locked)}
    assert after[plain.id] > before[plain.id] and after[odd.id] > before[odd.id]
    for step in (stolen, timed_out, locked):
        assert after[step.id] == before[step.id]
    rows = db.execute(
        "SELECT count(*) FROM cyclone_steps WHERE heartbeat_at IS NOT NULL"
    ).fetchone()
    assert rows == (2,)


def test_the_statement_runs_through_a_transaction_pooler_connection(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Through a pinned connection (a transaction pooler: client-side binding, one
    script) the array literals arrive intact: the odd owner's lease is renewed."""
    odd = _running(db, ODD_OWNER)
    plain = _running(db, "w/1")
    with psycopg.connect(dsn, autocommit=True) as conn:
        pin_search_path(conn, "public")
        rows = fetch_sync(conn, heartbeat_stmt([odd, plain], ttl=30))
    assert parse_heartbeat(rows) == ({(odd.id, ODD_OWNER), (plain.id, "w/1")}, set())
