"""The examples work in the database of ``$CYCLONE_DSN`` when it is set, instead of a
database of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.helpers import ROOT, scalar

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("example", "runs"), [("quickstart.py", 3), ("workflow.py", 1)])
def test_an_example_uses_the_database_of_cyclone_dsn(
    dsn: str, db: psycopg.Connection[Any], example: str, runs: int
) -> None:
    done = subprocess.run(
        [sys.executable, example],
        cwd=ROOT / "examples",
        env={**os.environ, "CYCLONE_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    if example == "quickstart.py":
        assert f"using database {conninfo_to_dict(dsn)['dbname']!r}" in done.stdout
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == runs
