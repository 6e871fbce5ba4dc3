"""``manage.py cyclone`` in process (``call_command``), and the ``CYCLONE`` setting."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.errors import ConfigurationError


def test_call_command_runs_cyclone_on_the_default_database(
    django_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cyclone runs --json`` lists a run of the project's database (the DSN came from
    DATABASES); a failing command raises CommandError with its exit status."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with cyclone.SyncClient(django_dsn) as client:
        handle = client.enqueue("django_listed", None)
    capsys.readouterr()
    call_command("cyclone", "runs", "--json", "--limit", "1000")
    listed = json.loads(capsys.readouterr().out)
    assert handle.run_id in [run["id"] for run in listed]
    with pytest.raises(CommandError) as failed:
        call_command("cyclone", "run", "987654321")
    assert failed.value.returncode == 1
    assert "987654321" in capsys.readouterr().err


def test_worker_gets_the_app_of_the_settings(django_dsn: str) -> None:
    """``worker`` with no APP gets ``CYCLONE["APP"]``, after its options too; a given
    APP is kept, and other commands are left as they are."""
    from cyclone.contrib.django.management.commands.cyclone import cli_arguments

    app = "tests.django.project.worker:client"
    assert cli_arguments(["worker"]) == ["worker", app]
    assert cli_arguments(["worker", "--slots", "2"]) == ["worker", "--slots", "2", app]
    assert cli_arguments(["worker", "other:client", "--slots", "2"]) == [
        "worker",
        "other:client",
        "--slots",
        "2",
    ]
    assert cli_arguments(["--log-level", "debug", "worker"]) == [
        "--log-level",
        "debug",
        "worker",
        app,
    ]
    assert cli_arguments(["runs", "--json"]) == ["runs", "--json"]
    assert cli_arguments(["--log-level", "debug", "runs"]) == ["--log-level", "debug", "runs"]


def test_dsn_defaults_to_the_default_database(django_dsn: str) -> None:
    """Without ``CYCLONE["DSN"]`` the DSN reaches the default database; with it, it is
    the DSN given."""
    from django.test import override_settings

    from cyclone.contrib.django import config

    with psycopg.connect(config.dsn()) as conn, psycopg.connect(django_dsn) as direct:
        here = conn.execute("SELECT current_database()").fetchone()
        assert here == direct.execute("SELECT current_database()").fetchone()
    with override_settings(CYCLONE={"DSN": "dbname=elsewhere"}):
        assert config.dsn() == "dbname=elsewhere"


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"DNS": "x"}, "'DNS'"),
        ({"APP": ""}, r"CYCLONE\['APP'\]"),
        (["DSN"], "must be a dict"),
    ],
)
def test_a_malformed_setting_is_named(django_dsn: str, value: Any, named: str) -> None:
    """A key that is not DSN or APP, an empty value, or not a dict: a
    ConfigurationError naming it."""
    from django.test import override_settings

    from cyclone.contrib.django import config

    with override_settings(CYCLONE=value), pytest.raises(ConfigurationError, match=named):
        config.options()


def test_manage_py_names_a_malformed_setting_in_one_line(
    django_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``manage.py cyclone runs`` with a misspelt key: ``CommandError: ...`` naming it
    on stderr, exit status 1, no traceback and no command run."""
    from django.test import override_settings

    from cyclone.contrib.django.management.commands.cyclone import Command

    capsys.readouterr()
    with override_settings(CYCLONE={"DNS": "x"}), pytest.raises(SystemExit) as stopped:
        Command().run_from_argv(["manage.py", "cyclone", "runs", "--json"])
    assert stopped.value.code == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("CommandError: settings.CYCLONE has unknown keys ['DNS']")
    assert "Traceback" not in err and err.count("\n") == 1


def test_only_postgresql_aliases_give_a_dsn(django_dsn: str) -> None:
    """An unknown alias or a SQLite one: a ConfigurationError naming it."""
    from cyclone.contrib.django import config

    with pytest.raises(ConfigurationError, match="no alias 'nowhere'"):
        config.conninfo_of("nowhere")
    with pytest.raises(ConfigurationError, match=r"'lite' uses 'django\.db\.backends\.sqlite3'"):
        config.conninfo_of("lite")
