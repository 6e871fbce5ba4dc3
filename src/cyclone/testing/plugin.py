"""The pytest plugin of Cyclone (entry point ``pytest11``: loaded by every pytest run
where Cyclone is installed), with the fixtures for users' own tests.

Fixtures (every name starts with ``cyclone_``):

* ``cyclone_dsn`` (per test): a libpq connection string to a migrated database of the
  test's own, cloned from a template migrated once per session and dropped after the
  test. The server is ``$CYCLONE_TEST_DSN`` (a role that may create databases), else a
  local one at 127.0.0.1:5432 (users ``postgres`` then ``root``), else an embedded one
  (``pip install -e '.[embedded]'``).
* ``cyclone_handlers`` and ``cyclone_workflows`` (per test): the kinds and workflows
  ``cyclone_client`` registers; empty lists unless a test module or conftest overrides
  them.
* ``cyclone_client`` (per test, async, needs ``pytest-asyncio``): a
  :class:`cyclone.Client` on ``cyclone_dsn``, not started: steps run when the test
  calls ``await cyclone.testing.drain(client)``. Stopped after the test.
* ``cyclone_server`` and ``cyclone_template`` (per session): the admin connection
  string, and the name of the migrated template database.

Loading the plugin imports nothing but pytest (and ``pytest_asyncio`` when installed):
the fixtures import Cyclone when a test first asks for one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from cyclone.client import Client
    from cyclone.handlers import Handler
    from cyclone.workflow import Workflow

if TYPE_CHECKING:
    _async_fixture = pytest.fixture
else:
    try:
        import pytest_asyncio
    except ImportError:  # the async fixture then needs another async plugin (anyio)
        _async_fixture = pytest.fixture
    else:  # works in pytest-asyncio's strict mode as in its auto mode
        _async_fixture = pytest_asyncio.fixture


@pytest.fixture(scope="session")
def cyclone_server() -> Iterator[str]:
    """The admin connection string of the test server (see the module docstring); an
    embedded server is stopped at the end of the session."""
    from cyclone.devserver import find_server

    server = find_server(env_var="CYCLONE_TEST_DSN")
    try:
        yield server.dsn
    finally:
        server.stop()


@pytest.fixture(scope="session")
def cyclone_template(cyclone_server: str) -> Iterator[str]:
    """The name of a database migrated once per session, which ``cyclone_dsn`` clones;
    dropped at the end of the session."""
    import cyclone
    from cyclone.testing.databases import create_database, database_dsn, drop_database

    name = create_database(cyclone_server, "cyclone_template")
    try:
        cyclone.migrate(database_dsn(cyclone_server, name))
        yield name
    finally:
        drop_database(cyclone_server, name)


@pytest.fixture
def cyclone_dsn(cyclone_server: str, cyclone_template: str) -> Iterator[str]:
    """A connection string to a new migrated database, the test's own, dropped after it."""
    from cyclone.testing.databases import create_database, database_dsn, drop_database

    name = create_database(cyclone_server, "cyclone_test", template=cyclone_template)
    try:
        yield database_dsn(cyclone_server, name)
    finally:
        drop_database(cyclone_server, name)


@pytest.fixture
def cyclone_handlers() -> list[Handler]:
    """The kinds ``cyclone_client`` registers (override it: none by default)."""
    return []


@pytest.fixture
def cyclone_workflows() -> list[Workflow]:
    """The workflows ``cyclone_client`` registers (override it: none by default)."""
    return []


@_async_fixture
async def cyclone_client(
    cyclone_dsn: str, cyclone_handlers: list[Handler], cyclone_workflows: list[Workflow]
) -> AsyncIterator[Client]:
    """A :class:`cyclone.Client` on ``cyclone_dsn`` with ``cyclone_handlers`` and
    ``cyclone_workflows`` registered, not started (run steps with ``drain``); its
    connections are closed after the test."""
    from cyclone.client import Client

    client = Client(cyclone_dsn, handlers=cyclone_handlers, workflows=cyclone_workflows)
    try:
        yield client
    finally:
        await client.stop()
