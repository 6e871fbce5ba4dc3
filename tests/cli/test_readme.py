"""The README's tutorial runs as written: its ``shop.py`` block, a real ``cyclone worker
shop:client`` process, and the submit it shows, printing the result it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import ROOT


def tutorial_code() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tutorial", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "the tutorial has no python block"
    return match.group(1)


def test_the_tutorial_runs_as_written(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    code = tutorial_code()
    assert len(code.strip().splitlines()) <= 32  # "a workflow in 30 lines", give or take
    assert 'DSN = "postgresql:///app"' in code
    (tmp_path / "shop.py").write_text(code.replace("postgresql:///app", dsn))
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    worker = subprocess.Popen(  # run from the tutorial's folder, as the reader would
        [sys.executable, "-m", "cyclone", "worker", "shop:client"],
        cwd=tmp_path,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", "import asyncio, shop; asyncio.run(shop.main())"],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == "total 4.49"
    finally:
        worker.terminate()
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output.decode(errors="replace")
    assert db.execute("SELECT state FROM cyclone_runs").fetchall() == [("completed",)]
