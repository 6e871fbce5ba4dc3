"""The dashboard's guard: Host and Origin on every request, the token off loopback,
CSRF tokens on forms, JSON-only API POSTs, a strict Content-Security-Policy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

import cyclone
from cyclone.dashboard import create_app
from cyclone.dashboard.security import CSP, host_name, is_loopback, safe_next
from tests.dashboard.conftest import BASE, csrf_of
from tests.helpers import ROOT

TOKEN = "s3cret-token-for-tests"


@pytest.fixture
async def guarded(dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    """The dashboard with a token, reached as ``dash.example`` (an allowed host)."""
    app: Starlette = create_app(dsn, token=TOKEN, allowed_hosts=["dash.example"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash.example") as c:
        yield c
    await app.state.backend.aclose()


async def test_every_response_has_the_strict_headers(http: httpx.AsyncClient) -> None:
    for path in ("/", "/api/runs", "/static/app.css", "/nope"):
        response = await http.get(path)
        assert response.headers["content-security-policy"] == CSP
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["x-frame-options"] == "DENY"
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP


async def test_an_unknown_host_is_refused(http: httpx.AsyncClient) -> None:
    rebound = await http.get("/", headers={"host": "attacker.example:8484"})
    assert rebound.status_code == 400 and "attacker.example" in rebound.text
    for host in ("localhost:8484", "127.0.0.1", "[::1]:8484"):
        assert (await http.get("/api/queues", headers={"host": host})).status_code == 200


async def test_a_cross_origin_post_is_refused_without_a_token(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    run = made["waiting"]
    evil = {"origin": "http://evil.example"}
    assert (await http.post(f"/api/runs/{run}/cancel", json={}, headers=evil)).status_code == 403
    other_port = {"origin": "http://127.0.0.1:9999"}
    assert (
        await http.post(f"/api/runs/{run}/pause", json={}, headers=other_port)
    ).status_code == 403
    site = {"sec-fetch-site": "cross-site"}
    assert (await http.post(f"/api/runs/{run}/pause", json={}, headers=site)).status_code == 403
    null = {"origin": "null"}
    assert (await http.post(f"/api/runs/{run}/pause", json={}, headers=null)).status_code == 403
    async with cyclone.Client(dsn) as client:
        assert (await client.get_run(run)).state.value == "running"
    own = {"origin": BASE}
    assert (await http.post(f"/api/runs/{run}/pause", json={}, headers=own)).status_code == 200


async def test_a_form_post_needs_its_csrf_token(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    run = made["waiting"]
    page = await http.get(f"/runs/{run}/actions/pause")
    assert page.status_code == 200
    token = csrf_of(page.text)
    missing = await http.post(f"/runs/{run}/actions/pause", data={})
    assert missing.status_code == 403 and "CSRF" in missing.text
    forged = await http.post(f"/runs/{run}/actions/pause", data={"csrf": "0" * 64})
    assert forged.status_code == 403
    async with cyclone.Client(dsn) as client:
        assert (await client.get_run(run)).state.value == "running"
    done = await http.post(f"/runs/{run}/actions/pause", data={"csrf": token})
    assert done.status_code == 303 and done.headers["location"] == f"/runs/{run}"
    shown = (await http.get(done.headers["location"])).text
    assert f"run {run} paused" in shown
    again = await http.post(f"/runs/{run}/actions/pause", data={"csrf": token})
    assert again.status_code == 409 and "not running" in again.text


async def test_the_token_is_required_and_accepted(
    guarded: httpx.AsyncClient, made: dict[str, int]
) -> None:
    assert (await guarded.get("/api/runs")).status_code == 401
    page = await guarded.get("/runs")
    assert page.status_code == 303 and page.headers["location"].startswith("/login?next=")
    wrong = {"authorization": "Bearer nope"}
    assert (await guarded.get("/api/runs", headers=wrong)).status_code == 401
    right = {"authorization": f"Bearer {TOKEN}"}
    assert (await guarded.get("/api/runs", headers=right)).status_code == 200
    assert (await guarded.get("/static/app.css")).status_code == 200
    assert (await guarded.get("/login")).status_code == 200
    refused = await guarded.post("/login", data={"token": "nope"})
    assert refused.status_code == 401
    assert (await guarded.get("/api/runs")).status_code == 401
    accepted = await guarded.post("/login?next=/runs", data={"token": TOKEN})
    assert accepted.status_code == 303 and accepted.headers["location"] == "/runs"
    assert TOKEN not in accepted.headers["set-cookie"]
    assert "HttpOnly" in accepted.headers["set-cookie"]
    assert (await guarded.get("/runs")).status_code == 200  # the login cookie


def test_helpers() -> None:
    assert host_name("[::1]:8484") == "::1" and host_name("LocalHost:80") == "localhost"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert safe_next("//evil.example/x", "") == "/" and safe_next("/runs?x=1", "") == "/runs?x=1"
    assert safe_next("https://evil.example", "/dash") == "/dash/"


@pytest.mark.slow  # runs the cyclone command in a process
def test_binding_off_loopback_needs_a_token(dsn: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CYCLONE_DASHBOARD_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "cyclone", "dashboard", "--dsn", dsn, "--host", "0.0.0.0"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "--token" in out.stderr and "0.0.0.0" in out.stderr


def test_importing_cyclone_never_imports_starlette() -> None:
    code = (
        "import sys, cyclone; "
        "print(any(m.startswith(('starlette', 'jinja2', 'uvicorn')) for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow  # runs the cyclone command in a process
def test_the_command_serves_the_dashboard(dsn: str) -> None:
    from tests.dashboard.live import free_port
    from tests.helpers import poll_until

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CYCLONE_DASHBOARD_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cyclone", "dashboard", "--dsn", dsn, "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def answers() -> httpx.Response | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/queues", timeout=2)
            except httpx.TransportError:
                return None

        response = poll_until(answers, timeout=30, what="cyclone dashboard to answer")
        assert response is not None
        assert response.status_code == 200 and response.json() == []
        assert response.headers["content-security-policy"] == CSP
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/" in out


@pytest.mark.slow  # each request waits out the 5 s connect timeout
async def test_an_unreachable_database_is_a_503_page(dsn: str) -> None:
    from tests.conftest import database_dsn

    app: Starlette = create_app(database_dsn(dsn, "cyclone_no_such_database"))
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            page = await http.get("/")
            assert page.status_code == 503 and "cyclone_no_such_database" in page.text
            api = await http.get("/api/queues")
            assert api.status_code == 503 and "cyclone_no_such_database" in api.json()["error"]
    finally:
        await app.state.backend.aclose()


async def test_without_a_token_the_login_page_says_there_is_nothing_to_log_in_to(
    http: httpx.AsyncClient,
) -> None:
    page = await http.get("/login?next=/runs")
    assert page.status_code == 200
    assert "nothing to log in to" in page.text and 'name="token"' not in page.text


async def test_a_malformed_cookie_of_another_app_does_not_hide_the_login(
    guarded: httpx.AsyncClient,
) -> None:
    """Another app on the host may set a cookie the strict parser rejects; the login
    cookie after it still counts."""
    await guarded.post("/login", data={"token": TOKEN})
    session = guarded.cookies.get("cyclone_session")
    assert session
    guarded.cookies.clear()
    headers = {"cookie": f"[x]=1; a b=2; cyclone_session={session}"}
    assert (await guarded.get("/api/runs", headers=headers)).status_code == 200


async def test_a_non_ascii_token_works_as_a_bearer_header(dsn: str) -> None:
    token = "pässwört-ü"
    app: Starlette = create_app(dsn, token=token)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            good = {b"authorization": b"Bearer " + token.encode()}
            assert (await c.get("/api/runs", headers=good)).status_code == 200
            wrong = {b"authorization": b"Bearer passwort-u"}
            assert (await c.get("/api/runs", headers=wrong)).status_code == 401
    finally:
        await app.state.backend.aclose()


def test_only_loopback_addresses_and_localhost_count_as_loopback() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        assert is_loopback(host), host
    for host in ("127.invalid", "127.attacker.example", "0.0.0.0", "10.0.0.1", "::"):
        assert not is_loopback(host), host


async def test_the_guard_s_own_refusals_carry_the_strict_headers(
    guarded: httpx.AsyncClient,
) -> None:
    refused = await guarded.get("/api/runs")
    assert refused.status_code == 401
    assert refused.headers["x-frame-options"] == "DENY"
    assert refused.headers["referrer-policy"] == "same-origin"
    assert refused.headers["content-security-policy"] == CSP


async def test_bad_times_deep_json_and_a_zero_limit_are_refused_with_422(
    http: httpx.AsyncClient, made: dict[str, int]
) -> None:
    for path in ("/runs?until=0001-01-01T00:00:00", "/runs?since=9999-12-31&until=0001-01-01"):
        assert (await http.get(path)).status_code == 422, path
    assert (await http.get("/api/runs?limit=0")).status_code == 422
    deep = '{"name": "x", "payload": ' + "[" * 5000 + "]" * 5000 + "}"
    run_id = made["waiting"]
    answer = await http.post(
        f"/api/runs/{run_id}/signal",
        content=deep,
        headers={"content-type": "application/json", "origin": BASE},
    )
    assert answer.status_code == 422, answer.text
