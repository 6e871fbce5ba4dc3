"""One source of the version: ``version`` in pyproject.toml, read back from the installed
package's metadata by ``cyclone.__version__`` and printed by ``cyclone --version``."""

from __future__ import annotations

import importlib
import importlib.metadata
import tomllib
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from packaging.version import Version

import cyclone
from cyclone.cli import main
from tests.helpers import ROOT


def pyproject_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    assert isinstance(version, str)
    return version


def test_the_version_is_the_installed_metadata_version() -> None:
    assert cyclone.__version__ == importlib.metadata.version("cyclone")


def test_the_installed_version_is_the_one_in_pyproject() -> None:
    # fails after a change of pyproject's version until the package is installed again
    # (pip install -e .), which writes the metadata anew
    assert importlib.metadata.version("cyclone") == pyproject_version()


def test_the_version_is_pep_440_in_normal_form() -> None:
    assert str(Version(cyclone.__version__)) == cyclone.__version__
    assert str(Version(pyproject_version())) == pyproject_version()


def test_cyclone_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"cyclone {cyclone.__version__}\n"


@pytest.fixture
def without_metadata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``cyclone`` imported again where no installed metadata names it (a source tree
    put on sys.path without an install), then imported again as it was."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    try:
        importlib.reload(cyclone)
        yield
    finally:
        monkeypatch.undo()
        importlib.reload(cyclone)


@pytest.mark.usefixtures("without_metadata")
def test_without_metadata_the_version_is_a_pep_440_placeholder() -> None:
    assert cyclone.__version__ == "0+unknown"
    assert Version(cyclone.__version__) < Version("0.0.1")  # below every release
