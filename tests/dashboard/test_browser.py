"""The dashboard in a real browser (Debian's Chromium, driven by Playwright).

Each test serves the dashboard with uvicorn on a free loopback port and runs a worker
beside it, then does what an operator would: finds a failed run from the overview,
checks the DAG's node states, retries it from the page and watches it complete
without reloading; pauses and resumes a run; sends the signal that completes a
waiting run; and checks that markup held in the database stays text, that the token
is asked for, and that another site's page cannot make the browser act.

Screenshots of every page, light and dark, are saved under ``artifacts/dashboard/``
(``$CYCLONE_ARTIFACTS`` overrides it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Dialog, Page, expect, sync_playwright
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

import cyclone
from cyclone.dashboard import create_app
from tests.dashboard.conftest import XSS, echo, gate
from tests.dashboard.live import CHROMIUM, CHROMIUM_ARGS, LiveServer, Worker
from tests.helpers import ROOT, poll_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and not os.environ.get("CI"),
        reason=f"no {CHROMIUM}: apt-get install chromium (.ci/run does; in CI this fails)",
    ),
]

ARTIFACTS = Path(os.environ.get("CYCLONE_ARTIFACTS", ROOT / "artifacts")) / "dashboard"
WAIT_MS = 30_000
FLAKY = {"fail": True}
"""While true, ``dash_flaky`` fails (a test flips it before retrying from the page)."""


@cyclone.step("dash_flaky", max_attempts=1)
async def flaky(ctx: cyclone.Context, inp: Any) -> Any:
    if FLAKY["fail"]:
        raise RuntimeError(f"flaky failure {XSS}")
    return {"ok": inp}


def pipeline() -> cyclone.Workflow:
    """load -> clean -> flaky -> report, and load -> report: a run that fails at
    ``flaky`` once ``clean`` completed."""
    wf = cyclone.Workflow("dash_pipeline")
    load = wf.node("load", echo)
    clean = wf.node("clean", echo, input_from=load)
    risky = wf.node("flaky", flaky, input_from=clean)
    wf.result(wf.node("report", echo, inputs=[load, risky]))
    return wf


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A 1280x800 page in a fresh context; any dialog (an ``alert`` an injected
    script would open) fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    dialogs: list[str] = []

    def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.set_default_timeout(WAIT_MS)
    yield tab
    context.close()
    assert dialogs == [], f"a script from the database ran: {dialogs}"


@pytest.fixture
def served(dsn: str) -> Iterator[tuple[LiveServer, Worker]]:
    """The dashboard on the test's database, and a worker for the test's workflows."""
    FLAKY["fail"] = True
    app = create_app(dsn)
    with (
        Worker(dsn, handlers=[echo, flaky], workflows=[pipeline(), gate()]) as worker,
        LiveServer(app) as server,
    ):
        yield server, worker


def shoot(page: Page, name: str) -> None:
    """Save a screenshot of ``page`` in light and dark themes."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        page.screenshot(path=str(ARTIFACTS / f"{name}-{scheme}.png"))
    page.emulate_media(color_scheme="light")


def node_states(page: Page) -> dict[str, str]:
    """The DAG's nodes as drawn: ``data-node`` -> ``data-state``."""
    found: dict[str, str] = page.eval_on_selector_all(
        "svg.dag [data-node]",
        "els => Object.fromEntries(els.map(e => [e.dataset.node, e.dataset.state]))",
    )
    return found


def test_a_failed_run_is_found_retried_and_watched_to_completion(
    served: tuple[LiveServer, Worker], page: Page
) -> None:
    server, worker = served
    sub = worker.call(lambda c: c.submit(pipeline(), {"day": "2026-12-02"}))
    failed = worker.call(lambda c: c.wait(sub, timeout=30))
    assert failed.state.value == "failed"
    page.goto(server.url + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    shoot(page, "overview")
    page.locator(f'a[href="/runs/{sub.run_id}"]').first.click()
    expect(page.locator("[data-run-state]")).to_have_attribute("data-run-state", "failed")
    assert node_states(page) == {
        "load": "completed",
        "clean": "completed",
        "flaky": "discarded",
        "report": "cancelled",
    }
    expect(page.locator(".run-error")).to_contain_text("<script>alert(1)</script>")
    shoot(page, "run-failed")
    page.locator("a.button", has_text="Retry").click()
    expect(page.locator("h1")).to_contain_text("Retry run")
    shoot(page, "confirm-retry")
    FLAKY["fail"] = False
    page.locator("#confirm-form button[type=submit]").click()
    expect(page.locator(".flash")).to_contain_text("reopened")
    # the page refreshes itself while the run runs: no reload here
    expect(page.locator("[data-run-state]")).to_have_attribute(
        "data-run-state", "completed", timeout=WAIT_MS
    )
    assert set(node_states(page).values()) == {"completed"}
    shoot(page, "run-completed")
    page.locator('a[href*="step?node=flaky"]').first.click()
    expect(page.locator("#output pre")).to_contain_text('"ok"')
    shoot(page, "step")


def test_pause_resume_and_a_signal_that_completes_the_run(
    served: tuple[LiveServer, Worker], page: Page
) -> None:
    server, worker = served
    sub = worker.call(lambda c: c.submit(gate(), {"note": "wait for me"}))
    page.goto(f"{server.url}/runs/{sub.run_id}")
    approve = page.locator('svg.dag [data-node="approve"]')
    expect(approve).to_have_attribute("data-state", "waiting_signal")
    expect(approve).to_contain_text("signal approve")
    page.locator("a.button", has_text="Pause").click()
    page.locator("#confirm-form button[type=submit]").click()
    expect(page.locator("[data-run-state]")).to_have_attribute("data-run-state", "paused")
    expect(page.locator(".flash")).to_have_text(f"run {sub.run_id} paused")
    page.locator("a.button", has_text="Resume").click()
    page.locator("#confirm-form button[type=submit]").click()
    expect(page.locator("[data-run-state]")).to_have_attribute("data-run-state", "running")
    page.locator("a.button", has_text="Signal").click()
    page.fill("input[name=name]", "approve")
    page.fill("textarea[name=payload]", "{not json")
    page.locator("#confirm-form button[type=submit]").click()
    expect(page.locator(".flash.error")).to_contain_text("is not JSON")
    page.fill("textarea[name=payload]", '{"approved": true}')
    shoot(page, "confirm-signal")
    page.locator("#confirm-form button[type=submit]").click()
    expect(page.locator("[data-run-state]")).to_have_attribute(
        "data-run-state", "completed", timeout=WAIT_MS
    )
    done = worker.call(lambda c: c.get_run(sub.run_id))
    assert done.result == {"approved": True}


def test_markup_from_the_database_stays_text(served: tuple[LiveServer, Worker], page: Page) -> None:
    server, worker = served
    sub = worker.call(lambda c: c.submit(pipeline(), {"html": XSS}, submit_key=XSS))
    worker.call(lambda c: c.wait(sub, timeout=30))
    for path in (
        "/",
        "/runs",
        f"/runs/{sub.run_id}",
        f"/runs/{sub.run_id}/step?node=flaky",
        f"/runs/{sub.run_id}/step?node=load",
    ):
        page.goto(server.url + path)
        expect(page.locator("main")).to_contain_text("<script>alert(1)</script>")
        assert page.locator("main img").count() == 0
        assert page.locator("main script").count() == 0
    shoot(page, "step-xss")
    for name, path in (
        ("runs", "/runs"),
        ("queues", "/queues"),
        ("kinds", "/kinds"),
        ("schedules", "/schedules"),
        ("workers", "/workers"),
    ):
        page.goto(server.url + path)
        shoot(page, name)


def test_the_token_is_asked_for(dsn: str, page: Page) -> None:
    app = create_app(dsn, token="browser-token")
    with LiveServer(app) as server:
        page.goto(server.url + "/runs")
        expect(page.locator("h1")).to_have_text("Log in")
        shoot(page, "login")
        page.fill("input[name=token]", "wrong")
        page.locator("button[type=submit]").click()
        expect(page.locator(".flash.error")).to_be_visible()
        page.fill("input[name=token]", "browser-token")
        page.locator("button[type=submit]").click()
        expect(page.locator("h1")).to_have_text("Runs")
        assert re.search(r"/runs$", page.url)


def test_another_site_cannot_make_the_browser_act(
    served: tuple[LiveServer, Worker], page: Page
) -> None:
    server, worker = served
    sub = worker.call(lambda c: c.submit(gate(), {}))
    target = f"{server.url}/runs/{sub.run_id}/actions/cancel"
    api = f"{server.url}/api/runs/{sub.run_id}/cancel"

    async def evil(request: Any) -> HTMLResponse:
        return HTMLResponse(
            f"""<!doctype html><body><p id="status">start</p>
            <form id="f" method="post" action="{target}"><input name="csrf" value="x"></form>
            <script>
            fetch("{api}", {{method: "POST", mode: "no-cors", body: "{{}}"}})
              .then(() => {{ document.getElementById("status").textContent = "sent"; }},
                    () => {{ document.getElementById("status").textContent = "sent"; }});
            </script></body>"""
        )

    with LiveServer(Starlette(routes=[Route("/", evil)])) as other:
        page.goto(other.url + "/")
        expect(page.locator("#status")).to_have_text("sent")
        with page.expect_navigation():
            page.evaluate("document.getElementById('f').submit()")
        expect(page.locator("body")).to_contain_text("cross-origin request")
    assert worker.call(lambda c: c.get_run(sub.run_id)).state.value == "running"


def test_a_queue_is_paused_and_resumed_from_the_queues_page(
    served: tuple[LiveServer, Worker], page: Page
) -> None:
    server, worker = served
    sub = worker.call(lambda c: c.submit(gate(), {}))  # its signal wait lists the queue

    async def waiting(c: cyclone.Client) -> bool:
        return any(s.state.value == "waiting_signal" for s in await c.list_steps(sub.run_id))

    poll_until(lambda: worker.call(waiting), what="the signal wait")
    page.goto(server.url + "/queues")
    queue = page.locator('tr[data-queue="default"]')
    expect(queue).to_have_attribute("data-paused", "false")
    queue.locator("button[data-queue-action=pause]").click()
    expect(page.locator(".flash")).to_have_text("queue 'default' paused")
    expect(queue).to_have_attribute("data-paused", "true")
    assert worker.call(lambda c: c.stats())["default"].paused
    shoot(page, "queues-paused")
    queue.locator("button[data-queue-action=resume]").click()
    expect(page.locator(".flash")).to_have_text("queue 'default' resumed")
    expect(queue).to_have_attribute("data-paused", "false")
    job = worker.call(lambda c: c.enqueue("dash_echo", {"after": "resume"}))
    assert worker.call(lambda c: c.wait(job, timeout=30)).state.value == "completed"
