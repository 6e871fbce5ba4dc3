"""cyclone.contrib.asgi.lifespan, and the FastAPI example service that uses it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest
from starlette.applications import Starlette

import cyclone
from cyclone.contrib.asgi import lifespan
from tests.helpers import apoll_until, scalar

ROOT = Path(__file__).resolve().parents[2]


@cyclone.step("asgi_double")
async def double(ctx: cyclone.Context, inp: int) -> int:
    return inp * 2


async def test_the_client_runs_with_the_application(dsn: str) -> None:
    client = cyclone.Client(dsn, handlers=[double])
    app = Starlette()
    async with lifespan(client)(app):
        assert client.engine is not None  # started, with its workers
        job = await client.enqueue(double, 21)
        run = await client.wait(job, timeout=30)
        assert run.result == 42
    assert client.engine is None  # stopped with the application


async def test_the_dashboard_is_mounted_for_the_applications_lifetime(dsn: str) -> None:
    client = cyclone.Client(dsn)
    app = Starlette()
    async with lifespan(client, dashboard="/ops/cyclone")(app):
        job = await client.enqueue("asgi_double", 1)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            page = await http.get("/ops/cyclone/runs")
            assert page.status_code == 200
            assert f"/ops/cyclone/runs/{job.run_id}" in page.text
            api = await http.get(f"/ops/cyclone/api/runs/{job.run_id}")
            assert api.status_code == 200
            assert str(job.run_id) in api.text
    assert app.router.routes == []  # unmounted at shutdown
    async with lifespan(client, dashboard="/ops/cyclone")(app):  # a restart mounts it once
        assert len(app.router.routes) == 1


@pytest.mark.parametrize("bad", ["cyclone", "/", "", "//"])
async def test_a_bad_dashboard_path_is_refused_before_anything_starts(dsn: str, bad: str) -> None:
    client = cyclone.Client(dsn, handlers=[double])
    with pytest.raises(cyclone.ValidationError, match="dashboard must be a path prefix"):
        lifespan(client, dashboard=bad)
    assert client.engine is None


def _load_example(monkeypatch: pytest.MonkeyPatch, dsn: str) -> ModuleType:
    """examples/fastapi_service.py, imported afresh with ``CYCLONE_DSN`` = ``dsn``."""
    monkeypatch.setenv("CYCLONE_DSN", dsn)
    name = "fastapi_service_under_test"
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "fastapi_service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


async def test_the_example_service_enqueues_in_the_requests_transaction(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = _load_example(monkeypatch, dsn)
    app: Any = service.app
    async with service.service_lifespan(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            made = await http.post("/orders", json={"item": "tea", "amount": 3})
            assert made.status_code == 201, made.text
            order_id, run_id = made.json()["order_id"], made.json()["run_id"]

            async def confirmed() -> bool:
                return bool((await http.get(f"/orders/{order_id}")).json()["confirmed"])

            await apoll_until(confirmed, timeout=30)
            run = await service.client.get_run(run_id)
            assert run.state == cyclone.RunState.COMPLETED

            refused = await http.post("/orders", json={"item": "tea", "amount": -1})
            assert refused.status_code == 422
            assert "amount must be positive" in refused.text
            assert (await http.get("/orders/1")).status_code == 200
            dashboard = await http.get(f"/cyclone/runs/{run_id}")
            assert dashboard.status_code == 200
    with psycopg.connect(dsn) as conn:
        # the refused order and its run rolled back together: one order, one run
        assert scalar(conn, "SELECT count(*) FROM orders") == 1
        assert scalar(conn, "SELECT count(*) FROM cyclone_runs") == 1
