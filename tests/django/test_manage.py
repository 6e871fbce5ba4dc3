"""``manage.py`` of the test project in processes of its own: ``migrate`` applies
Cyclone's schema to a fresh database, ``cyclone runs`` and ``cyclone worker`` run on
it with the DSN and APP of the settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.migrate import available_migrations
from tests.conftest import create_database, database_dsn, drop_database
from tests.django.conftest import DSN_ENV
from tests.helpers import ROOT, scalar

pytestmark = pytest.mark.slow

MANAGE = Path(__file__).resolve().parent / "manage.py"


def manage(
    dsn: str, *args: str, timeout: float = 120, cyclone_dsn: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python tests/django/manage.py ARGS`` on the project database ``dsn``; with
    ``cyclone_dsn``, the settings' ``CYCLONE["DSN"]``."""
    env = {**os.environ, DSN_ENV: dsn}
    if cyclone_dsn is not None:
        env["CYCLONE_DJANGO_TEST_CYCLONE_DSN"] = cyclone_dsn
    env.pop("CYCLONE_DSN", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def project_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh, empty database, then ``manage.py migrate`` on it."""
    name = create_database(admin_dsn)
    dsn = database_dsn(admin_dsn, name)
    done = manage(dsn, "migrate")
    assert done.returncode == 0, done.stderr
    yield dsn
    drop_database(admin_dsn, name)


def test_migrate_applies_cyclone_schema(project_dsn: str) -> None:
    """A fresh database gets every Cyclone migration, the views the admin reads and
    Django's tables; migrating again changes nothing, and the models agree with the
    migrations."""
    newest = available_migrations()[-1].version
    with psycopg.connect(project_dsn) as conn:
        assert scalar(conn, "SELECT max(version) FROM cyclone_schema_version") == newest
        assert scalar(conn, "SELECT count(*) FROM cyclone_v_runs") == 0
        assert scalar(conn, "SELECT count(*) FROM cyclone_v_steps") == 0
        assert scalar(conn, "SELECT count(*) FROM shop_receipt") == 0
        applied = conn.execute(
            "SELECT name FROM django_migrations WHERE app = 'cyclone'"
        ).fetchall()
    assert applied == [("0001_schema",)]
    again = manage(project_dsn, "migrate")
    assert again.returncode == 0, again.stderr
    assert "No migrations to apply" in again.stdout
    check = manage(project_dsn, "makemigrations", "--check", "--dry-run", "cyclone", "shop")
    assert check.returncode == 0, check.stdout + check.stderr
    checked = manage(project_dsn, "check")
    assert checked.returncode == 0, checked.stderr
    assert "no issues" in checked.stdout


def test_cyclone_runs_lists_the_project_runs(project_dsn: str) -> None:
    """``manage.py cyclone runs --json`` reads the default database; ``--dsn`` wins."""
    with cyclone.SyncClient(project_dsn) as client:
        handle = client.enqueue("django_listed", {"n": 1})
    for extra in ([], ["--dsn", project_dsn]):
        done = manage(project_dsn, "cyclone", "runs", "--json", *extra)
        assert done.returncode == 0, done.stderr
        assert handle.run_id in [run["id"] for run in json.loads(done.stdout)]
    missing = manage(project_dsn, "cyclone", "run", "987654321")
    assert missing.returncode == 1
    assert "987654321" in missing.stderr


def _receipts(dsn: str, run_id: int) -> list[Any]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT note FROM shop_receipt WHERE run_id = %s", (run_id,)).fetchall()


def test_cyclone_worker_runs_the_app_of_the_settings(project_dsn: str) -> None:
    """``manage.py cyclone worker`` runs ``CYCLONE["APP"]`` (whose client takes the DSN
    the command set): its handler's ORM write commits with the step; SIGTERM drains
    it and it exits 0."""
    env = {**os.environ, DSN_ENV: project_dsn}
    env.pop("CYCLONE_DSN", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "cyclone", "--log-level", "warning", "worker"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            with cyclone.SyncClient(project_dsn) as client:
                handle = client.enqueue("django_receipt", {"note": "by the worker"})
                run = client.wait(handle.run_id, timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.seek(0)
            output = log.read()
    assert run.state == cyclone.RunState.COMPLETED, (run.error, output)
    assert run.result is not None and _receipts(project_dsn, handle.run_id) == [("by the worker",)]
    assert code == 0, output


def test_migrate_installs_cyclone_in_the_database_it_migrates_not_the_dsn(
    admin_dsn: str,
) -> None:
    """With CYCLONE["DSN"] naming another database, ``manage.py migrate`` installs
    Cyclone's tables in the database it migrates (where enqueue_tx writes; the test
    database under ``manage.py test``), never in the DSN's."""
    migrated, elsewhere = create_database(admin_dsn), create_database(admin_dsn)
    try:
        other = database_dsn(admin_dsn, elsewhere)
        done = manage(database_dsn(admin_dsn, migrated), "migrate", cyclone_dsn=other)
        assert done.returncode == 0, done.stderr
        with psycopg.connect(database_dsn(admin_dsn, migrated)) as conn:
            assert scalar(conn, "SELECT to_regclass('cyclone_runs') IS NOT NULL")
        with psycopg.connect(other) as conn:
            assert scalar(conn, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
    finally:
        drop_database(admin_dsn, migrated)
        drop_database(admin_dsn, elsewhere)
