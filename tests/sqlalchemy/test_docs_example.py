"""The complete example of docs/sqlalchemy.md runs as written and prints what the page
says it prints."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers import ROOT
from tests.sqlalchemy.conftest import sa_url


def example() -> str:
    """The first python block of the page's "A complete example" section."""
    page = (ROOT / "docs" / "sqlalchemy.md").read_text()
    section = page.split("## A complete example", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def test_the_complete_example_runs_as_written(
    dsn: str,
    db: psycopg.Connection[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    script = tmp_path / "shop_orm.py"
    script.write_text(example())
    monkeypatch.setenv("DATABASE_URL", sa_url(dsn).render_as_string(hide_password=False))
    runpy.run_path(str(script), run_name="__main__")
    assert capsys.readouterr().out.splitlines() == [
        "rolled back: no order, no run",
        "ship: completed",
        "invoice: completed",
        "order 1: teapot, invoiced, 1 shipment",
    ]
    assert db.execute("SELECT item, status FROM orders").fetchall() == [("teapot", "invoiced")]
    assert db.execute("SELECT count(*) FROM cyclone_runs").fetchone() == (2,)
