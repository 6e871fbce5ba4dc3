"""Every named statement returns the columns its declared row type reads.

The server describes each statement of ``cyclone.sql.Q`` (prepared, never run): a
statement whose rows are a :mod:`cyclone.sql.rows` tuple must return exactly that
tuple's fields, in order; one read as a public record must return one column per field
of the record. The row factory of :mod:`cyclone.dbio` checks the same at run time, and
refuses a mismatch naming both lists.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, NamedTuple

import psycopg
import pytest

from cyclone.dbio import Stmt, batch_sync, fetch_sync, pin_search_path
from cyclone.sql import Q, Queries, Query
from cyclone.sql.rows import IdRow, NowRow


def _columns(conn: psycopg.Connection[Any], sql: str) -> tuple[str, ...]:
    """The names of the columns ``sql`` returns, as the server describes them."""
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", sql):
        if name not in names:
            names.append(name)
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql)
    conn.pgconn.prepare(b"described", text.encode())
    described = conn.pgconn.describe_prepared(b"described")
    conn.execute("DEALLOCATE described")
    return tuple((described.fname(i) or b"").decode() for i in range(described.nfields))


@pytest.mark.parametrize("name", sorted(Queries.__annotations__))
def test_each_statement_returns_the_columns_of_its_row_type(
    name: str, db: psycopg.Connection[Any]
) -> None:
    query: Query[Any] = getattr(Q, name)
    columns = _columns(db, query.sql.replace("%(limit)s", "10"))
    row: Any = query.row
    if row is type(None):
        return  # rows not read
    if hasattr(row, "_fields"):
        assert columns == row._fields, f"{name}: {columns} vs {row.__name__}{row._fields}"
    else:
        fields = [f.name for f in dataclasses.fields(row)]
        assert len(columns) == len(fields), f"{name}: {columns} vs {row.__name__}{fields}"


class _Wrong(NamedTuple):
    when: Any


def test_a_row_type_that_does_not_match_is_refused_naming_both(
    db: psycopg.Connection[Any],
) -> None:
    wrong = Query("schedules_now", Q.schedules_now.sql, _Wrong)
    with pytest.raises(RuntimeError, match=r"\('now',\).*_Wrong.*\('when',\)"):
        fetch_sync(db, Stmt(wrong))
    db.rollback()
    (row,) = fetch_sync(db, Stmt(Q.schedules_now))
    assert isinstance(row, NowRow) and row.now is not None


def test_batch_results_are_found_by_statement(db: psycopg.Connection[Any]) -> None:
    db.autocommit = True
    results = batch_sync(
        db,
        [Stmt(Q.schedules_now), Stmt(Q.runs_lock, {"run_ids": "{}"})],
        transaction=True,
    )
    assert results.of(Q.runs_lock) == []
    assert [type(r) for r in results.of(Q.schedules_now)] == [NowRow]
    assert results.typed(IdRow) == [] and len(results.typed(NowRow)) == 1
    with pytest.raises(KeyError, match="runs_get"):
        results.of(Q.runs_get)


def test_a_batch_behind_a_transaction_pooler_reads_each_result_with_its_row_type(
    db: psycopg.Connection[Any],
) -> None:
    """On a connection pinned to a schema (one multi-statement query, as behind a
    transaction pooler) every statement's rows are read with its own row type, the
    schema statement and BEGIN/COMMIT between them included."""
    db.autocommit = True
    pin_search_path(db, "public")
    stmts: list[Stmt[Any]] = [
        Stmt(Q.runs_lock, {"run_ids": "{}"}),
        Stmt(Q.schedules_now),
        Stmt(Q.migrate_current),
    ]
    for transaction in (True, False):
        results = batch_sync(db, stmts, transaction=transaction)
        assert results.of(Q.runs_lock) == []
        assert isinstance(results.of(Q.schedules_now)[0], NowRow)
        assert results.of(Q.migrate_current)[0].version >= 1
    (now,) = fetch_sync(db, Stmt(Q.schedules_now))
    assert isinstance(now, NowRow)
