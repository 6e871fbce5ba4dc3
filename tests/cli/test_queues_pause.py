"""``cyclone queues``, ``cyclone queues pause NAME`` and ``cyclone queues resume NAME``,
each run as a subprocess, as an operator would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import ROOT, scalar

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process


def cli(*args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """``cyclone ARGS`` (with ``CYCLONE_DSN`` set to ``dsn`` when given), its output
    piped (no terminal), this checkout's package first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "CYCLONE_DSN")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    if dsn is not None:
        env["CYCLONE_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "cyclone", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ok(*args: str, dsn: str | None = None) -> str:
    """The output of a command that must succeed."""
    result = cli(*args, dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return result.stdout


def fails(*args: str, dsn: str | None = None, status: int = 1) -> str:
    """The one line of a command that must fail cleanly with ``status``."""
    result = cli(*args, dsn=dsn)
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def row_of(table: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is ``first``."""
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in\n{table}")


def test_pause_and_resume_a_queue_and_see_it_listed(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert ok("queues", dsn=dsn) == "no unfinished steps in any queue\n"
    assert ok("queues", "pause", "images", dsn=dsn) == "queue 'images' paused\n"
    assert ok("queues", "pause", "images", dsn=dsn) == "queue 'images' was already paused\n"
    with cyclone.SyncClient(dsn) as client:
        client.enqueue("resize", {"url": "a.png"}, queue="email")

    table = ok("queues", dsn=dsn)
    header = [cell.strip() for cell in table.splitlines()[0].split("┃")]
    assert header == [
        "queue",
        "available",
        "running",
        "waiting",
        "oldest available",
        "expired leases",
        "paused",
    ]
    assert row_of(table, "images")[1:] == ["0", "0", "0", "-", "0", "paused"]
    assert row_of(table, "email")[1] == "1" and row_of(table, "email")[-1] == ""
    listed = json.loads(ok("queues", "--json", dsn=dsn))
    assert [(q["queue"], q["available"], q["paused"]) for q in listed] == [
        ("email", 1, False),
        ("images", 0, True),
    ]

    assert ok("queues", "resume", "images", dsn=dsn) == "queue 'images' resumed\n"
    assert ok("queues", "resume", "images", dsn=dsn) == "queue 'images' was not paused\n"
    assert [q["queue"] for q in json.loads(ok("queues", "--json", dsn=dsn))] == ["email"]
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0


def test_connection_options_go_before_or_after_the_subcommand(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    assert ok("queues", "--dsn", dsn, "pause", "before") == "queue 'before' paused\n"
    assert ok("queues", "pause", "after", "--dsn", dsn) == "queue 'after' paused\n"
    paused = db.execute("SELECT queue, paused_by FROM cyclone_queue_pauses ORDER BY queue")
    assert paused.fetchall() == [("after", None), ("before", None)]  # a SyncClient: no id
    assert row_of(ok("queues", "--dsn", dsn), "after")[-1] == "paused"


def test_bad_input_is_one_line_and_writes_nothing(dsn: str, db: psycopg.Connection[Any]) -> None:
    assert fails("queues", "pause", "", dsn=dsn) == "Error: queue must not be empty"
    long = "q" * 300
    line = fails("queues", "pause", long, dsn=dsn)
    assert line.startswith("Error: queue is 300 bytes, over the 256-byte cap: 'qqq")
    assert fails("queues", "resume", "", dsn=dsn) == "Error: queue must not be empty"
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0
    assert "Missing argument 'NAME'" in fails("queues", "pause", dsn=dsn, status=2)
    assert "Missing option '--dsn' (env var: 'CYCLONE_DSN')" in fails("queues", status=2)
    assert "Missing option '--dsn' (env var: 'CYCLONE_DSN')" in fails(
        "queues", "pause", "images", status=2
    )
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0
