"""One Django database for this directory, configured once per process.

Django's settings can be configured once per process, so the project's database is
made once per session: a clone of the migrated template (with its transition guard),
its sessions in time zone Asia/Tokyo (Django's own connections switch to UTC, so a
connection lent to Django that did not would load wrong datetimes), and Django's own
tables added by ``migrate``. Tests share it: each asserts on the runs it made.
The subprocess tests (``manage.py``) get databases of their own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.conftest import create_database, database_dsn, drop_database
from tests.helpers import set_database_timezone

DSN_ENV = "CYCLONE_DJANGO_TEST_DSN"
SETTINGS = "tests.django.project.settings"
ZONE = "Asia/Tokyo"


@pytest.fixture(scope="session")
def django_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """The DSN of the project's database, with Django set up on it (once)."""
    import django
    from django.core.management import call_command
    from django.db import connections

    name = create_database(admin_dsn, template=template_db)
    dsn = set_database_timezone(database_dsn(admin_dsn, name), ZONE)
    before = {key: os.environ.get(key) for key in (DSN_ENV, "DJANGO_SETTINGS_MODULE")}
    os.environ[DSN_ENV], os.environ["DJANGO_SETTINGS_MODULE"] = dsn, SETTINGS
    try:
        django.setup()  # reads the settings module, which reads the DSN, now
        call_command("migrate", verbosity=0)
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield dsn
    connections.close_all()
    drop_database(admin_dsn, name)


@pytest.fixture
def pg(django_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of the test's own to the project's database."""
    with psycopg.connect(django_dsn, autocommit=True) as conn:
        yield conn
