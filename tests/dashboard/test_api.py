"""The JSON API: the CLI's ``--json`` shapes, and the actions with their statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import cyclone
from cyclone.dashboard import create_app
from tests.dashboard.conftest import BASE, XSS, run_until, step_state
from tests.helpers import ROOT

JSON = {"content-type": "application/json"}


def cli_json(dsn: str, *args: str) -> Any:
    """What ``cyclone ARGS --json`` prints, parsed."""
    env = {**os.environ, "CYCLONE_DSN": dsn}
    out = subprocess.run(
        [sys.executable, "-m", "cyclone", *args, "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


@pytest.mark.slow  # runs the cyclone command in a process
async def test_reads_answer_in_the_cli_shapes(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    run_id = made["failed"]
    api_run = (await http.get(f"/api/runs/{run_id}")).json()
    assert api_run == cli_json(dsn, "run", str(run_id))
    assert api_run["run"]["error"].endswith(XSS)  # JSON carries the raw value
    assert (await http.get("/api/runs")).json() == cli_json(dsn, "runs")
    assert (await http.get("/api/queues")).json() == cli_json(dsn, "queues")
    assert (await http.get("/api/schedules")).json() == cli_json(dsn, "schedules")
    assert len((await http.get("/api/runs", params={"limit": 1})).json()) == 1
    failed = (await http.get("/api/runs", params={"state": "failed"})).json()
    assert [r["id"] for r in failed] == [run_id]


async def test_actions_answer_with_the_run_and_their_statuses(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    waiting = made["waiting"]
    paused = await http.post(f"/api/runs/{waiting}/pause", json={})
    assert paused.status_code == 200
    assert paused.json()["state"] == "paused" and paused.json()["id"] == waiting
    again = await http.post(f"/api/runs/{waiting}/pause", json={})
    assert again.status_code == 409 and "not running" in again.json()["error"]
    resumed = await http.post(f"/api/runs/{waiting}/resume", json={})
    assert resumed.status_code == 200 and resumed.json()["state"] == "running"
    unknown = await http.post("/api/runs/999999/cancel", json={})
    assert unknown.status_code == 404 and "999999" in unknown.json()["error"]
    bad = await http.post(f"/api/runs/{waiting}/cancel", json={"force": True})
    assert bad.status_code == 422 and "force" in bad.json()["error"]
    no_name = await http.post(f"/api/runs/{waiting}/signal", json={"payload": 1})
    assert no_name.status_code == 422 and "name" in no_name.json()["error"]
    stranger = await http.post(f"/api/runs/{waiting}/signal", json={"name": "nope"})
    assert stranger.status_code == 422 and "nope" in stranger.json()["error"]
    not_json = await http.post(f"/api/runs/{waiting}/signal", content=b"{", headers=JSON)
    assert not_json.status_code == 422
    async with cyclone.Client(dsn) as client:
        assert (await client.get_run(waiting)).state.value == "running"  # nothing written
    form = await http.post(f"/api/runs/{waiting}/cancel", data={"x": "1"})
    assert form.status_code == 415
    cancelled = await http.post(f"/api/runs/{waiting}/cancel", json={})
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    assert cancelled.headers["x-cyclone-message"] == f"run {waiting} cancelled"


async def test_signal_through_the_api_completes_a_waiting_run(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    from tests.dashboard.conftest import echo, gate

    waiting = made["waiting"]
    async with cyclone.Client(dsn, workflows=[gate()], handlers=[echo]) as worker:
        sent = await http.post(
            f"/api/runs/{waiting}/signal", json={"name": "approve", "payload": {"ok": XSS}}
        )
        assert sent.status_code == 200
        done = await worker.wait(waiting, timeout=30)
    assert done.state.value == "completed" and done.result == {"ok": XSS}


async def test_retry_below_a_node_reopens_the_run(
    http: httpx.AsyncClient, dsn: str, made: dict[str, int]
) -> None:
    failed = made["failed"]
    bad_node = await http.post(f"/api/runs/{failed}/retry", json={"node": "zz"})
    assert bad_node.status_code == 422 and "zz" in bad_node.json()["error"]
    retried = await http.post(f"/api/runs/{failed}/retry", json={"node": "c"})
    assert retried.status_code == 200 and retried.json()["state"] == "running"
    async with cyclone.Client(dsn) as client:
        assert await step_state(client, failed, "c") == "available"
        assert await step_state(client, failed, "a") == "completed"


async def test_read_only_refuses_every_action(dsn: str, made: dict[str, int]) -> None:
    app: Starlette = create_app(dsn, read_only=True)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            for action in ("cancel", "pause", "retry"):
                refused = await http.post(f"/api/runs/{made['waiting']}/{action}", json={})
                assert refused.status_code == 403
            form = await http.get(f"/runs/{made['waiting']}/actions/cancel")
            assert form.status_code == 403
            page = (await http.get(f"/runs/{made['waiting']}")).text
            assert "/actions/" not in page and "read-only" in page
        async with cyclone.Client(dsn) as client:
            await run_until(client, made["waiting"], {"running"})
    finally:
        await app.state.backend.aclose()
