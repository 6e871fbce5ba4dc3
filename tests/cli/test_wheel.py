"""The wheel ships the whole package: ``python -m build --wheel`` gives a wheel that holds
every file of src/cyclone (the SQL statements, the migrations, the demo's queries, the
dashboard's templates and static files, py.typed), the license and the metadata the
project declares. (.ci/wheel-smoke goes further: it installs the wheel in a fresh
environment and runs ``cyclone migrate`` and ``cyclone demo --fresh`` from it.)"""

from __future__ import annotations

import email.message
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cyclone
from tests.helpers import ROOT

PACKAGE = ROOT / "src" / "cyclone"


def package_files() -> set[str]:
    """Every file of src/cyclone, as the wheel names it (``cyclone/...``)."""
    return {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = out.glob("cyclone-*-py3-none-any.whl")
    return built


def listing(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = (n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(zf.read(name).decode())


@pytest.mark.slow
def test_the_wheel_holds_every_file_of_the_package(wheel: Path) -> None:
    source = package_files()
    names = listing(wheel)
    assert source - names == set()
    outside = {n for n in names - source if ".dist-info/" not in n}
    assert outside == set()  # nothing from tests/, bench/ or docs/


@pytest.mark.slow
def test_the_wheel_holds_the_sql_templates_and_static_files(wheel: Path) -> None:
    names = listing(wheel)
    sql = {n for n in names if n.startswith("cyclone/sql/") and n.endswith(".sql")}
    migrations = {n for n in names if n.startswith("cyclone/migrations/") and n.endswith(".sql")}
    templates = {n for n in names if n.startswith("cyclone/dashboard/templates/")}
    static = {n for n in names if n.startswith("cyclone/dashboard/static/")}
    assert {"cyclone/sql/steps.sql", "cyclone/sql/runs.sql", "cyclone/sql/claims.sql"} <= sql
    assert "cyclone/migrations/0001_init.sql" in migrations
    assert len(migrations) == len(list((PACKAGE / "migrations").glob("*.sql")))
    assert {"cyclone/dashboard/templates/base.html", "cyclone/dashboard/templates/run.html"} <= (
        templates
    )
    assert {"cyclone/dashboard/static/app.css", "cyclone/dashboard/static/app.js"} <= static
    assert {"cyclone/demo/queries.sql", "cyclone/py.typed"} <= names


@pytest.mark.slow
def test_the_wheel_carries_the_license_and_the_metadata(wheel: Path) -> None:
    version = cyclone.__version__
    assert wheel.name == f"cyclone-{version}-py3-none-any.whl"
    assert f"cyclone-{version}.dist-info/licenses/LICENSE" in listing(wheel)
    meta = metadata(wheel)
    assert meta["Version"] == version
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["License-File"] == "LICENSE"
    urls = {u.split(",")[0] for u in meta.get_all("Project-URL") or []}
    assert {"Homepage", "Documentation", "Changelog", "Issues"} <= urls
    classifiers = set(meta.get_all("Classifier") or [])
    assert {
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Framework :: AsyncIO",
        "Topic :: Database",
        "Typing :: Typed",
        "Development Status :: 3 - Alpha",
    } <= classifiers
    assert "demo" in (meta.get_all("Provides-Extra") or [])
