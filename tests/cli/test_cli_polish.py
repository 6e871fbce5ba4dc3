"""The ``cyclone`` command's finish: ``--version``; the APP forms ``cyclone worker``
loads (``pkg.mod:attr``, ``file.py:attr``, a bare module meaning ``:client``) and the
ones it refuses (a missing attribute, a coroutine function, never called); the help
saying where the DSN, the queues and the slots come from."""

from __future__ import annotations

import gc
import importlib.metadata
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import cyclone
from cyclone.cli import main
from cyclone.cli_worker import load_client
from tests.helpers import ROOT

APPS = {
    "polish_tasks.py": "import cyclone\n\nclient = cyclone.Client('postgresql://localhost/none')\n",
    "polish_shop.py": (
        "import cyclone\n\n"
        "client = cyclone.Client('postgresql://localhost/none')\n\n"
        "async def main():\n    return client\n\n"
        "async def stream():\n    yield client\n\n"
        "class Later:\n    async def __call__(self):\n        return client\n\n"
        "later = Later()\n\n"
        "def eventually():\n    return main()\n\n"
        "def nothing():\n    return None\n\n"
        "def needs(dsn):\n    return cyclone.Client(dsn)\n\n"
        "def factory():\n    return cyclone.Client('postgresql://localhost/made')\n"
    ),
    "polish_pkg/__init__.py": "",
    "polish_pkg/helper.py": "import cyclone\n\nCLIENT = cyclone.Client('postgresql://localhost/x')\n",
    "polish_pkg/app.py": "from .helper import CLIENT as client\n",
}
"""Application files written to a temporary folder (``polish_`` names, unlike any
other module of the tests)."""


@pytest.fixture
def apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The folder of :data:`APPS`, first on ``sys.path``; their modules forgotten after."""
    for name, text in APPS.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("polish_")]:
        del sys.modules[name]


def refusal(app: str) -> str:
    """The message of the error ``load_client(app)`` raises (the exception, and the
    frames holding what it made, gone when this returns)."""
    try:
        load_client(app)
    except click.BadParameter as exc:
        return exc.message
    raise AssertionError(f"{app!r} was loaded")


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"cyclone {importlib.metadata.version('cyclone')}\n"


def test_every_app_form_names_the_client(apps: Path) -> None:
    tasks = load_client("polish_tasks:client")
    assert isinstance(tasks, cyclone.Client)
    assert load_client("polish_tasks") is tasks  # a bare module means module:client
    assert load_client(f"{apps / 'polish_tasks.py'}:client") is tasks  # the same module
    assert load_client(str(apps / "polish_tasks.py")) is tasks
    # a file in a package is imported as package.module: its relative import works
    from_file = load_client(f"{apps / 'polish_pkg' / 'app.py'}:client")
    helper = sys.modules["polish_pkg.helper"].CLIENT
    assert from_file is helper
    assert load_client("polish_pkg.app") is helper
    made = load_client("polish_shop:factory")  # a function of no arguments, called
    assert isinstance(made, cyclone.Client) and made is not sys.modules["polish_shop"].client


def test_a_missing_attribute_names_the_module_and_the_attribute(apps: Path) -> None:
    assert refusal("polish_tasks:nosuch") == "'polish_tasks' has no attribute 'nosuch'"
    bare = refusal("polish_pkg")  # a package with no attribute client
    assert (
        bare
        == "'polish_pkg' has no attribute 'client' (a bare 'polish_pkg' means polish_pkg:client)"
    )
    assert "no Python file" in refusal(f"{apps / 'absent.py'}:client")
    assert "cannot import 'polish_absent'" in refusal("polish_absent:client")
    for malformed in ("polish_tasks:", ":client", "polish_tasks:not-a-name"):
        assert "expected module:attribute" in refusal(malformed), malformed


def test_coroutine_functions_are_refused_uncalled(apps: Path) -> None:
    """No coroutine is made, or one a factory returned is closed: no "never awaited"
    warning, even once the garbage is collected."""
    with warnings.catch_warnings():  # earlier tests' garbage goes before the block
        warnings.simplefilter("ignore")
        gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for app, kind in [
            ("polish_shop:main", "a coroutine function"),
            ("polish_shop:stream", "an async generator function"),
            ("polish_shop:later", "a coroutine function"),  # its __call__ is
        ]:
            assert refusal(app).startswith(f"{app!r} is not a cyclone.Client but {kind} (not")
        assert "returned an awaitable" in refusal("polish_shop:eventually")
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert refusal("polish_shop:nothing") == (
        "polish_shop:nothing() returned None, not a cyclone.Client"
    )
    assert "it takes arguments" in refusal("polish_shop:needs")


def test_help_says_where_the_dsn_queues_and_slots_come_from() -> None:
    runner = CliRunner()
    top = " ".join(runner.invoke(main, ["--help"]).output.split())
    assert "--dsn (a connection string or URL), else $CYCLONE_DSN" in top
    assert "its queues and slots are the client's queues=" in top
    assert "--version" in top
    worker = " ".join(runner.invoke(main, ["worker", "--help"]).output.split())
    assert "package.module:attribute, path/to/file.py:attribute, or a bare" in worker
    assert "which means its attribute `client`" in worker
    assert "the one the client was built with" in worker and "no --dsn" in worker
    assert "100 slots each); --slots N gives each of those N slots" in worker
    assert "--queue NAME=SLOTS sets one queue" in worker


def test_a_missing_dsn_names_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CYCLONE_DSN", raising=False)
    for command in (["runs"], ["steps", "1"], ["migrate"], ["queues"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, command
        assert "Missing option '--dsn' (env var: 'CYCLONE_DSN')" in result.output, command


@pytest.mark.slow  # runs `cyclone worker` in a process, warnings as errors
def test_worker_refusals_are_one_line_exit_2_without_a_warning(apps: Path) -> None:
    for app, line in [
        ("polish_tasks:nosuch", "'polish_tasks' has no attribute 'nosuch'"),
        ("polish_shop:main", "'polish_shop:main' is not a cyclone.Client but a coroutine"),
    ]:
        result = subprocess.run(
            [sys.executable, "-W", "error", "-m", "cyclone", "worker", app],
            cwd=apps,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        (shown,) = result.stderr.strip().splitlines()
        assert shown.startswith(f"Error: Invalid value for APP: {line}"), shown
        assert shown.endswith("worker --help)")
