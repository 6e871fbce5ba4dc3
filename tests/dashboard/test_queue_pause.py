"""Queue pause on the dashboard: the queues tables (``/queues`` and the overview) show
each queue's pause and carry a Pause or Resume button, a form that POSTs with the
page's CSRF token to ``/queues/actions/{pause|resume}?name=NAME``; the action is the
client's ``pause_queue`` / ``resume_queue``. Queue names are shown escaped."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

import httpx
import psycopg
from markupsafe import escape
from starlette.applications import Starlette

import cyclone
from cyclone.dashboard import create_app
from tests.dashboard.conftest import BASE, XSS, csrf_of
from tests.helpers import scalar

ESCAPED = str(escape(XSS))
"""The XSS queue name as the pages show it (Jinja2's escaping)."""


def row(page: str, queue: str) -> str:
    """The table row of ``queue`` (its name escaped as the page shows it)."""
    found = re.search(rf'<tr data-queue="{re.escape(str(escape(queue)))}".*?</tr>', page, re.S)
    assert found, f"no row of {queue!r} in\n{page}"
    return found.group(0)


def button(row_html: str) -> tuple[str, str, str]:
    """The row's button form: its action URL, its ``back`` value and its label."""
    action = re.search(r'<form method="post" action="([^"]+)"', row_html)
    back = re.search(r'name="back" value="([^"]+)"', row_html)
    label = re.search(r"data-queue-action=\"\w+\">(\w+)</button>", row_html)
    assert action and back and label, row_html
    return html.unescape(action.group(1)), back.group(1), label.group(1)


async def test_the_queues_tables_pause_and_resume_a_queue(
    http: httpx.AsyncClient, dsn: str, db: psycopg.Connection[psycopg.rows.TupleRow]
) -> None:
    with cyclone.SyncClient(dsn) as client:
        client.enqueue("dash_echo", {"x": 1}, queue=XSS)  # no worker serves it
    page = (await http.get("/queues")).text
    shown = row(page, XSS)
    assert ESCAPED in shown and "<script>alert" not in page
    assert 'data-paused="false"' in shown
    action, back, label = button(shown)
    assert (action, back, label) == (f"/queues/actions/pause?name={quote(XSS)}", "queues", "Pause")

    refused = await http.post(action, data={"back": back})  # no CSRF token
    assert refused.status_code == 403 and "CSRF" in refused.text
    forged = await http.post(action, data={"csrf": "0" * 64, "back": back})
    assert forged.status_code == 403
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0

    done = await http.post(action, data={"csrf": csrf_of(page), "back": back})
    assert done.status_code == 303 and done.headers["location"] == "/queues"
    after = (await http.get("/queues")).text
    assert f"queue {escape(repr(XSS))} paused" in after  # the flash, escaped
    assert 'data-paused="true"' in row(after, XSS)
    assert scalar(db, "SELECT queue FROM cyclone_queue_pauses") == XSS

    overview = (await http.get("/")).text
    action, back, label = button(row(overview, XSS))
    assert (back, label) == ("overview", "Resume")
    resumed = await http.post(action, data={"csrf": csrf_of(overview), "back": back})
    assert resumed.status_code == 303 and resumed.headers["location"] == "/"
    assert f"queue {escape(repr(XSS))} resumed" in (await http.get("/")).text
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0
    again = await http.post(action, data={"csrf": csrf_of(overview), "back": back})
    assert again.status_code == 303  # not paused: nothing to do, and it says so
    assert "was not paused" in (await http.get("/")).text


async def test_a_paused_queue_without_steps_is_listed_and_shown_by_the_api(
    http: httpx.AsyncClient, dsn: str
) -> None:
    empty = await http.get("/queues")
    assert "No unfinished step in any queue." in empty.text
    async with cyclone.Client(dsn) as client:
        assert await client.pause_queue("dash_idle") is True
    page = (await http.get("/queues")).text
    assert 'data-paused="true"' in row(page, "dash_idle")
    assert button(row(page, "dash_idle"))[2] == "Resume"
    listed = (await http.get("/api/queues")).json()
    assert [(q["queue"], q["available"], q["paused"]) for q in listed] == [("dash_idle", 0, True)]


async def test_the_confirmation_page_and_bad_input(
    http: httpx.AsyncClient, db: psycopg.Connection[psycopg.rows.TupleRow]
) -> None:
    confirm = await http.get(f"/queues/actions/pause?name={quote(XSS)}")
    assert confirm.status_code == 200
    assert ESCAPED in confirm.text and "<script>alert" not in confirm.text
    assert 'id="confirm-form"' in confirm.text
    token = csrf_of(confirm.text)
    empty = await http.post("/queues/actions/pause?name=", data={"csrf": token})
    assert empty.status_code == 422 and "queue must not be empty" in empty.text
    long = "q" * 300
    too_long = await http.post(f"/queues/actions/pause?name={long}", data={"csrf": token})
    assert too_long.status_code == 422 and "300 bytes" in too_long.text
    unknown = await http.post("/queues/actions/drain?name=x", data={"csrf": token})
    assert unknown.status_code == 404 and "drain" in unknown.text
    assert scalar(db, "SELECT count(*) FROM cyclone_queue_pauses") == 0
    done = await http.post(f"/queues/actions/pause?name={quote(XSS)}", data={"csrf": token})
    assert done.status_code == 303 and done.headers["location"] == "/queues"
    assert scalar(db, "SELECT queue FROM cyclone_queue_pauses") == XSS


async def test_read_only_shows_the_pause_and_refuses_to_change_it(
    dsn: str, db: psycopg.Connection[psycopg.rows.TupleRow]
) -> None:
    with cyclone.SyncClient(dsn) as client:
        client.pause_queue("dash_ro")
    app: Starlette = create_app(dsn, read_only=True)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            page = (await http.get("/queues")).text
            assert 'data-paused="true"' in row(page, "dash_ro")
            assert "/queues/actions/" not in page and "read-only" in page
            assert (await http.get("/queues/actions/resume?name=dash_ro")).status_code == 403
            refused = await http.post("/queues/actions/resume?name=dash_ro", data={})
            assert refused.status_code == 403
    finally:
        await app.state.backend.aclose()
    assert scalar(db, "SELECT queue FROM cyclone_queue_pauses") == "dash_ro"
