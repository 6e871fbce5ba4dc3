"""The tests of a module share one database, reset before each test (tests/conftest.py):
what one test leaves behind never reaches the next. The first test below leaves rows,
a table of its own and a changed database setting; the second, run after it on the
module's database, finds none of them and the identities starting again at 1."""

from __future__ import annotations

from typing import Any

import psycopg

import cyclone
from tests.helpers import scalar

_seen: list[str] = []


def test_leaves_rows_a_table_and_a_setting_behind(dsn: str, db: psycopg.Connection[Any]) -> None:
    with cyclone.SyncClient(dsn) as client:
        client.enqueue_many("reset_job", [1, 2, 3])
    db.execute("CREATE TABLE leftover (x int)")
    db.execute(
        f"ALTER DATABASE {db.info.dbname} SET default_transaction_isolation = 'serializable'"
    )
    _seen.append(dsn)
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 3


def test_finds_nothing_left_behind(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
    assert scalar(db, "SELECT count(*) FROM cyclone_steps") == 0
    assert scalar(db, "SELECT to_regclass('leftover') IS NULL") is True
    assert scalar(db, "SHOW default_transaction_isolation") == "read committed"
    with cyclone.SyncClient(dsn) as client:
        assert client.enqueue("reset_job", 1).run_id == 1
    _seen.append(dsn)


def test_a_database_where_only_rows_changed_serves_the_next_test(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """The first test changed more than rows: the second got a fresh clone. The second
    left only rows: they were deleted in place, and this test has its database."""
    assert _seen[0] != _seen[1] == dsn
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
