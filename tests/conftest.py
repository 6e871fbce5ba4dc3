"""Test databases on a real PostgreSQL server.

The server is, in order: ``$CYCLONE_TEST_DSN`` (an admin DSN), the local server at
127.0.0.1:5432 (user ``postgres`` or ``root``), or an embedded server from the
``pgserver`` package (``pip install -e '.[embedded]'``) in a temporary folder.

A migrated template database is made once per session; each test module gets a
database cloned from it (real commits, LISTEN/NOTIFY work), and each test that asks
for ``dsn`` gets it reset to the template's state: the other sessions on it ended,
every row deleted, its identities restarted. A test that changed
more than rows (a table, a column, a privilege, a trigger, a database setting,
statistics, or tables grown to ten pages) leaves a database whose shape differs from
the template's; the next test then gets a fresh clone instead. Nothing depends on
state left by an earlier run or an earlier test. The template holds the test-only
transition guard (:mod:`tests.guard`): in every cloned database a state
change that the transition tables do not list, or a row that breaks a state invariant,
makes its statement fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import cyclone
from cyclone.devserver import DevServer, find_server
from cyclone.errors import ConfigurationError
from tests import guard


def _find_server() -> DevServer:
    try:
        return find_server(env_var="CYCLONE_TEST_DSN")
    except ConfigurationError as exc:
        pytest.exit(str(exc), returncode=3)


def database_dsn(admin_dsn: str, name: str) -> str:
    """``admin_dsn`` pointed at database ``name``."""
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    return make_conninfo("", **params)


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """A DSN with the right to create and drop databases."""
    server = _find_server()
    yield server.dsn
    server.stop()


def create_database(admin_dsn: str, *, template: str | None = None) -> str:
    """Create a fresh database (from ``template`` if given); its name."""
    name = f"cyclone_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if template:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        else:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return name


def drop_database(admin_dsn: str, name: str) -> None:
    """Drop a test database, disconnecting whoever is still on it."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> Iterator[str]:
    """A migrated database that per-test databases are cloned from, with the
    transition guard of :mod:`tests.guard` (every clone enforces the state tables)."""
    name = create_database(admin_dsn)
    cyclone.migrate(database_dsn(admin_dsn, name))
    with psycopg.connect(database_dsn(admin_dsn, name)) as conn:
        guard.install(conn)
    yield name
    drop_database(admin_dsn, name)


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A DSN to a new, empty (unmigrated) database of its own."""
    name = create_database(admin_dsn)
    yield database_dsn(admin_dsn, name)
    drop_database(admin_dsn, name)


_SHAPE = """
SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
    SELECT c.relkind::text || ':' || n.nspname || '.' || c.relname || ':' || coalesce(a.attname, '')
           || ':' || coalesce(a.atttypid::text, '') || ':' || coalesce(c.relacl::text, '') AS x
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
    UNION ALL
    SELECT 'trigger:' || tgname || ':' || tgenabled::text FROM pg_trigger WHERE NOT tgisinternal
    UNION ALL
    SELECT 'function:' || p.proname || ':' || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
    UNION ALL
    SELECT 'schema:' || nspname || ':' || coalesce(nspacl::text, '') FROM pg_namespace
    UNION ALL
    SELECT 'setting:' || array_to_string(setconfig, ';') FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT 'statistics:' || count(*) FROM pg_statistic s
    JOIN pg_class c ON c.oid = s.starelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public'
) shape
"""
"""A fingerprint of what a test may change besides rows: relations and their columns
and privileges, triggers and whether they are enabled, functions, schemas, database
settings, and whether statistics were gathered."""

_TABLES = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname <> 'cyclone_schema_version'
"""


def _shape(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(_SHAPE).fetchone()
    assert row is not None
    return str(row[0])


@pytest.fixture(scope="session")
def template_shape(admin_dsn: str, template_db: str) -> str:
    """The shape (:data:`_SHAPE`) of a fresh clone of the template."""
    name = create_database(admin_dsn, template=template_db)
    try:
        return _shape(database_dsn(admin_dsn, name))
    finally:
        drop_database(admin_dsn, name)


@pytest.fixture(scope="module")
def module_db(admin_dsn: str, template_db: str) -> Iterator[list[str]]:
    """The module's database, as a one-element list: the ``dsn`` fixture replaces it
    with a fresh clone when a test changed its shape."""
    holder = [create_database(admin_dsn, template=template_db)]
    yield holder
    drop_database(admin_dsn, holder[0])


_IDENTITIES = """
SELECT pg_get_serial_sequence(quote_ident(table_name), column_name)
FROM information_schema.columns
WHERE table_schema = 'public' AND is_identity = 'YES'
"""

_BIG = """
SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')
  AND pg_relation_size(c.oid) >= 10 * current_setting('block_size')::int
"""

_CLEARS: dict[str, sql.Composed] = {}
"""The statements that empty a database of a shape, by shape (computed once)."""


def _clear_script(conn: psycopg.Connection[Any], shape: str) -> sql.Composed:
    """One script that deletes every row (the runs and the schedules first, and with
    them, by their foreign keys, most of the rest) and restarts every identity, in one
    transaction and one round trip."""
    if shape not in _CLEARS:
        tables = [row[0] for row in conn.execute(_TABLES).fetchall()]
        sequences = [row[0] for row in conn.execute(_IDENTITIES).fetchall()]
        parts: list[sql.Composable] = [sql.SQL("BEGIN")]
        parts += [sql.SQL("DELETE FROM cyclone_runs"), sql.SQL("DELETE FROM cyclone_schedules")]
        parts += [sql.SQL("DELETE FROM {}").format(sql.Identifier(t)) for t in tables]
        restart = (
            "SELECT setval({0}, (SELECT seqstart FROM pg_sequence"
            " WHERE seqrelid = {0}::regclass), false)"
        )
        parts += [sql.SQL(restart).format(sql.Literal(q)) for q in sequences]
        parts.append(sql.SQL("COMMIT"))
        _CLEARS[shape] = sql.SQL(";\n").join(parts)
    return _CLEARS[shape]


def _reset(admin_dsn: str, name: str, shape: str) -> bool:
    """End the other sessions on database ``name``, delete every row of its tables and
    restart its identities; False when its shape is no longer ``shape``, the
    template's (the caller replaces it).

    Rows are deleted, not truncated (a TRUNCATE of the indexed tables costs more than a
    new clone), and the identities restarted with ``setval`` (no DDL), all in one
    round trip. A table left with ten pages or more (a test that wrote thousands of
    rows) counts as a changed shape, so that no later test is planned against the size
    it left behind.
    """
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
    with psycopg.connect(database_dsn(admin_dsn, name), autocommit=True) as conn:
        row = conn.execute(f"SELECT ({_SHAPE}), ({_BIG})").fetchone()
        if row is None or str(row[0]) != shape or row[1] != 0:
            return False
        conn.execute(_clear_script(conn, shape))
    return True


@pytest.fixture
def dsn(admin_dsn: str, template_db: str, template_shape: str, module_db: list[str]) -> str:
    """A DSN to a migrated database that this test has to itself: the module's
    database, reset to the template's state (or a fresh clone of the template when an
    earlier test changed its shape)."""
    if not _reset(admin_dsn, module_db[0], template_shape):
        drop_database(admin_dsn, module_db[0])
        module_db[0] = create_database(admin_dsn, template=template_db)
    return database_dsn(admin_dsn, module_db[0])


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, for setup and assertions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn
