"""The complete example of docs/django.md runs as written, in a process of its own (it
configures Django itself), on a fresh database, and prints what the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import create_database, database_dsn, drop_database
from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def section() -> str:
    page = (ROOT / "docs" / "django.md").read_text()
    return page.split("## A complete example", 1)[1].split("\n## ", 1)[0]


def promised_output() -> list[str]:
    """The plain block (no language) before the example: what it prints."""
    match = re.search(r"```\n(.*?)```", section(), re.DOTALL)
    assert match is not None
    return match.group(1).splitlines()


def example() -> str:
    match = re.search(r"```python\n(.*?)```", section(), re.DOTALL)
    assert match is not None
    return match.group(1)


@pytest.fixture
def fresh_dsn(admin_dsn: str) -> Iterator[str]:
    name = create_database(admin_dsn)
    yield database_dsn(admin_dsn, name)
    drop_database(admin_dsn, name)


def test_the_complete_example_runs_as_written(fresh_dsn: str, tmp_path: Path) -> None:
    script = tmp_path / "shop_django.py"
    script.write_text(example())
    env = {**os.environ, "CYCLONE_DSN": fresh_dsn}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == promised_output()
    with psycopg.connect(fresh_dsn) as conn:
        orders = conn.execute("SELECT item, status FROM shop_orders").fetchall()
        runs = conn.execute("SELECT workflow, state FROM cyclone_runs").fetchall()
    assert orders == [("teapot", "shipped")]
    assert runs == [("ship", "completed")]
