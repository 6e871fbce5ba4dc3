"""Throwaway databases and connection strings for the benchmarks.

Every benchmark runs in a database of its own, created from an admin DSN (a role that
may create databases) and dropped with ``WITH (FORCE)`` afterwards, even on failure,
so that nothing depends on or leaves behind state in the admin's database.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = [
    "DEFAULT_ADMIN_DSN",
    "execute",
    "log",
    "server_settings",
    "throwaway_database",
    "transaction_pooler",
    "with_dbname",
]

DEFAULT_ADMIN_DSN = "host=127.0.0.1 user=postgres dbname=test"


def log(message: str) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(message, file=sys.stderr, flush=True)


def with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` pointed at database ``dbname``, every other parameter kept."""
    params = conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return make_conninfo("", **params)


@contextlib.contextmanager
def throwaway_database(admin_dsn: str, prefix: str) -> Iterator[str]:
    """Create an empty database, yield its DSN, and drop it on the way out."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    ident = sql.Identifier(name)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        yield with_dbname(admin_dsn, name)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


@contextlib.contextmanager
def transaction_pooler(admin_dsn: str, *, pool_size: int) -> Iterator[Callable[[str], str]]:
    """A PgBouncer in transaction mode in front of the server of ``admin_dsn``, started
    here and stopped on the way out (the tests' :class:`tests.pgbouncer.PgBouncer`,
    ``default_pool_size = pool_size``); yields the function that turns a direct DSN into
    the DSN of the same database through it.

    Raises:
        RuntimeError: PgBouncer is not installed, or did not start.
    """
    from tests.pgbouncer import PgBouncer, available

    if not available():
        raise RuntimeError("pgbouncer is not installed (or runuser is missing, as root)")
    bouncer = PgBouncer(admin_dsn, pool_size=pool_size, mode="transaction")
    bouncer.start()
    try:
        yield lambda dsn: bouncer.dsn(str(conninfo_to_dict(dsn)["dbname"]))
    finally:
        bouncer.stop()


def execute(dsn: str, *statements: str) -> None:
    """Run statements one by one in autocommit mode (so VACUUM and CHECKPOINT work)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def server_settings(dsn: str) -> dict[str, Any]:
    """The server version and the settings that shape the figures."""
    names = ["server_version", "max_connections", "shared_buffers", "synchronous_commit", "fsync"]
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name", [names]
        ).fetchall()
    return dict(rows)
