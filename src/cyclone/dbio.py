"""Thin sync and async shells that run the engine's statements.

The engine decides what to write in pure code: a :class:`Stmt` (a named statement of
``cyclone/sql`` and its parameters), a list of them run as one pipelined batch, or a
:data:`Plan`, a generator that yields statements and receives their rows, for the rare
sequence that depends on what came back. The functions here only execute: the same
plan runs on a ``psycopg.Connection`` or a ``psycopg.AsyncConnection``, so the sync and
async paths cannot drift apart (style.md, Keep I/O out of the core).

A batch with ``transaction=True`` is sent as ``BEGIN; ...; COMMIT`` in one pipeline
flush on an autocommit connection: one round trip for a whole transaction. Statements
given as ``after`` follow the ``COMMIT`` in the same flush, in a transaction of their
own: that is how wakeups are sent after (never inside) the transaction they announce,
at no extra round trip. They are best effort: their failure is logged, not raised.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg.rows import dict_row

__all__ = [
    "Plan",
    "Rows",
    "Stmt",
    "batch_async",
    "batch_sync",
    "fetch_async",
    "fetch_dicts_async",
    "fetch_dicts_sync",
    "fetch_sync",
    "run_plan_async",
    "run_plan_sync",
]

log = logging.getLogger("cyclone.dbio")

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement: its SQL (from ``cyclone.sql.Q``) and named parameters."""

    sql: LiteralString
    params: Mapping[str, Any] | None = None


Plan = Generator[Stmt, Rows, T]
"""A sequence of statements where each may depend on the rows of the one before."""

_BEGIN: LiteralString = "BEGIN"
_COMMIT: LiteralString = "COMMIT"


async def fetch_async(conn: psycopg.AsyncConnection[Any], stmt: Stmt) -> Rows:
    """Run one statement; its rows as tuples (empty for a statement with no result)."""
    cur = await conn.execute(stmt.sql, stmt.params)
    return await cur.fetchall() if cur.description is not None else []


def fetch_sync(conn: psycopg.Connection[Any], stmt: Stmt) -> Rows:
    """Run one statement; its rows as tuples (empty for a statement with no result)."""
    cur = conn.execute(stmt.sql, stmt.params)
    return cur.fetchall() if cur.description is not None else []


async def fetch_dicts_async(conn: psycopg.AsyncConnection[Any], stmt: Stmt) -> list[dict[str, Any]]:
    """Run one statement; its rows as dicts keyed by column name."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(stmt.sql, stmt.params)
        return await cur.fetchall()


def fetch_dicts_sync(conn: psycopg.Connection[Any], stmt: Stmt) -> list[dict[str, Any]]:
    """Run one statement; its rows as dicts keyed by column name."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(stmt.sql, stmt.params)
        return cur.fetchall()


async def batch_async(
    conn: psycopg.AsyncConnection[Any],
    stmts: Sequence[Stmt],
    *,
    transaction: bool,
    after: Sequence[Stmt] = (),
) -> list[Rows]:
    """Run statements in one pipeline flush; the rows of each, in order.

    With ``transaction=True`` the connection must be in autocommit mode; the batch runs
    between ``BEGIN`` and ``COMMIT``, and the ``after`` statements run once it has
    committed (best effort). Without it the statements join the connection's current
    transaction (a caller's, or a completion transaction) and ``after`` must be empty.
    """
    _check_batch(conn.autocommit, transaction, after)
    cursors: list[psycopg.AsyncCursor[Any]] = []
    commit: psycopg.AsyncCursor[Any] | None = None
    try:
        async with conn.pipeline():
            if transaction:
                await conn.execute(_BEGIN)
            cursors = [await conn.execute(s.sql, s.params) for s in stmts]
            if transaction:
                commit = await conn.execute(_COMMIT)
            for stmt in after:
                await conn.execute(stmt.sql, stmt.params)
    except psycopg.Error as exc:
        if not after or commit is None or commit.statusmessage != "COMMIT":
            raise
        log.warning("statement after commit failed (best effort): %s", exc)
    return [await c.fetchall() if c.description is not None else [] for c in cursors]


def batch_sync(
    conn: psycopg.Connection[Any],
    stmts: Sequence[Stmt],
    *,
    transaction: bool,
    after: Sequence[Stmt] = (),
) -> list[Rows]:
    """The synchronous twin of :func:`batch_async`."""
    _check_batch(conn.autocommit, transaction, after)
    cursors: list[psycopg.Cursor[Any]] = []
    commit: psycopg.Cursor[Any] | None = None
    try:
        with conn.pipeline():
            if transaction:
                conn.execute(_BEGIN)
            cursors = [conn.execute(s.sql, s.params) for s in stmts]
            if transaction:
                commit = conn.execute(_COMMIT)
            for stmt in after:
                conn.execute(stmt.sql, stmt.params)
    except psycopg.Error as exc:
        if not after or commit is None or commit.statusmessage != "COMMIT":
            raise
        log.warning("statement after commit failed (best effort): %s", exc)
    return [c.fetchall() if c.description is not None else [] for c in cursors]


def _check_batch(autocommit: bool, transaction: bool, after: Sequence[Stmt]) -> None:
    if transaction and not autocommit:
        raise RuntimeError("a transactional batch needs an autocommit connection")
    if after and not transaction:
        raise RuntimeError("statements after commit need a transactional batch")


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
