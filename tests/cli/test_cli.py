"""The ``cyclone`` command: ``worker`` runs an app and drains on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import ROOT, kill, poll_until, scalar, start_worker, worker_log

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cyclone", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_sigterm_drains_running_steps_then_exits(dsn: str, db: psycopg.Connection[Any]) -> None:
    """SIGTERM: the worker stops claiming, lets running handlers finish, exits 0."""
    db.execute("CREATE TABLE ledger (run_id bigint, step_id bigint, item int)")
    with cyclone.SyncClient(dsn) as producer:
        jobs = producer.enqueue_many("ledger_write", [{"item": i} for i in range(3)])
    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_WORK": "1.5", "CYCLONE_TEST_SLOTS": "5"}
    proc = start_worker("tests.apps.ledger:client", env, log_level="INFO")
    try:
        poll_until(
            lambda: scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'") == 3,
            what="three running steps",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, worker_log(proc)
    finally:
        kill(proc)
    states = dict(db.execute("SELECT id, state FROM cyclone_runs").fetchall())
    assert [states[j.run_id] for j in jobs] == ["completed"] * 3
    assert scalar(db, "SELECT count(*) FROM ledger") == 3
    assert scalar(db, "SELECT sum(reclaims + attempt) FROM cyclone_steps") == 0
    assert "stopping: draining running steps" in worker_log(proc)


def test_worker_refuses_bad_app_paths() -> None:
    """A malformed path, a missing module, a non-client or a client with no handlers:
    one clear line and a non-zero exit, no traceback."""
    for app, message in [
        ("no_colon", "cannot import 'no_colon'"),  # a bare module means no_colon:client
        ("tests.apps.empty:", "expected module:attribute"),
        ("tests.apps.missing:client", "cannot import 'tests.apps.missing'"),
        ("tests.apps.empty:not_a_client", "is not a cyclone.Client"),
        ("tests.apps.empty:client", "registers no handlers"),
        ("tests.apps.dag:dag_record", "is not a cyclone.Client"),  # a handler
        ("tests.apps.dag:build", "nor a function of no arguments"),
    ]:
        result = run_cli("worker", app)
        assert result.returncode != 0, app
        assert message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_help_lists_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "migrate" in result.stdout and "worker" in result.stdout


def test_second_sigterm_releases_at_once_even_past_a_sync_thread(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A second SIGTERM cuts the grace period short: held steps are given back (no
    attempt, no reclaim) and the process exits without waiting for a sync handler's
    thread, which cannot be stopped."""
    with cyclone.SyncClient(dsn) as producer:
        job = producer.enqueue("sync_sleep", {"seconds": 600})
    proc = start_worker("tests.apps.ledger:client", {"CYCLONE_TEST_APP_DSN": dsn}, log_level="INFO")
    try:
        poll_until(lambda: scalar(db, "SELECT state FROM cyclone_steps") == "running")
        proc.send_signal(signal.SIGTERM)
        poll_until(lambda: "stopping: draining" in worker_log(proc), what="drain started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, worker_log(proc)
    finally:
        kill(proc)
    step = db.execute("SELECT state, attempt, reclaims, lease_owner FROM cyclone_steps").fetchone()
    assert step == ("available", 0, 0, None)
    assert "sync handler thread(s) still running" in worker_log(proc)
    assert job.run_id > 0


def test_worker_on_an_unmigrated_database_says_to_migrate(empty_dsn: str) -> None:
    """One line naming the remedy, non-zero exit, no endless warnings."""
    env = {"CYCLONE_TEST_APP_DSN": empty_dsn}
    result = run_cli("worker", "tests.apps.ledger:client", env=env)
    assert result.returncode != 0
    assert "run `cyclone migrate" in result.stderr
    assert "Traceback" not in result.stderr
