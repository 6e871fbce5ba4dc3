"""The dashboard's pages on runs a real worker made: what each shows, every database
value escaped, long values cut with a link to the whole, bad parameters refused."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from tests.dashboard.conftest import XSS

pytestmark = pytest.mark.usefixtures("made")

ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def assert_no_markup_from_data(page: str) -> None:
    """The XSS strings appear only escaped: no script element, no onerror attribute."""
    assert "<script>alert" not in page
    assert "<img src=x" not in page
    assert "onerror=alert(2)>" not in page or "&gt;" in page
    assert not re.search(r"<img[^>]*onerror", page)
    # the only scripts are the page's own file
    assert re.findall(r"<script[^>]*>", page) == [
        m for m in re.findall(r"<script[^>]*>", page) if "/static/app.js" in m
    ]


@pytest.mark.parametrize(
    "path", ["/", "/runs", "/queues", "/kinds", "/schedules", "/workers", "/runs?state=failed"]
)
async def test_every_page_answers_and_escapes(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert_no_markup_from_data(response.text)


async def test_overview_lists_the_failure_escaped(
    http: httpx.AsyncClient, made: dict[str, int]
) -> None:
    page = (await http.get("/")).text
    assert f'href="/runs/{made["failed"]}"' in page
    assert ESCAPED in page
    assert "dash_flow" in page


async def test_run_page_draws_one_node_per_step_with_its_state(
    http: httpx.AsyncClient, made: dict[str, int], db: psycopg.Connection[Any]
) -> None:
    """One node per step (a fan-out's items folded into their node) with the state the
    database holds: b ran beside c, so it completed or was cancelled by c's discard,
    whichever came first."""
    page = (await http.get(f"/runs/{made['failed']}")).text
    nodes = dict(re.findall(r'data-node="([^"]+)" data-state="([^"]+)"', page))
    stored = dict(
        db.execute(
            "SELECT node, state FROM cyclone_steps WHERE run_id = %s AND item_of IS NULL",
            (made["failed"],),
        ).fetchall()
    )
    assert nodes == stored
    assert nodes.pop("b") in ("completed", "cancelled")
    # the fan-out's items ran beside c too: all of them may complete before its discard
    assert nodes.pop("items") in ("completed", "cancelled")
    assert nodes == {
        "a": "completed",
        "c": "discarded",
        "approve": "cancelled",
        "d": "cancelled",
    }
    assert ESCAPED in page  # the run's error, and c's error in the steps table
    assert_no_markup_from_data(page)
    # the fan-out's items (made with a's completion) folded into its node, counting
    # those that completed before c's discard cancelled the others
    made_items = db.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'completed') FROM cyclone_steps"
        " WHERE run_id = %s AND item_of IS NOT NULL",
        (made["failed"],),
    ).fetchone()
    assert made_items is not None
    total, done = made_items
    assert total == 3
    assert f"{done}/{total} items" in page
    assert 'href="/runs/{}/actions/retry"'.format(made["failed"]) in page


async def test_waiting_run_shows_what_it_waits_for_and_refreshes(
    http: httpx.AsyncClient, made: dict[str, int]
) -> None:
    page = (await http.get(f"/runs/{made['waiting']}")).text
    assert 'data-node="approve" data-state="waiting_signal"' in page
    assert "signal approve" in page
    assert f'data-live="/runs/{made["waiting"]}/states"' in page
    states = (await http.get(f"/runs/{made['waiting']}/states")).json()
    assert states["run_state"] == "running"
    assert states["nodes"]["approve"] == "waiting_signal"


async def test_step_page_shows_values_escaped_and_cuts_long_ones(
    http: httpx.AsyncClient, made: dict[str, int]
) -> None:
    failed = (await http.get(f"/runs/{made['failed']}/step?node=c")).text
    assert ESCAPED in failed and "Traceback" in failed
    assert_no_markup_from_data(failed)
    job = (await http.get(f"/runs/{made['job']}/step?node=dash_echo")).text
    assert "Full value" in job
    assert "x" * 30_000 not in job
    full = await http.get(
        f"/runs/{made['job']}/step/value", params={"node": "dash_echo", "field": "output"}
    )
    assert full.headers["content-type"].startswith("text/plain")
    assert full.headers["x-content-type-options"] == "nosniff"
    assert '"x' + "x" * 29_999 + '"' in full.text


async def test_fan_out_step_lists_its_items(http: httpx.AsyncClient, made: dict[str, int]) -> None:
    page = (await http.get(f"/runs/{made['failed']}/step?node=items")).text
    assert re.findall(r'<td class="num"><a href="[^"]+">#(\d+)</a>', page) == ["0", "1", "2"]


async def test_runs_filters_search_and_pages(http: httpx.AsyncClient, made: dict[str, int]) -> None:
    failed = (await http.get("/runs", params={"state": "failed"})).text
    assert f'data-run="{made["failed"]}"' in failed
    assert f'data-run="{made["job"]}"' not in failed
    one = (await http.get("/runs", params={"limit": "1"})).text
    assert one.count("data-run=") == 1
    older = re.search(r'href="(/runs\?[^"]*before=\d+[^"]*)"', one)
    assert older, "a page of one run of three links the next page"
    second = (await http.get(older.group(1).replace("&amp;", "&"))).text
    assert second.count("data-run=") == 1 and second != one
    found = await http.get("/runs", params={"q": str(made["waiting"])})
    assert found.status_code == 303
    assert found.headers["location"] == f"/runs/{made['waiting']}"
    by_key = (await http.get("/runs", params={"q": XSS})).text
    assert f'data-run="{made["failed"]}"' in by_key and by_key.count("data-run=") == 1
    between = (
        await http.get("/runs", params={"since": "2000-01-01T00:00", "until": "2000-01-02"})
    ).text
    assert "No run matches" in between
    by_workflow = (await http.get("/runs", params={"workflow": "dash_gate"})).text
    assert by_workflow.count("data-run=") == 1


@pytest.mark.parametrize(
    ("path", "status", "named"),
    [
        ("/runs?state=sleeping", 422, "'sleeping'"),
        ("/runs?limit=100000", 422, "100000"),
        ("/runs?before=x", 422, "'x'"),
        ("/runs?since=yesterday", 422, "'yesterday'"),
        ("/runs?q=%C2%B2", 200, "No run matches"),
        ("/runs/999999", 404, "999999"),
        ("/runs/1/step?node=nope", 404, "'nope'"),
        ("/runs/1/step/value?node=a&field=secret", 422, "'secret'"),
    ],
)
async def test_bad_parameters_get_a_page_naming_them(
    http: httpx.AsyncClient, path: str, status: int, named: str
) -> None:
    response = await http.get(path)
    assert response.status_code == status
    assert named.replace("'", "&#39;") in response.text


async def test_mounted_under_a_prefix_every_link_keeps_it(dsn: str, made: dict[str, int]) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from cyclone.dashboard import create_app
    from tests.dashboard.conftest import BASE, csrf_of

    dashboard = create_app(dsn)
    outer = Starlette(routes=[Mount("/ops/cyclone", app=dashboard)])
    try:
        transport = httpx.ASGITransport(app=outer)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            page = (await http.get(f"/ops/cyclone/runs/{made['waiting']}")).text
            links = re.findall(r'(?:href|action|src)="(/[^"]*)"', page)
            assert links and all(link.startswith("/ops/cyclone/") for link in links), links
            assert (await http.get("/ops/cyclone/static/app.js")).status_code == 200
            form = await http.get(f"/ops/cyclone/runs/{made['waiting']}/actions/pause")
            done = await http.post(
                f"/ops/cyclone/runs/{made['waiting']}/actions/pause",
                data={"csrf": csrf_of(form.text)},
            )
            assert done.status_code == 303
            assert done.headers["location"] == f"/ops/cyclone/runs/{made['waiting']}"
            api = await http.get(f"/ops/cyclone/api/runs/{made['waiting']}")
            assert api.json()["run"]["state"] == "paused"
    finally:
        await dashboard.state.backend.aclose()


async def test_a_time_range_pages_in_creation_order(
    http: httpx.AsyncClient, db: psycopg.Connection[Any]
) -> None:
    """One run a day for 30 days: a page of runs before a time is the newest runs
    before it, whichever window the page was found in, and the next page goes on."""
    db.execute(
        "INSERT INTO cyclone_runs (workflow, def_version, created_at)"
        " SELECT 'dash_day', 'job', now() - g * interval '1 day' FROM generate_series(0, 29) g"
    )
    ids = {
        day: run_id
        for run_id, day in db.execute(
            "SELECT id, round(extract(epoch FROM now() - created_at) / 86400)::int"
            " FROM cyclone_runs WHERE workflow = 'dash_day'"
        ).fetchall()
    }
    until = (datetime.now(UTC) - timedelta(days=2, hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    page = (await http.get("/runs", params={"until": until, "limit": "5"})).text
    assert [int(i) for i in re.findall(r'data-run="(\d+)"', page)] == [ids[d] for d in range(3, 8)]
    older = re.search(r'href="(/runs\?[^"]*before=\d+[^"]*)"', page)
    assert older
    second = (await http.get(older.group(1).replace("&amp;", "&"))).text
    assert [int(i) for i in re.findall(r'data-run="(\d+)"', second)] == [
        ids[d] for d in range(8, 13)
    ]
    since = (datetime.now(UTC) - timedelta(days=4, hours=12)).strftime("%Y-%m-%dT%H:%M:%S")
    bounded = (await http.get("/runs", params={"until": until, "since": since})).text
    assert [int(i) for i in re.findall(r'data-run="(\d+)"', bounded)] == [ids[3], ids[4]]


async def test_schedules_page_and_its_enable_disable_form(
    http: httpx.AsyncClient, dsn: str
) -> None:
    import cyclone
    from tests.dashboard.conftest import XSS, csrf_of

    async with cyclone.Client(dsn) as client:
        await client.create_schedule(XSS, "dash_echo", {"x": 1}, "30 4 * * *", "Europe/Paris")
    page = (await http.get("/schedules")).text
    assert ESCAPED in page  # the id, as text
    assert "04:30:00 CET" in page  # next fires in the schedule's own zone
    assert "enabled" in page
    path = f"/schedules/actions/disable?id={quote(XSS, safe='')}"
    form = await http.get(path)
    assert form.status_code == 200
    done = await http.post(path, data={"csrf": csrf_of(form.text)})
    assert done.status_code == 303 and done.headers["location"] == "/schedules"
    async with cyclone.Client(dsn) as client:
        assert not (await client.get_schedule(XSS)).enabled
    shown = (await http.get("/schedules")).text
    assert "disabled" in shown and "/actions/enable" in shown
    missing = await http.post(
        "/schedules/actions/enable?id=nope", data={"csrf": csrf_of(form.text)}
    )
    assert missing.status_code == 404 and "nope" in missing.text


async def test_purge_form_deletes_finished_runs(
    http: httpx.AsyncClient, made: dict[str, int]
) -> None:
    from tests.dashboard.conftest import csrf_of

    form = await http.get("/purge")
    token = csrf_of(form.text)
    bad = await http.post("/purge", data={"csrf": token, "older_than": "soon"})
    assert bad.status_code == 422 and "&#39;soon&#39;" in bad.text
    done = await http.post("/purge", data={"csrf": token, "older_than": "0"})
    assert done.status_code == 303
    shown = (await http.get(done.headers["location"])).text
    assert "purged 2 run(s)" in shown  # the failed run and the job; the waiting one stays
    assert (await http.get(f"/runs/{made['failed']}")).status_code == 404
    assert (await http.get(f"/runs/{made['waiting']}")).status_code == 200
