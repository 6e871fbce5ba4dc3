"""The README's Tutorial and Jobs sections run in order, as written.

Every block from "## Tutorial" to "## A workflow" is followed the way a reader would:
a ``python`` block is saved under the file name the text before it gives (``shop.py``,
``tasks.py``, ``enqueue.py``); each line of a ``bash`` block runs in a shell in that
folder, ``cyclone worker ...`` as a process left running. Only the database changes:
``app`` becomes a throwaway database of the test server (the README's own ``createdb``
makes it; the test drops it). The outputs the README promises are checked, and so is
the charge's ledger row.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import database_dsn, drop_database
from tests.helpers import ROOT

pytestmark = pytest.mark.slow

_BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.DOTALL)
_FILE = re.compile(r"`([\w.]+\.py)`")


def readme_blocks() -> list[tuple[str, str, str]]:
    """(language, code, the file name the text before it names) from the Tutorial to
    the next section after Jobs, in order."""
    readme = (ROOT / "README.md").read_text()
    part = readme.split("## Tutorial", 1)[1].split("## A workflow", 1)[0]
    blocks, start = [], 0
    for match in _BLOCK.finditer(part):
        names = _FILE.findall(part[start : match.start()])
        blocks.append((match.group(1), match.group(2), names[-1] if names else ""))
        start = match.end()
    return blocks


@pytest.fixture
def app_database(admin_dsn: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The name the README's ``app`` stands for, and the environment that points
    ``createdb``/``psql`` at the test server; dropped afterwards."""
    name = f"cyclone_readme_{uuid.uuid4().hex[:12]}"
    params = conninfo_to_dict(admin_dsn)
    env = {
        "PGHOST": str(params.get("host", "127.0.0.1")),
        "PGPORT": str(params.get("port", "5432")),
        "PGUSER": str(params.get("user", "postgres")),
    }
    yield name, env
    drop_database(admin_dsn, name)


def test_the_tutorial_and_jobs_sections_run_in_order_as_written(
    app_database: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    name, pg_env = app_database
    url = f"postgresql://{quote(pg_env['PGUSER'])}@{quote(pg_env['PGHOST'], safe='')}:"
    url += f"{pg_env['PGPORT']}/{name}"

    def adapt(code: str) -> str:
        code = code.replace("postgresql:///app", url)
        return re.sub(r"\b(createdb|psql) app\b", rf"\1 {name}", code)

    env = {**os.environ, **pg_env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    env.pop("CYCLONE_DSN", None)
    bin_dir = Path(sys.executable).parent  # `cyclone` and `python` of this environment
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    blocks = readme_blocks()
    assert [lang for lang, _, _ in blocks].count("python") == 3, blocks
    shop = next(code for lang, code, file in blocks if file == "shop.py")
    assert len(shop.strip().splitlines()) <= 32  # "a workflow in 30 lines", give or take

    workers: list[subprocess.Popen[bytes]] = []
    printed: list[str] = []
    try:
        for lang, code, file in blocks:
            if lang == "python":
                assert file, f"no file name before the block:\n{code}"
                (tmp_path / file).write_text(adapt(code))
                continue
            for line in adapt(code).strip().splitlines():
                if line.startswith("cyclone worker "):
                    workers.append(
                        subprocess.Popen(
                            ["bash", "-c", f"exec {line}"],
                            cwd=tmp_path,
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                        )
                    )
                    continue
                done = subprocess.run(
                    ["bash", "-ec", line],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=False,
                )
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                if line.startswith("python"):
                    printed.append(done.stdout.strip())
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        logs = [worker.communicate(timeout=60)[0].decode(errors="replace") for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], logs
    assert printed == ["total 4.49", "completed\n{'url': 'a.png', 'width': 640}"]
    with psycopg.connect(database_dsn(_admin(pg_env), name)) as conn:
        assert conn.execute("SELECT order_id, amount FROM ledger").fetchall() == [(42, 5)]
        states = conn.execute("SELECT state, count(*) FROM cyclone_runs GROUP BY 1").fetchall()
        assert states == [("completed", 3)]


def _admin(pg_env: dict[str, str]) -> str:
    return f"host={pg_env['PGHOST']} port={pg_env['PGPORT']} user={pg_env['PGUSER']}"
