"""The pytest plugin, as a user's test suite sees it: registered by its entry point,
its fixtures give each test a migrated database of its own and a client on it, and
the databases are gone after the session.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import psycopg
import pytest

pytest_plugins = ["pytester"]

_INI = """
[pytest]
filterwarnings = error
asyncio_default_fixture_loop_scope = function
"""

_USER_TESTS = """
import pathlib

import psycopg
import pytest

import cyclone
from cyclone.testing import assert_enqueued, drain

SEEN = pathlib.Path(__file__).with_name("seen.txt")


@cyclone.step("hello")
async def hello(ctx: cyclone.Context, name: str) -> str:
    return f"hello {name}"


@pytest.fixture
def cyclone_handlers():
    return [hello]


@pytest.mark.asyncio
async def test_hello_runs_when_drained(cyclone_client, cyclone_dsn, cyclone_template):
    job = await cyclone_client.enqueue(hello, "ann")
    await assert_enqueued(cyclone_client, hello, input="ann")
    assert await drain(cyclone_client) == 1
    assert (await cyclone_client.get_run(job)).result == "hello ann"
    with SEEN.open("a") as seen:
        seen.write(psycopg.conninfo.conninfo_to_dict(cyclone_dsn)["dbname"] + "\\n")
        seen.write(cyclone_template + "\\n")


@pytest.mark.parametrize("attempt", [1, 2])
def test_each_test_has_a_fresh_migrated_database(cyclone_dsn, attempt):
    with psycopg.connect(cyclone_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM cyclone_runs").fetchone() == (0,)
        conn.execute(
            "INSERT INTO cyclone_runs (workflow, def_version) VALUES ('w', 'v')"
        )
    with SEEN.open("a") as seen:
        seen.write(psycopg.conninfo.conninfo_to_dict(cyclone_dsn)["dbname"] + "\\n")
"""


def test_the_plugin_is_registered_by_its_entry_point(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    plugin = config.pluginmanager.get_plugin("cyclone")
    assert plugin is not None
    assert plugin.__name__ == "cyclone.testing.plugin"


def test_its_fixtures_work_in_a_users_tests(pytester: pytest.Pytester, admin_dsn: str) -> None:
    pytester.makeini(_INI)
    pytester.makepyfile(test_user=_USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    names = set((pytester.path / "seen.txt").read_text().split())
    assert len(names) == 4  # three test databases and the template
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        left: Any = conn.execute(
            "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (sorted(names),)
        ).fetchall()
    assert left == []


def test_loading_it_warns_of_nothing(pytester: pytest.Pytester) -> None:
    pytester.makeini(_INI)
    pytester.makepyfile(test_plain="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error")
    result.assert_outcomes(passed=1)
    assert "warning" not in result.stdout.str().lower()


@pytest.mark.slow
def test_loading_it_imports_no_optional_extra_and_no_engine_code() -> None:
    code = (
        "import sys, cyclone.testing.plugin\n"
        "extras = ('sqlalchemy', 'django', 'starlette', 'fastapi', 'pydantic',\n"
        "          'opentelemetry', 'prometheus_client', 'cyclone.testing.inline')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in extras\n"
        "             or m == 'cyclone.testing.inline'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    assert done.stderr == ""
