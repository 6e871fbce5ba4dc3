"""Thin sync and async shells that run the engine's statements.

The engine decides what to write in pure code: a :class:`Stmt` (a named statement of
``cyclone/sql`` and its parameters), a list of them run as one pipelined batch, or a
:data:`Plan`, a generator that yields statements and receives their rows, for the rare
sequence that depends on what came back. The functions here only execute: the same
plan runs on a ``psycopg.Connection`` or a ``psycopg.AsyncConnection``, so the sync and
async paths cannot drift apart (CONTRIBUTING.md, Conventions: keep I/O out of the core).

A batch is one round trip. On a direct connection it is a pipeline of server-side
prepared statements (each statement is parsed and planned once per connection, then
only bound and executed: planning was most of the server's work per batch); on a
connection behind a transaction pooler (:func:`pin_search_path`), or one whose owner
turned prepared statements off (``prepare_threshold=None``), it is one multi-statement
query with parameters bound by psycopg's client cursor. With ``transaction=True`` it is
``BEGIN; ...; COMMIT`` on an autocommit connection. Nothing follows the ``COMMIT``:
psycopg raises for the whole batch when any statement in it fails, so a statement after
the commit could turn committed work into an error for the caller. Wakeups go out
afterwards, on their own (:mod:`cyclone.notify`), and their failure is only logged (an
enqueue's leading-edge wakeup is part of its statement instead).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import RowMaker, tuple_row

from cyclone.sql import Query

__all__ = [
    "Plan",
    "Results",
    "Stmt",
    "batch_async",
    "batch_sync",
    "fetch_async",
    "fetch_sync",
    "int_array",
    "pin_search_path",
    "run_plan_async",
    "run_plan_sync",
    "script",
    "text_array",
]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Stmt(Generic[R]):
    """One statement: a :class:`cyclone.sql.Query` (from ``cyclone.sql.Q``) and its
    named parameters; run, it gives a ``list[R]``, rows of the query's declared type."""

    query: Query[R]
    params: Mapping[str, Any] | None = None

    @property
    def sql(self) -> LiteralString:
        """The statement's text."""
        return self.query.sql


Plan = Generator[Stmt[Any], list[Any], T]
"""A sequence of statements where each may depend on the rows of the one before: the
generator yields a :class:`Stmt` and receives its rows (``rows: list[XRow] = yield
Stmt(Q.x, ...)``), then returns its result."""


class Results:
    """The rows of each statement of a batch, found by statement rather than by place.

    Args:
        stmts: the statements of the batch, in order.
        rows: the rows of each, aligned with ``stmts``.
    """

    __slots__ = ("_rows", "_stmts")

    def __init__(self, stmts: Sequence[Stmt[Any]], rows: Sequence[list[Any]]) -> None:
        self._stmts = stmts
        self._rows = rows

    def of(self, query: Query[R]) -> list[R]:
        """The rows of the batch's statement of ``query`` (the first, if there are more).

        Raises:
            KeyError: the batch has no statement of ``query``.
        """
        for stmt, rows in zip(self._stmts, self._rows, strict=True):
            if stmt.query.name == query.name:
                return rows
        raise KeyError(f"no {query.name} in this batch")

    def typed(self, row: type[R]) -> list[R]:
        """The rows of every statement of the batch whose rows are ``row``, in order."""
        return [
            item
            for stmt, rows in zip(self._stmts, self._rows, strict=True)
            if stmt.query.row is row
            for item in rows
        ]


def _row_factory(query: Query[R]) -> Callable[[Any], RowMaker[R]]:
    """The psycopg row factory of ``query``'s rows (see :class:`cyclone.sql.Query`), made
    once per statement: the first result with rows checks the statement's columns
    against its row type, and every later one takes the same row maker without looking
    at the columns again (they cannot change: the text is fixed).

    Raises (when a result arrives):
        RuntimeError: the statement's columns are not the fields of its row type.
    """
    factory = _FACTORIES.get(query)
    if factory is None:
        factory = _FACTORIES[query] = _checked_factory(query)
    return factory


_FACTORIES: dict[Query[Any], Callable[[Any], RowMaker[Any]]] = {}
"""The row factory of each statement run so far (the statements are a fixed set)."""


def _checked_factory(query: Query[R]) -> Callable[[Any], RowMaker[R]]:
    row: Any = query.row
    made: list[RowMaker[R]] = []

    def factory(cursor: Any) -> RowMaker[R]:
        if made:
            return made[0]
        res = cursor.pgresult
        if row is type(None) or res is None or res.status != TUPLES_OK:
            return _no_row  # nothing of it is read
        names = tuple(column.name for column in cursor.description)
        fields = getattr(row, "_fields", None)
        if fields is not None:
            if names != fields:
                raise RuntimeError(
                    f"{query.name} returns the columns {names}, "
                    f"its row type {row.__name__} has the fields {fields}"
                )
            maker: RowMaker[R] = row._make
        else:
            from_row = row.from_row
            maker = lambda values: from_row(dict(zip(names, values, strict=True)))  # noqa: E731
        made.append(maker)
        return maker

    return factory


def _no_row(values: Sequence[Any]) -> Any:
    return None


TUPLES_OK = ExecStatus.TUPLES_OK

_BEGIN_STMT = Stmt(Query.plain("BEGIN ISOLATION LEVEL READ COMMITTED"))
"""Engine transactions are READ COMMITTED whatever the server's default: the DAG advance
relies on each statement seeing what committed before the run row lock was granted."""
_COMMIT_STMT = Stmt(Query.plain("COMMIT"))

_SEARCH_PATH = Query.plain("SELECT set_config('search_path', %(cyclone_search_path)s, true)")
_PINNED: weakref.WeakKeyDictionary[Any, Stmt[None]] = weakref.WeakKeyDictionary()
"""Connections behind a transaction pooler, and the statement that sets their schema."""


def pin_search_path(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], schema: str
) -> None:
    """Set ``search_path`` to ``schema`` inside every transaction run here on ``conn``.

    For a connection through a transaction pooler, where no session setting survives
    from one transaction to the next: every statement or batch this module runs on
    ``conn`` is preceded, in the same message and the same transaction, by
    ``set_config('search_path', schema, true)`` (a transaction-local setting), and
    goes through the simple query protocol (nothing is prepared on the server).
    """
    _PINNED[conn] = Stmt(_SEARCH_PATH, {"cyclone_search_path": schema})


def _layout(
    stmts: Sequence[Stmt[Any]],
    *,
    transaction: bool = False,
    path: Stmt[None] | None = None,
) -> tuple[list[Stmt[Any]], list[int]]:
    """The statements of one message, and where the results of ``stmts`` are in it.

    ``BEGIN`` / ``COMMIT`` around ``stmts`` with ``transaction`` (the ``COMMIT`` last:
    nothing follows it in the message); with ``path`` (the schema statement of a
    connection pinned by :func:`pin_search_path`), that statement at the start of the
    transaction (after a leading ``SET TRANSACTION``, which must come first).
    """
    out: list[Stmt[Any]] = []
    where: list[int] = []
    pending = path
    if transaction:
        out.append(_BEGIN_STMT)
    for stmt in stmts:
        if pending is not None and not stmt.sql.startswith("SET TRANSACTION"):
            out.append(pending)
            pending = None
        where.append(len(out))
        out.append(stmt)
    if transaction:
        out.append(_COMMIT_STMT)
    return out, where


async def fetch_async(conn: psycopg.AsyncConnection[Any], stmt: Stmt[R]) -> list[R]:
    """Run one statement; its rows, of the statement's row type (empty for a statement
    with no result, or whose rows are not read).

    Works on a connection in pipeline mode too (fetching forces the results), and on a
    connection pinned by :func:`pin_search_path` (its statements go as one script).
    """
    if conn in _PINNED:
        return (await batch_async(conn, [stmt], transaction=False)).of(stmt.query)
    cur = conn.cursor(row_factory=_row_factory(stmt.query))
    await cur.execute(stmt.sql, stmt.params)
    return await cur.fetchall() if _read(cur, stmt) else []


def fetch_sync(conn: psycopg.Connection[Any], stmt: Stmt[R]) -> list[R]:
    """The synchronous twin of :func:`fetch_async`."""
    if conn in _PINNED:
        return batch_sync(conn, [stmt], transaction=False).of(stmt.query)
    cur = conn.cursor(row_factory=_row_factory(stmt.query))
    cur.execute(stmt.sql, stmt.params)
    return cur.fetchall() if _read(cur, stmt) else []


def _read(cur: Any, stmt: Stmt[Any]) -> bool:
    """Whether the current result of ``cur`` holds rows to read for ``stmt`` (its status,
    not its description: that builds a column object per column at each call)."""
    res = cur.pgresult
    return res is not None and res.status == TUPLES_OK and stmt.query.row is not type(None)


def int_array(values: Iterable[int], *, keep_order: bool = False) -> str:
    """A PostgreSQL array literal of integers, sorted (``{1,2,3}``), for ``::bigint[]``.

    One text parameter instead of a list that the driver adapts element by element.
    With ``keep_order`` the values keep their order (an array aligned with others, for
    ``unnest(a, b, ...)``).
    """
    ints = (str(int(v)) for v in (values if keep_order else sorted(values)))
    return "{" + ",".join(ints) + "}"


def text_array(values: Iterable[str]) -> str:
    """A PostgreSQL array literal of strings in their order, for ``::text[]``.

    Each element is double-quoted, with ``\\`` and ``"`` escaped by a backslash, so any
    text (commas, braces, quotes, the word NULL) comes back as it was sent.
    """
    quoted = ('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)
    return "{" + ",".join(quoted) + "}"


def script(stmts: Sequence[Stmt[Any]]) -> tuple[LiteralString, dict[str, Any]]:
    """Join statements into one multi-statement query with one parameter mapping.

    Raises:
        ValueError: two statements give one parameter name different values.
    """
    params: dict[str, Any] = {}
    for stmt in stmts:
        for name, value in (stmt.params or {}).items():
            if name in params and params[name] != value:
                raise ValueError(f"parameter {name!r} has two values in one batch")
            params[name] = value
    query: LiteralString = ";\n".join(stmt.sql for stmt in stmts)
    return query, params


def _prepared(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether batches on ``conn`` go as a pipeline of prepared statements."""
    return conn not in _PINNED and conn.prepare_threshold is not None


def _preparable(sql: str) -> bool:
    """Statements worth a server-side prepared statement (not transaction control)."""
    return not sql.startswith(("BEGIN", "COMMIT", "SET ", "LISTEN"))


async def _pipeline_async(
    conn: psycopg.AsyncConnection[Any], stmts: Sequence[Stmt[Any]], transaction: bool
) -> list[list[Any]]:
    cursors: list[psycopg.AsyncCursor[Any]] = []
    try:
        async with conn.pipeline():
            if transaction:
                await conn.execute(_BEGIN_STMT.sql, prepare=False)
            for stmt in stmts:
                cur = conn.cursor(row_factory=_row_factory(stmt.query))
                await cur.execute(stmt.sql, stmt.params, prepare=_preparable(stmt.sql))
                cursors.append(cur)
            if transaction:
                await conn.execute(_COMMIT_STMT.sql, prepare=False)
    except BaseException:
        if transaction and conn.info.transaction_status != TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                await conn.execute("ROLLBACK")
        raise
    return [
        await cur.fetchall() if _read(cur, stmt) else []
        for cur, stmt in zip(cursors, stmts, strict=True)
    ]


def _pipeline_sync(
    conn: psycopg.Connection[Any], stmts: Sequence[Stmt[Any]], transaction: bool
) -> list[list[Any]]:
    cursors: list[psycopg.Cursor[Any]] = []
    try:
        with conn.pipeline():
            if transaction:
                conn.execute(_BEGIN_STMT.sql, prepare=False)
            for stmt in stmts:
                cur = conn.cursor(row_factory=_row_factory(stmt.query))
                cur.execute(stmt.sql, stmt.params, prepare=_preparable(stmt.sql))
                cursors.append(cur)
            if transaction:
                conn.execute(_COMMIT_STMT.sql, prepare=False)
    except BaseException:
        if transaction and conn.info.transaction_status != TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    return [
        cur.fetchall() if _read(cur, stmt) else [] for cur, stmt in zip(cursors, stmts, strict=True)
    ]


async def batch_async(
    conn: psycopg.AsyncConnection[Any],
    stmts: Sequence[Stmt[Any]],
    *,
    transaction: bool,
) -> Results:
    """Run statements in one round trip; the rows of each (:class:`Results`).

    A pipeline of prepared statements, or one multi-statement query on a connection
    behind a transaction pooler (see the module's docstring). With ``transaction=True``
    the connection must be in autocommit mode and the statements run between ``BEGIN``
    and ``COMMIT`` (the last statement sent; a failed batch is rolled back). Without it
    they join the connection's current transaction (a caller's, or a completion
    transaction).

    Raises:
        RuntimeError: ``transaction=True`` on a connection not in autocommit mode.
    """
    if transaction and not conn.autocommit:
        raise RuntimeError("a transactional batch needs an autocommit connection")
    if _prepared(conn):
        return Results(stmts, await _pipeline_async(conn, stmts, transaction))
    wrapped, where = _layout(stmts, transaction=transaction, path=_PINNED.get(conn))
    results: list[list[Any]] = []
    async with psycopg.AsyncClientCursor(conn) as cur:
        await cur.execute(*script(wrapped))
        for stmt in wrapped:
            cur.row_factory = _row_factory(stmt.query)  # read now, on this result
            results.append(await cur.fetchall() if _read(cur, stmt) else [])
            cur.row_factory = tuple_row  # nextset() reads the next result with it
            cur.nextset()
    return Results(stmts, [results[i] for i in where])


def batch_sync(
    conn: psycopg.Connection[Any],
    stmts: Sequence[Stmt[Any]],
    *,
    transaction: bool,
) -> Results:
    """The synchronous twin of :func:`batch_async`."""
    if transaction and not conn.autocommit:
        raise RuntimeError("a transactional batch needs an autocommit connection")
    if _prepared(conn):
        return Results(stmts, _pipeline_sync(conn, stmts, transaction))
    wrapped, where = _layout(stmts, transaction=transaction, path=_PINNED.get(conn))
    results: list[list[Any]] = []
    with psycopg.ClientCursor(conn) as cur:
        cur.execute(*script(wrapped))
        for stmt in wrapped:
            cur.row_factory = _row_factory(stmt.query)  # read now, on this result
            results.append(cur.fetchall() if _read(cur, stmt) else [])
            cur.row_factory = tuple_row  # nextset() reads the next result with it
            cur.nextset()
    return Results(stmts, [results[i] for i in where])


async def run_plan_async(conn: psycopg.AsyncConnection[Any], plan: Plan[T]) -> T:
    """Drive ``plan`` on ``conn``, one statement per round trip; its return value."""
    try:
        stmt = next(plan)
        while True:
            stmt = plan.send(await fetch_async(conn, stmt))
    except StopIteration as stop:
        result: T = stop.value
        return result


def run_plan_sync(conn: psycopg.Connection[Any], plan: Plan[T]) -> T:
    """The synchronous twin of :func:`run_plan_async`."""
    try:
        stmt = next(plan)
        while True:
            stmt = plan.send(fetch_sync(conn, stmt))
    except StopIteration as stop:
        result: T = stop.value
        return result
