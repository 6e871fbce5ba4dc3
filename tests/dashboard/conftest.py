"""Fixtures of the dashboard's tests: the application on the test's database, an HTTP
client that calls it in process, and runs made by a real worker.

``XSS`` holds markup that must never run: a step fails with it as its error, and a run
carries it as input, so every page that shows them is checked to show it as text.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import cyclone
from cyclone.dashboard import create_app

XSS = '<script>alert(1)</script> "><img src=x onerror=alert(2)>'
"""Markup a step error and a run input carry: shown as text, it never runs."""
BASE = "http://127.0.0.1:8484"


@cyclone.step("dash_echo")
async def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("dash_boom", max_attempts=1)
async def boom(ctx: cyclone.Context, inp: Any) -> Any:
    raise RuntimeError(XSS)


def flow() -> cyclone.Workflow:
    """a -> (b, c fails, items fan-out) -> approve (signal, after b) -> d."""
    wf = cyclone.Workflow("dash_flow")
    a = wf.node("a", echo)
    b = wf.node("b", echo, input_from=a)
    c = wf.node("c", boom, input_from=a)
    items = wf.fan_out("items", echo, over=a)
    approve = wf.wait_signal("approve", after=[b])
    wf.result(wf.node("d", echo, inputs=[b, c, items], after=[approve]))
    return wf


def gate() -> cyclone.Workflow:
    """start -> approve (signal) -> done: a run that waits until signalled."""
    wf = cyclone.Workflow("dash_gate")
    start = wf.node("start", echo)
    approve = wf.wait_signal("approve", after=[start])
    wf.result(wf.node("done", echo, input_from=approve))
    return wf


async def run_until(client: cyclone.Client, run_id: int, states: set[str]) -> None:
    """Poll until run ``run_id`` is in one of ``states`` (30 s at most)."""
    for _ in range(1500):
        if (await client.get_run(run_id)).state.value in states:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"run {run_id} never reached {states}")


async def step_state(client: cyclone.Client, run_id: int, node: str) -> str:
    """The state of one step of a run."""
    steps = {s.node: s.state.value for s in await client.list_steps(run_id)}
    return steps[node]


@pytest.fixture
async def made(dsn: str) -> dict[str, int]:
    """Runs made by a real worker: a failed ``dash_flow`` (XSS input and error), a
    ``dash_gate`` waiting for its signal, and a completed job."""
    wf, gt = flow(), gate()
    async with cyclone.Client(dsn, workflows=[wf, gt], handlers=[echo]) as client:
        failed = await client.submit(wf, [1, 2, 3], submit_key=XSS)
        waiting = await client.submit(gt, {"note": XSS})
        job = await client.enqueue("dash_echo", {"big": "x" * 30_000})
        await client.wait(failed, timeout=30)
        await client.wait(job, timeout=30)
        for _ in range(1500):
            steps = {s.node: s.state.value for s in await client.list_steps(waiting.run_id)}
            if steps.get("approve") == "waiting_signal":
                break
            await asyncio.sleep(0.02)
    return {"failed": failed.run_id, "waiting": waiting.run_id, "job": job.run_id}


@pytest.fixture
async def app(dsn: str) -> AsyncIterator[Starlette]:
    """The dashboard on the test's database, with no token."""
    application = create_app(dsn)
    yield application
    await application.state.backend.aclose()


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that calls :func:`app` in process, as a browser on loopback."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


def csrf_of(page: str) -> str:
    """The CSRF token of a page's forms."""
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "the page has no CSRF token"
    return found.group(1)
