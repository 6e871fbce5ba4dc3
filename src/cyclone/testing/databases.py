"""Throwaway databases for tests: a migrated template, cloned once per test.

``CREATE DATABASE ... TEMPLATE`` copies a migrated database in a few milliseconds, far
faster than migrating a new one, and each clone is a real database of its own (real
commits, ``LISTEN``/``NOTIFY``, nothing shared between tests).
"""

from __future__ import annotations

import uuid

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["create_database", "database_dsn", "drop_database"]


def database_dsn(admin_dsn: str, name: str) -> str:
    """``admin_dsn`` (a libpq connection string or URL) pointed at database ``name``."""
    return make_conninfo("", **{**conninfo_to_dict(admin_dsn), "dbname": name})


def create_database(admin_dsn: str, prefix: str, *, template: str | None = None) -> str:
    """Create a database named ``prefix`` and a random suffix, a copy of ``template``
    when given (no session may be connected to it); its name.

    Raises:
        psycopg.Error: the role of ``admin_dsn`` may not create databases, or the
            template is in use.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(statement)
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop database ``name`` if it exists, ending the sessions still on it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
