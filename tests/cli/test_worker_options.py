"""``cyclone worker`` options: ``--log-format json`` (one JSON object a line, the step's
fields on lines about a step) and the metrics flags (a server scraped over HTTP, and
the flags refused before anything starts), each on a real worker process."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cyclone
from tests.cli.test_cli import run_cli
from tests.helpers import ROOT, kill, poll_until, scalar

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process

APP = "tests.apps.flaky:client"  # kind flaky_once: fails its first attempt


def start(dsn: str, out: Path, *args: str) -> subprocess.Popen[bytes]:
    """``cyclone --log-level info worker APP ARGS`` in a process of its own, its stdout
    in ``out/stdout`` and its stderr in ``out/stderr`` (kept apart: stderr is the log)."""
    with (out / "stdout").open("wb") as stdout, (out / "stderr").open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "cyclone", "--log-level", "info", "worker", APP, *args],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "CYCLONE_TEST_APP_DSN": dsn},
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes], out: Path) -> None:
    """SIGTERM the worker; it must drain and exit 0."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, (out / "stderr").read_text(errors="replace")


def test_json_logs_name_the_step_in_fields_and_message(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Every line of stderr is one JSON object; the retry line carries the run, step,
    node, kind, queue and attempt of the step, and its message names the run and step."""
    with cyclone.SyncClient(dsn) as producer:
        job = producer.enqueue("flaky_once", {"n": 1})
    proc = start(dsn, tmp_path, "--log-format", "json")
    try:
        poll_until(
            lambda: (
                scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (job.run_id,))
                == "completed"
            ),
            what="the job completed on its second attempt",
        )
        stop(proc, tmp_path)
    finally:
        kill(proc)
    lines = (tmp_path / "stderr").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records and all(isinstance(r, dict) for r in records), lines
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record), record
    node, kind, queue = db.execute(
        "SELECT node, kind, queue FROM cyclone_steps WHERE id = %s", (job.step_id,)
    ).fetchone() or ("", "", "")
    (retry,) = [r for r in records if "failed attempt" in r["message"]]
    assert (retry["run_id"], retry["step_id"], retry["node"], retry["kind"]) == (
        job.run_id,
        job.step_id,
        node,
        kind,
    )
    assert (retry["queue"], retry["attempt"], retry["level"]) == (queue, 1, "INFO")
    assert retry["message"].startswith(f"run {job.run_id} step {job.step_id} ")
    assert "first attempt fails" in retry["message"]
    assert any(r["message"].startswith("worker running") for r in records)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-format", "xml"], "Invalid value for '--log-format': 'xml' is not one of"),
        (
            ["--metrics-port", "0", "--metrics-host", "0.0.0.0"],
            "--metrics-host '0.0.0.0' exposes the metrics beyond this machine: give "
            "--metrics-token",
        ),
        (["--metrics-port", "0", "--metrics-host", "10.1.2.3"], "'10.1.2.3'"),
        (["--metrics-port", "65536"], "Invalid value for '--metrics-port'"),
        (["--metrics-db"], "--metrics-db needs --metrics-port"),
    ],
)
def test_bad_worker_options_are_refused_before_anything_starts(
    dsn: str, db: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    """One line naming the bad value, exit status 2, and no worker: the step enqueued
    before stays available with no lease."""
    with cyclone.SyncClient(dsn) as producer:
        producer.enqueue("flaky_once", None)
    result = run_cli(
        "worker", APP, *args, env={"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_METRICS_TOKEN": ""}
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    step = db.execute("SELECT state, lease_owner, lease_generation FROM cyclone_steps").fetchone()
    assert step == ("available", None, 0)


def test_metrics_need_the_prometheus_extra(dsn: str) -> None:
    """Without prometheus_client, ``--metrics-port`` is one line naming the extra."""
    blocked = "import sys; sys.modules['prometheus_client'] = None; "
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            blocked + "from cyclone.cli import main; main()",
            *("worker", APP, "--metrics-port", "0"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "CYCLONE_TEST_APP_DSN": dsn},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "pip install -e '.[prometheus]'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def scrape(url: str, token: str | None = None) -> tuple[int, str]:
    """The status and body of one GET of ``url`` (with ``token`` as a bearer token)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_port_0_serves_on_the_port_it_prints(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``--metrics-port 0``: the worker prints where it serves; a scrape there with the
    token has the worker's slots and, with ``--metrics-db``, the database's gauges; one
    without the token is refused."""
    args = ("--metrics-port", "0", "--metrics-db", "--metrics-token", "s3cret")
    proc = start(dsn, tmp_path, *args)
    try:
        where = re.compile(r"^metrics on (http://127\.0\.0\.1:(\d+)/metrics)$", re.MULTILINE)
        found = poll_until(
            lambda: where.search((tmp_path / "stdout").read_text()) or proc.poll() is not None,
            what="the metrics address printed",
        )
        assert isinstance(found, re.Match), (tmp_path / "stderr").read_text()
        assert int(found.group(2)) > 0
        status, body = scrape(found.group(1), "s3cret")
        assert status == 200, body
        slots = re.compile(r'^cyclone_worker_slots\{queue="default"\} 2\.0$', re.MULTILINE)

        def started() -> str:
            """A scrape's body once it shows the slots (served from before the client
            starts: its gauges show once it runs); else empty."""
            text = scrape(found.group(1), "s3cret")[1]
            return text if slots.search(text) else ""

        body = poll_until(started, what="the worker's slots in a scrape")
        assert re.search(r"^cyclone_database_up 1\.0$", body, re.MULTILINE), body
        assert scrape(found.group(1))[0] == 401
        stop(proc, tmp_path)
    finally:
        kill(proc)
    assert len((tmp_path / "stdout").read_text().splitlines()) == 1


def test_a_metrics_port_in_use_is_one_line(dsn: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "worker", APP, "--metrics-port", str(port), env={"CYCLONE_TEST_APP_DSN": dsn}
        )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == f"Error: cannot serve metrics on 127.0.0.1:{port}: " + (
        "Address already in use"
    )
