"""The admin pages of runs and steps: lists and detail pages render for a logged-in
superuser, and nothing can be added, changed or deleted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import cyclone


@pytest.fixture
def browser(django_dsn: str) -> Iterator[Any]:
    """Django's test client, logged in as a superuser."""
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="cyclone-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    yield client
    connections.close_all()


def _failed_run(dsn: str) -> tuple[int, int]:
    """A run with one step, failed by hand: its run and step ids."""
    with cyclone.SyncClient(dsn) as client:
        handle = client.enqueue("django_admin_kind", {"n": 1}, queue="django_admin")
        client.cancel(handle.run_id)
    return handle.run_id, handle.step_id


def test_run_and_step_pages_render(browser: Any, django_dsn: str) -> None:
    """The lists show the run and its step (with filters), the detail pages show their
    fields read only, the run's page lists its steps."""
    run_id, step_id = _failed_run(django_dsn)
    page = browser.get("/admin/cyclone/run/", {"state": "cancelled"})
    assert page.status_code == 200
    body = page.content.decode()
    assert f"/admin/cyclone/run/{run_id}/change/" in body
    assert "django_admin_kind" in body
    page = browser.get(f"/admin/cyclone/run/{run_id}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert "cancelled" in body and f"/admin/cyclone/step/{step_id}/change/" in body
    assert 'name="_save"' not in body  # read only: no save button
    page = browser.get("/admin/cyclone/step/", {"queue": "django_admin"})
    assert page.status_code == 200
    assert f"/admin/cyclone/step/{step_id}/change/" in page.content.decode()
    page = browser.get(f"/admin/cyclone/step/{step_id}/change/")
    assert page.status_code == 200
    assert "django_admin_kind" in page.content.decode()


def test_nothing_can_be_added_changed_or_deleted(browser: Any, django_dsn: str) -> None:
    """Add and delete pages are forbidden, a posted change is refused, and the lists
    offer no delete action; the run is untouched."""
    run_id, _ = _failed_run(django_dsn)
    for model in ("run", "step"):
        assert browser.get(f"/admin/cyclone/{model}/add/").status_code == 403
    assert browser.get(f"/admin/cyclone/run/{run_id}/delete/").status_code == 403
    assert browser.post(f"/admin/cyclone/run/{run_id}/change/", {"state": "x"}).status_code == 403
    changelist = browser.get("/admin/cyclone/run/").content.decode()
    assert "delete_selected" not in changelist
    with cyclone.SyncClient(django_dsn) as client:
        assert client.get_run(run_id).state == cyclone.RunState.CANCELLED
