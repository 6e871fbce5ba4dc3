"""Test databases on a real PostgreSQL server.

The server is, in order: ``$CYCLONE_TEST_DSN`` (an admin DSN), the local server at
127.0.0.1:5432 (user ``postgres`` or ``root``), or an embedded server from the
``pgserver`` package (``pip install -e '.[embedded]'``) in a temporary folder.

A migrated template database is made once per session; each test that asks for
``dsn`` gets its own database cloned from it (real commits, LISTEN/NOTIFY work) and
dropped afterwards. Nothing depends on state left by an earlier run. The template holds
the test-only transition guard (:mod:`tests.guard`): in every cloned database a state
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


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A DSN to a new migrated database of this test's own."""
    name = create_database(admin_dsn, template=template_db)
    yield database_dsn(admin_dsn, name)
    drop_database(admin_dsn, name)


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, for setup and assertions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn
