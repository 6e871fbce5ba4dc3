"""``cyclone demo --clean`` removes the embedded server's data folder that demos keep,
and says so; the folder is outside root's home when run as root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from cyclone.cli import main
from cyclone.demo import embedded


def test_clean_removes_the_kept_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "demo-postgres"
    (folder / "base").mkdir(parents=True)
    (folder / "base" / "1").write_text("pages")
    monkeypatch.setattr(embedded, "embedded_dir", lambda: folder)
    result = CliRunner().invoke(main, ["demo", "--clean"])
    assert result.exit_code == 0, result.output
    assert f"removed the demo's embedded PostgreSQL data folder {folder}" in result.output
    assert not folder.exists()
    again = CliRunner().invoke(main, ["demo", "--clean"])
    assert again.exit_code == 0
    assert f"no embedded data folder at {folder}: nothing to remove" in again.output


def test_roots_data_folder_is_not_under_its_home() -> None:
    folder = embedded.embedded_dir()
    if os.geteuid() == 0:
        # pgserver opens every parent of the data folder to other users: not /root
        assert folder == Path("/var/tmp/cyclone-demo-postgres")
    else:
        assert folder == Path.home() / ".cache" / "cyclone" / "demo-postgres"
