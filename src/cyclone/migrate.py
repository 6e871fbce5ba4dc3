"""The migration runner: numbered SQL files applied once, each under a transaction lock.

The files are ``cyclone/migrations/NNNN_<name>.sql`` inside the package. Each missing
version is applied in a transaction of its own, which first takes the schema's
transaction-scoped advisory lock (``pg_advisory_xact_lock``), creates the target schema
and ``cyclone_schema_version`` when missing, re-reads the applied versions, then applies
the next missing file and records it. Nothing outlives a transaction (no session lock,
no session setting: the schema is set with ``set_config(..., true)`` in each one), so
migrating through any pooler is safe, transaction mode included. Calling it at every
process start is safe; concurrent callers take turns and the later ones find nothing to
do.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from cyclone.connections import ConnectionSettings
from cyclone.dbio import Stmt, fetch_sync
from cyclone.errors import ConfigurationError
from cyclone.options import HOUR, Duration, seconds
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


def migrate(
    conninfo: str,
    *,
    schema: str = "public",
    pooler: str | None = None,
    connect_timeout: Duration = 10.0,
) -> list[int]:
    """Bring the database at ``conninfo`` to the newest schema.

    Args:
        conninfo: a libpq connection string or URL.
        schema: the Postgres schema to install into (created when missing).
        pooler: ``"transaction"`` when ``conninfo`` goes through a transaction-mode
            pooler, ``"session"`` otherwise; default ``$CYCLONE_POOLER``, else
            ``"session"``. Migration is safe through a pooler either way; the mode
            decides whether the schema may travel as a startup option.
        connect_timeout: seconds to wait for the connection (``timedelta`` or seconds,
            default 10), unless ``conninfo`` sets libpq's ``connect_timeout``.

    Returns:
        The versions applied by this call, in order; empty when already current.

    Raises:
        ValidationError: ``schema`` is not a plain identifier, or a bad ``pooler``.
        psycopg.OperationalError: the database cannot be reached (within
            ``connect_timeout``).
    """
    limit = seconds(connect_timeout, "connect_timeout", minimum=0.1, maximum=HOUR)
    settings = ConnectionSettings.build(
        conninfo, schema=schema, pooler=pooler, connect_timeout=limit
    )
    migrations = available_migrations()
    applied: list[int] = []
    with psycopg.connect(
        settings.conninfo_for("cyclone-migrate"), **settings.kwargs(autocommit=True)
    ) as conn:
        while True:
            with conn.transaction():
                done = _lock_and_read(conn, schema)
                missing = [m for m in migrations if m.version not in done]
                if not missing:
                    break
                conn.execute(missing[0].text)
                conn.execute(Q.migrate_record.sql, {"version": missing[0].version})
            applied.append(missing[0].version)
            log.info("applied migration %04d_%s", missing[0].version, missing[0].name)
    return applied


def _lock_and_read(conn: psycopg.Connection[Any], schema: str) -> set[int]:
    """In the migration transaction: take the lock, make sure the schema and the version
    table exist, point ``search_path`` at the schema; the versions applied so far."""
    conn.execute(Q.migrate_lock.sql, {"schema": schema})
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(_LOCAL_PATH, {"schema": schema})
    conn.execute(Q.migrate_version_table.sql)
    return {row.version for row in fetch_sync(conn, Stmt(Q.migrate_applied))}


_LOCAL_PATH: LiteralString = "SELECT set_config('search_path', %(schema)s, true)"


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


def check_schema(
    conninfo: str,
    *,
    schema: str = "public",
    pooler: str | None = None,
    settings: ConnectionSettings | None = None,
) -> None:
    """Connect once and check that the schema is installed and current.

    ``settings`` (a client's) replaces ``conninfo``, ``schema`` and ``pooler``, with its
    connect and TCP timeouts.

    Raises:
        ConfigurationError: the schema is missing or older than this Cyclone.
        ValidationError: a bad schema name or pooler mode.
        psycopg.OperationalError: the database cannot be reached (at once, with the
            server's own message).
    """
    settings = settings or ConnectionSettings.build(conninfo, schema=schema, pooler=pooler)
    with psycopg.connect(
        settings.conninfo_for("cyclone"), **settings.kwargs(autocommit=True)
    ) as conn:
        settings.prepare(conn)
        try:
            rows = fetch_sync(conn, Stmt(Q.migrate_current))
        except psycopg.errors.UndefinedTable:
            rows = []
    _judge(rows[0].version if rows else None, schema)


async def check_schema_async(
    conninfo: str,
    *,
    schema: str = "public",
    pooler: str | None = None,
    settings: ConnectionSettings | None = None,
) -> None:
    """:func:`check_schema` from asyncio code, run in a worker thread."""
    await asyncio.to_thread(check_schema, conninfo, schema=schema, pooler=pooler, settings=settings)


async def migrate_async(
    conninfo: str,
    *,
    schema: str = "public",
    pooler: str | None = None,
    connect_timeout: Duration = 10.0,
) -> list[int]:
    """:func:`migrate` from asyncio code, run in a worker thread."""
    return await asyncio.to_thread(
        migrate, conninfo, schema=schema, pooler=pooler, connect_timeout=connect_timeout
    )
