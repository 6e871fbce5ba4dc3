"""Prometheus metrics on real work: a worker's counters equal what the database recorded
(in process, and for the survivor of two worker processes after the other is
SIGKILLed), the worker gauges, the database gauges (cached for ``max_age``, and
``cyclone_database_up 0`` when the database cannot be read), the endpoint's token, the
dashboard's ``/metrics`` and the Grafana dashboard's metric names.

Scrapes go over HTTP and are parsed with ``prometheus_client``'s own parser.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import cyclone
from cyclone.dashboard import create_app
from cyclone.dbio import fetch_sync
from cyclone.errors import ConfigurationError
from cyclone.observability import register_metrics
from cyclone.observability.collectors import DatabaseCollector
from cyclone.observability.metrics import (
    DATABASE_GAUGES,
    EXPORTED,
    STEP_COUNTERS,
    STEP_HISTOGRAMS,
    WORKER_GAUGES,
    register_database_metrics,
)
from cyclone.observability.serve import start_metrics_server
from cyclone.transitions import claim_stmt
from tests.helpers import ROOT, kill, poll_until, scalar, start_worker

FAST_RETRY = cyclone.RetryPolicy(base=0.01, factor=1.0, cap=0.01, jitter=0.0)
UNREACHABLE = "postgresql://root@127.0.0.1:1/nowhere"
"""A DSN nothing listens at: every connection is refused at once."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@cyclone.step("m_ok")
async def ok(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.step("m_flaky", max_attempts=3, retry=FAST_RETRY)
async def flaky(ctx: cyclone.Context, inp: Any) -> int:
    if ctx.attempt < 2:
        raise RuntimeError(f"failure {ctx.attempt}")
    return ctx.attempt


@cyclone.step("m_spent", max_attempts=2, retry=FAST_RETRY)
def spent(ctx: cyclone.Context, inp: Any) -> None:
    raise ValueError("always")


@cyclone.action("m_discard")
async def discard(ctx: cyclone.Context, inp: Any) -> None:
    raise cyclone.Discard("not worth retrying")


KINDS = [ok, flaky, spent, discard]


def scrape(url: str, token: str | None = None) -> str:
    """The body of ``GET url`` (with a bearer token if given)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        body: bytes = r.read()
    return body.decode()


def parse(text: str) -> Samples:
    """Every sample of an exposition: ``(name, labels) -> value``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0: none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


async def test_counters_equal_what_the_database_recorded(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """200 jobs: completed, retried then completed, discarded when attempts are spent
    and by Discard. Completed = completed steps, failed = the attempts the steps'
    ``attempt`` column counts, discarded = discarded steps, claimed = completed +
    failed, for every kind; each execution is one duration and one latency."""
    registry = CollectorRegistry()
    client = cyclone.Client(dsn, handlers=KINDS, poll_interval=0.2, lease_ttl=5)
    assert register_metrics(client, registry) is registry
    assert register_metrics(client, registry) is registry  # again: nothing more
    plan = {"m_ok": 120, "m_flaky": 40, "m_spent": 20, "m_discard": 20}
    with start_metrics_server(registry, port=0) as server:
        async with client:
            for kind, n in plan.items():
                await client.enqueue_many(kind, list(range(n)))
            await asyncio.to_thread(
                poll_until,
                lambda: (
                    scalar(db, "SELECT count(*) FROM cyclone_runs WHERE finished_at IS NULL") == 0
                ),
                timeout=120,
                what="every run to finish",
            )
            live = parse(await asyncio.to_thread(scrape, server.url))
            assert value(live, "cyclone_worker_slots", queue="default") == client.queues["default"]
            assert value(live, "cyclone_worker_listener_connected") == 1
        stopped = parse(await asyncio.to_thread(scrape, server.url))  # every outcome reported
    rows = db.execute(
        "SELECT kind, count(*) FILTER (WHERE state = 'completed'),"
        " count(*) FILTER (WHERE state = 'discarded'), sum(attempt), sum(reclaims)"
        " FROM cyclone_steps GROUP BY kind"
    ).fetchall()
    assert {row[0] for row in rows} == set(plan)
    for kind, completed, discarded, attempts, reclaims in rows:
        labels = {"kind": kind, "queue": "default"}
        assert reclaims == 0
        assert value(stopped, "cyclone_steps_completed_total", **labels) == completed, kind
        assert value(stopped, "cyclone_steps_discarded_total", **labels) == discarded, kind
        assert value(stopped, "cyclone_steps_failed_total", **labels) == attempts, kind
        claimed = value(stopped, "cyclone_steps_claimed_total", **labels)
        assert claimed == completed + attempts, kind
        assert value(stopped, "cyclone_step_duration_seconds_count", **labels) == claimed
        assert value(stopped, "cyclone_step_queue_latency_seconds_count", **labels) == claimed
    assert value(stopped, "cyclone_steps_completed_total") == 160
    assert value(stopped, "cyclone_steps_discarded_total") == 40
    assert value(stopped, "cyclone_steps_failed_total") == 40 * 2 + 20 * 2 + 20
    assert value(stopped, "cyclone_steps_reclaimed_total") == 0
    # Stopped: no slot series, nothing held, not listening.
    assert "cyclone_worker_slots" not in names(stopped)
    assert value(stopped, "cyclone_worker_leases_held") == 0
    assert value(stopped, "cyclone_worker_listener_connected") == 0
    assert {v for _, labels in stopped for k, v in labels if k == "kind"} == set(plan)


async def test_two_clients_in_one_registry_add_up(dsn: str) -> None:
    registry = CollectorRegistry()
    first = cyclone.Client(dsn, handlers=[ok], queues={"default": 3}, poll_interval=0.2)
    second = cyclone.Client(dsn, handlers=[ok], queues={"default": 4}, poll_interval=0.2)
    register_metrics(first, registry)
    register_metrics(second, registry)
    register_metrics(first, registry)
    async with first, second:
        await second.wait(await first.enqueue(ok, 1), timeout=30)
        with start_metrics_server(registry, port=0) as server:
            got = parse(await asyncio.to_thread(scrape, server.url))
    assert value(got, "cyclone_worker_slots", queue="default") == 7
    assert value(got, "cyclone_steps_claimed_total", kind="m_ok") == 1  # counted once
    assert list(first.observers) == list(second.observers)  # one shared observer


def test_without_prometheus_client_a_configuration_error_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, dsn: str
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigurationError, match=r"prometheus extra"):
        register_metrics(cyclone.Client(dsn, handlers=[ok]))
    with pytest.raises(ConfigurationError, match=r"prometheus extra"):
        register_database_metrics(dsn)
    with pytest.raises(ConfigurationError, match=r"prometheus extra"):
        start_metrics_server(CollectorRegistry(), port=0)


def test_importing_cyclone_imports_no_prometheus_client() -> None:
    code = (
        "import sys, cyclone, cyclone.observability, cyclone.observability.metrics;"
        "print(any(m.startswith('prometheus_client') for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# -- the database gauges ------------------------------------------------------------------


def _database_work(dsn: str, db: psycopg.Connection[Any]) -> None:
    """Available steps in two queues (one only scheduled later), two running (one lease
    expired), a step waiting on a timer, and schedules: one overdue, one disabled and
    overdue, one on time."""
    nap = cyclone.Workflow("m_nap")
    later = nap.sleep("nap", timedelta(hours=1))
    nap.node("after", ok, after=[later])
    with cyclone.SyncClient(dsn, handlers=[ok]) as producer:
        producer.enqueue_many(ok, [1, 2, 3, 4], queue="alpha")
        producer.enqueue_many(ok, [5, 6], queue="beta", scheduled_at=timedelta(hours=1))
        producer.submit(nap, None)
        for name in ("late", "off", "fine"):
            producer.create_schedule(name, ok, None, "*/5 * * * *")
    stmt = claim_stmt(queue="alpha", kinds=["m_ok"], owner="test/1", ttl=60, limit=2)
    assert len(fetch_sync(db, stmt)) == 2
    db.execute(
        "UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second'"
        " WHERE id = (SELECT min(id) FROM cyclone_steps WHERE state = 'running')"
    )
    db.execute(
        "UPDATE cyclone_schedules SET next_run_at = now() - interval '10 minutes'"
        " WHERE id IN ('late', 'off')"
    )
    db.execute("UPDATE cyclone_schedules SET enabled = false WHERE id = 'off'")


def test_database_gauges_equal_the_view(dsn: str, db: psycopg.Connection[Any]) -> None:
    _database_work(dsn, db)
    before = dict(db.execute("SELECT queue, oldest_available_age FROM cyclone_v_queues"))
    registry = register_database_metrics(dsn, CollectorRegistry(), max_age=0)
    with start_metrics_server(registry, port=0) as server:
        got = parse(scrape(server.url))
    view = db.execute(
        "SELECT queue, available, running, waiting, oldest_available_age, expired_leases"
        " FROM cyclone_v_queues"
    ).fetchall()
    assert value(got, "cyclone_database_up") == 1
    assert {dict(labels)["queue"] for name, labels in got if name == "cyclone_queue_running"} == {
        row[0] for row in view
    }
    for queue, available, running, waiting, oldest, expired in view:
        assert value(got, "cyclone_queue_available", queue=queue) == available
        assert value(got, "cyclone_queue_running", queue=queue) == running
        assert value(got, "cyclone_queue_waiting", queue=queue) == waiting
        assert value(got, "cyclone_queue_expired_leases", queue=queue) == expired
        seen = value(got, "cyclone_queue_oldest_available_seconds", queue=queue)
        if oldest is None:
            assert seen == 0
        else:  # read between the two reads of the view
            assert before[queue].total_seconds() <= seen <= oldest.total_seconds()
    assert value(got, "cyclone_queue_available", queue="alpha") == 2
    assert value(got, "cyclone_queue_running", queue="alpha") == 2
    assert value(got, "cyclone_queue_expired_leases", queue="alpha") == 1
    assert value(got, "cyclone_queue_oldest_available_seconds", queue="beta") == 0
    assert value(got, "cyclone_queue_waiting") >= 1
    assert value(got, "cyclone_schedules_overdue") == 1
    assert not {n for n in names(got) if n.startswith(("cyclone_worker", "cyclone_steps"))}


def _collect(collector: DatabaseCollector) -> Samples:
    registry = CollectorRegistry()
    registry.register(collector)
    from prometheus_client import generate_latest

    return parse(generate_latest(registry).decode())


def test_a_read_serves_every_scrape_for_max_age(dsn: str, db: psycopg.Connection[Any]) -> None:
    """Scrapes within ``max_age`` (eight at once included) share one read: a step
    enqueued after it does not show, and no further read is made; with ``max_age=0``
    each scrape reads."""
    cached = DatabaseCollector(dsn, max_age=3600)
    registry = CollectorRegistry()
    registry.register(cached)
    assert cached.reads == 0  # registering reads nothing
    with start_metrics_server(registry, port=0) as server:
        bodies: list[str] = []
        threads = [
            threading.Thread(target=lambda: bodies.append(scrape(server.url))) for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(bodies) == 8 and cached.reads == 1
        with cyclone.SyncClient(dsn) as producer:
            producer.enqueue("m_ok", 1, queue="gamma")
        got = parse(scrape(server.url))
    assert cached.reads == 1
    assert value(got, "cyclone_database_up") == 1
    assert value(got, "cyclone_queue_available", queue="gamma") == 0  # not read again
    fresh = DatabaseCollector(dsn, max_age=0)
    assert value(_collect(fresh), "cyclone_queue_available", queue="gamma") == 1
    _collect(fresh)
    assert fresh.reads == 2


def test_an_unreachable_database_is_a_gauge_not_an_error() -> None:
    collector = DatabaseCollector(UNREACHABLE, max_age=3600)
    registry = CollectorRegistry()
    registry.register(collector)
    with start_metrics_server(registry, port=0) as server:
        first = parse(scrape(server.url))
        again = parse(scrape(server.url))
    for got in (first, again):
        assert value(got, "cyclone_database_up") == 0
        assert names(got) == {"cyclone_database_up"}
    assert collector.reads == 1  # the failure is cached too: no connection per scrape
    via_register = register_database_metrics(UNREACHABLE, CollectorRegistry())
    with start_metrics_server(via_register, port=0) as server:
        assert value(parse(scrape(server.url)), "cyclone_database_up") == 0


# -- the endpoint -------------------------------------------------------------------------


def test_a_non_loopback_address_needs_a_token() -> None:
    for host in ("0.0.0.0", "::", "192.0.2.10", "127.example.com"):
        with pytest.raises(ConfigurationError, match=re.escape(repr(host))):
            start_metrics_server(CollectorRegistry(), host=host, port=0)
        with pytest.raises(ConfigurationError, match=re.escape(repr(host))):
            start_metrics_server(CollectorRegistry(), host=host, port=0, token="")


def _status(port: int, path: str, authorization: bytes | None) -> tuple[int, str | None]:
    """The status and ``WWW-Authenticate`` of ``GET path`` with these header bytes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", path)
        if authorization is not None:
            conn.putheader("Authorization", authorization)
        conn.endheaders()
        answer = conn.getresponse()
        answer.read()
        return answer.status, answer.getheader("WWW-Authenticate")
    finally:
        conn.close()


def test_with_a_token_only_its_bearer_is_served() -> None:
    """Bound to every address behind a token: no header, another token or another
    scheme is 401; the token (UTF-8, as the dashboard takes it) is 200; another path
    is 404."""
    token = "s3cret-tøken"
    registry = CollectorRegistry()
    with start_metrics_server(registry, host="0.0.0.0", port=0, token=token) as server:
        port = server.port
        for sent in (None, b"Bearer wrong", b"Basic " + token.encode(), b"Bearer "):
            assert _status(port, "/metrics", sent) == (401, "Bearer"), sent
        assert _status(port, "/metrics", b"Bearer " + token.encode())[0] == 200
        assert _status(port, "/metrics", b"bearer  " + token.encode())[0] == 200
        assert _status(port, "/other", b"Bearer " + token.encode())[0] == 404


# -- the dashboard ------------------------------------------------------------------------


async def _get(app: Any, path: str, **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8484") as c:
        return await c.get(path, headers=headers)


async def test_the_dashboard_serves_the_database_gauges(
    dsn: str, db: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    _database_work(dsn, db)
    open_app, guarded = create_app(dsn), create_app(dsn, token="dash-token")
    try:
        answer = await _get(open_app, "/metrics")
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
        got = parse(answer.text)
        assert value(got, "cyclone_database_up") == 1
        assert value(got, "cyclone_queue_running", queue="alpha") == 2
        assert value(got, "cyclone_schedules_overdue") == 1
        assert not {n for n in names(got) if n.startswith(("cyclone_worker", "cyclone_steps"))}
        refused = await _get(guarded, "/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        allowed = await _get(guarded, "/metrics", authorization="Bearer dash-token")
        assert allowed.status_code == 200
        assert value(parse(allowed.text), "cyclone_database_up") == 1
    finally:
        await open_app.state.backend.aclose()
        await guarded.state.backend.aclose()
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    bare = create_app(dsn)
    try:
        missing = await _get(bare, "/metrics")
    finally:
        await bare.state.backend.aclose()
    assert missing.status_code == 501 and "prometheus extra" in missing.text


# -- the Grafana dashboard ----------------------------------------------------------------


def _exprs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, item in node.items():
            if key in ("expr", "query") and isinstance(item, str):
                yield item
            else:
                yield from _exprs(item)
    elif isinstance(node, list):
        for item in node:
            yield from _exprs(item)


def test_the_grafana_dashboard_uses_only_metrics_we_export() -> None:
    board = json.loads((ROOT / "docs" / "grafana-cyclone.json").read_text())
    used = {name for expr in _exprs(board) for name in re.findall(r"\bcyclone_\w+", expr)}
    assert used and used <= EXPORTED, sorted(used - EXPORTED)
    families = [*STEP_COUNTERS, *STEP_HISTOGRAMS, *WORKER_GAUGES, *DATABASE_GAUGES]
    assert [f for f in families if not any(u.startswith(f) for u in used)] == []
    variables = board["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)


# -- a worker killed mid-run --------------------------------------------------------------


def _announced(path: Path) -> dict[str, Any]:
    """What a metered worker wrote to ``path`` once its metrics server listened."""

    def read() -> str:
        return path.read_text() if path.exists() else ""

    found: dict[str, Any] = json.loads(poll_until(read, what=f"{path.name} to be written"))
    return found


@pytest.mark.slow  # two worker processes
def test_the_survivor_of_a_sigkill_counts_what_it_completed(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """300 jobs, two worker processes serving metrics; one SIGKILLed while it holds
    steps. When every run is completed, the survivor's completed counter equals the
    steps its completion transactions recorded (``done_by``; a completed step keeps no
    lease owner), and its sweep reclaimed the victim's steps."""
    db.execute("CREATE TABLE done_by (step_id bigint, owner text)")
    with cyclone.SyncClient(dsn) as producer:
        producer.enqueue_many("metered_write", [{}] * 300)
    files = [tmp_path / "victim.json", tmp_path / "survivor.json"]
    env = {"CYCLONE_TEST_APP_DSN": dsn, "CYCLONE_TEST_TTL": "2", "CYCLONE_TEST_WORK": "0.1"}
    workers = [
        start_worker("tests.apps.metered:client", {**env, "CYCLONE_TEST_METRICS_FILE": str(f)})
        for f in files
    ]
    try:
        victim, survivor = (_announced(f) for f in files)
        poll_until(
            lambda: (
                scalar(
                    db,
                    "SELECT count(*) FROM cyclone_steps WHERE state = 'running'"
                    " AND lease_owner LIKE %s",
                    (victim["owner"] + "/%",),
                )
                and scalar(db, "SELECT count(*) FROM done_by WHERE owner = %s", (victim["owner"],))
            ),
            timeout=120,
            interval=0.01,
            what="the victim to complete a step and hold others",
        )
        kill(workers[0])
        poll_until(
            lambda: (
                scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == 300
            ),
            timeout=240,
            interval=0.2,
            what="all 300 runs to complete",
        )
        url = f"http://127.0.0.1:{survivor['port']}/metrics"
        recorded = scalar(db, "SELECT count(*) FROM done_by WHERE owner = %s", (survivor["owner"],))

        def counted() -> Samples | None:
            got = parse(scrape(url))
            completed = value(got, "cyclone_steps_completed_total")
            assert completed <= recorded  # never a completion it did not commit
            return got if completed == recorded else None

        got = poll_until(counted, what="the survivor to count its last completion")
        assert got is not None
    finally:
        for proc in workers:
            kill(proc)
    assert scalar(db, "SELECT count(*) FROM done_by") == 300
    assert scalar(db, "SELECT count(DISTINCT step_id) FROM done_by") == 300
    reclaims = scalar(db, "SELECT sum(reclaims) FROM cyclone_steps")
    assert 1 <= value(got, "cyclone_steps_reclaimed_total", kind="metered_write") <= reclaims
    assert value(got, "cyclone_steps_failed_total") == 0
    assert value(got, "cyclone_steps_claimed_total") >= recorded
    assert value(got, "cyclone_worker_slots", queue="default") == 5
