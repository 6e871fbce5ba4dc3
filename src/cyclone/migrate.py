"""The migration runner: numbered SQL files applied once, under an advisory lock.

The files are ``cyclone/migrations/NNNN_<name>.sql`` inside the package. ``migrate``
takes a session-level advisory lock (so connect directly or through session-mode
PgBouncer), creates the target schema and ``cyclone_schema_version`` when missing,
applies each missing version in its own transaction and records it. Calling it at
every process start is safe; concurrent callers wait for each other and the later ones
find nothing to do (schema-reference, Migration and Compatibility Notes).
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import LiteralString

import psycopg
from psycopg import sql

from cyclone.connections import check_schema_name, connect_kwargs
from cyclone.errors import ConfigurationError
from cyclone.sql import Q

__all__ = [
    "Migration",
    "available_migrations",
    "check_schema",
    "check_schema_async",
    "migrate",
    "migrate_async",
]

log = logging.getLogger("cyclone.migrate")

_FILE = re.compile(r"^(\d{4})_(\w+)\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration file: its ``version`` number, ``name`` and SQL text."""

    version: int
    name: str
    text: LiteralString


def available_migrations() -> list[Migration]:
    """Every migration shipped in the package, in version order."""
    found = []
    for entry in resources.files("cyclone.migrations").iterdir():
        match = _FILE.match(entry.name)
        if match:
            text: LiteralString = entry.read_text("utf-8")
            found.append(Migration(int(match.group(1)), match.group(2), text))
    return sorted(found, key=lambda m: m.version)


def migrate(conninfo: str, *, schema: str = "public") -> list[int]:
    """Bring the database at ``conninfo`` to the newest schema.

    Args:
        conninfo: a libpq connection string or URL.
        schema: the Postgres schema to install into (created when missing).

    Returns:
        The versions applied by this call, in order; empty when already current.

    Raises:
        ValidationError: ``schema`` is not a plain identifier.
        psycopg.OperationalError: the database cannot be reached.
    """
    check_schema_name(schema)
    applied: list[int] = []
    with psycopg.connect(conninfo, autocommit=True, **connect_kwargs(schema)) as conn:
        conn.execute(Q.migrate_lock, {"schema": schema})
        try:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            conn.execute(Q.migrate_version_table)
            done = {row[0] for row in conn.execute(Q.migrate_applied).fetchall()}
            for migration in available_migrations():
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.text)
                    conn.execute(Q.migrate_record, {"version": migration.version})
                applied.append(migration.version)
        finally:
            conn.execute(Q.migrate_unlock, {"schema": schema})
    return applied


def _judge(current: int | None, schema: str) -> None:
    newest = available_migrations()[-1].version
    if current is None or current < newest:
        found = "not installed" if not current else f"at version {current}"
        raise ConfigurationError(
            f"Cyclone's schema in {schema!r} is {found}, this Cyclone needs version {newest}: "
            f"run `cyclone migrate --dsn ...` (or cyclone.migrate(dsn)) first"
        )
    if current > newest:
        log.warning(
            "the database schema (version %d) is newer than this Cyclone (%d)", current, newest
        )


def check_schema(conninfo: str, *, schema: str = "public") -> None:
    """Connect once and check that the schema is installed and current.

    Raises:
        ConfigurationError: the schema is missing or older than this Cyclone.
        psycopg.OperationalError: the database cannot be reached (at once, with the
            server's own message).
    """
    with psycopg.connect(conninfo, autocommit=True, **connect_kwargs(schema)) as conn:
        try:
            row = conn.execute(Q.migrate_current).fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
    _judge(row[0] if row else None, schema)


async def check_schema_async(conninfo: str, *, schema: str = "public") -> None:
    """:func:`check_schema` from asyncio code."""
    conn = await psycopg.AsyncConnection.connect(
        conninfo, autocommit=True, **connect_kwargs(schema)
    )
    async with conn:
        try:
            row = await (await conn.execute(Q.migrate_current)).fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
    _judge(row[0] if row else None, schema)


async def migrate_async(conninfo: str, *, schema: str = "public") -> list[int]:
    """:func:`migrate` from asyncio code, run in a worker thread."""
    return await asyncio.to_thread(migrate, conninfo, schema=schema)
