"""The dashboard's speed on a large history: server-side time of its pages.

``python -m bench.dashboard`` writes 1,000,000 runs and about 5,000,000 steps (and one
running 1,000-node run) into the database ``cyclone_bench_dashboard`` with set-based
SQL (:mod:`bench.dashboard_data`), unless it already holds them (``--rebuild`` writes
them again), then calls the dashboard's ASGI application in process: for each page,
3 warm-up requests, then ``--requests`` (default 20) timed ones, from the ASGI call to
the last byte of the response. It prints p50, p95 and max per page beside the
one-minute load average (the machine is shared: read the figures with it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import cyclone
from bench.dashboard_data import BIG_WORKFLOW, load
from bench.db import DEFAULT_ADMIN_DSN
from cyclone.dashboard import create_app

DATABASE = "cyclone_bench_dashboard"


def _dsn(admin: str, name: str) -> str:
    params = conninfo_to_dict(admin)
    params["dbname"] = name
    return make_conninfo("", **params)


def prepare(admin: str, runs: int, rebuild: bool) -> tuple[str, int]:
    """The bench database (built when missing, too small, or ``rebuild``) and the id
    of its big run."""
    dsn = _dsn(admin, DATABASE)
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
        if exists.fetchone() and not rebuild:
            with psycopg.connect(dsn, autocommit=True) as db:
                row = db.execute(
                    "SELECT (SELECT count(*) FROM cyclone_runs),"
                    " (SELECT id FROM cyclone_runs WHERE workflow = %s)",
                    (BIG_WORKFLOW,),
                ).fetchone()
            if row and row[0] >= runs and row[1]:
                print(f"using {DATABASE}: {row[0]:,} runs")
                return dsn, int(row[1])
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    cyclone.migrate(dsn)
    started = time.monotonic()
    with psycopg.connect(dsn, autocommit=True) as db:
        big = load(db, runs)
        steps = db.execute("SELECT count(*) FROM cyclone_steps").fetchone()
    print(
        f"wrote {runs:,} runs and {steps[0] if steps else 0:,} steps "
        f"in {time.monotonic() - started:.0f} s"
    )
    return dsn, big


async def call(app: Any, path: str) -> tuple[int, float]:
    """One GET through the ASGI interface: (status, seconds to the last byte)."""
    target, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": target,
        "raw_path": target.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"host", b"127.0.0.1:8484"), (b"accept", b"text/html")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8484),
    }
    status = 0
    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    start = time.perf_counter()
    await app(scope, receive, send)
    await done.wait()
    return status, time.perf_counter() - start


async def measure(dsn: str, big: int, requests: int) -> list[tuple[str, list[float]]]:
    """Timings per page (seconds)."""
    app = create_app(dsn)
    pages = [
        ("/", "/"),
        ("/runs", "/runs"),
        ("/runs?state=failed", "/runs?state=failed"),
        ("/runs (a day, 20 days ago)", None),
        ("/runs (before 10 days ago)", "WIDE"),
        (f"/runs/{big} (1,000 nodes)", f"/runs/{big}"),
        ("/api/runs", "/api/runs"),
        ("/queues", "/queues"),
        ("/kinds", "/kinds"),
        ("/workers", "/workers"),
    ]
    from datetime import UTC, datetime, timedelta

    day = datetime.now(UTC) - timedelta(days=20)
    ranged = f"/runs?since={day:%Y-%m-%dT%H:%M}&until={day + timedelta(days=1):%Y-%m-%dT%H:%M}"
    wide = f"/runs?until={datetime.now(UTC) - timedelta(days=10):%Y-%m-%dT%H:%M}"
    out = []
    try:
        for label, path in pages:
            target = wide if path == "WIDE" else path or ranged
            for _ in range(3):
                status, _ = await call(app, target)
                if status != 200:
                    raise RuntimeError(f"{target}: status {status}")
            times = [(await call(app, target))[1] for _ in range(requests)]
            out.append((label, times))
    finally:
        await app.state.backend.aclose()
    return out


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN; the bench's databases are made here"
    )
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--rebuild", action="store_true")
    args = parser.parse_args()
    dsn, big = prepare(args.dsn, args.runs, args.rebuild)
    results = asyncio.run(measure(dsn, big, args.requests))
    load1 = os.getloadavg()[0]
    print(f"\n{'page':<32} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}   load {load1:.2f}")
    for label, times in results:
        ms = [t * 1000 for t in times]
        print(f"{label:<32} {statistics.median(ms):8.1f} {p95(ms):8.1f} {max(ms):8.1f}")
    print(f"(one-minute load average at the end: {os.getloadavg()[0]:.2f}; 2 cores)")


if __name__ == "__main__":
    main()
