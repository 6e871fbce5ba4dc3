"""Waiting without sleeping blindly, and worker processes for crash tests."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cyclone.transitions import Claimed

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def poll_until(
    check: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.02, what: str = ""
) -> T:
    """Call ``check`` until it returns something truthy; that value. Fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(interval)


async def apoll_until(
    check: Callable[[], Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.02,
    what: str = "",
) -> T:
    """Async :func:`poll_until`."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        await asyncio.sleep(interval)


def scalar(conn: psycopg.Connection[Any], query: Any, params: Any = None) -> Any:
    """The first column of the first row of ``query``."""
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def set_database_timezone(dsn: str, zone: str) -> str:
    """Make every new session on ``dsn``'s database run in time zone ``zone`` (as a
    server whose ``timezone`` initdb took from the machine); ``dsn``."""
    name = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET timezone = {}").format(
                sql.Identifier(str(name)), sql.Literal(zone)
            )
        )
    return dsn


def start_worker(
    app: str,
    env: Mapping[str, str],
    *,
    log_level: str = "WARNING",
    netns: str | None = None,
    args: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Start ``cyclone worker APP [ARGS]`` in a new process (its own process group),
    inside the network namespace ``netns`` if given (``ip netns exec`` execs, so the pid
    is the worker's).

    Its log goes to a temporary file, ``proc.log_path``, so a full pipe never blocks it.
    """
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT)}
    log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, kept on disk
        prefix="cyclone-worker-", suffix=".log", delete=False
    )
    with log_file:
        prefix = ["ip", "netns", "exec", netns] if netns is not None else []
        proc = subprocess.Popen(
            [
                *prefix,
                *(sys.executable, "-m", "cyclone", "--log-level", log_level, "worker", app),
                *args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc.log_path = log_file.name  # type: ignore[attr-defined]
    return proc


def worker_log(proc: subprocess.Popen[bytes]) -> str:
    """What a worker process printed so far."""
    return Path(proc.log_path).read_text(errors="replace")  # type: ignore[attr-defined]


def kill(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to the process; reap it when it is SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(sig)
    if sig == signal.SIGKILL:
        proc.wait(timeout=30)


def held_step(
    step_id: int,
    run_id: int,
    *,
    owner: str = "w/1",
    generation: int = 1,
    node: str = "k",
    kind: str = "k",
    def_version: str = "job",
    workflow: str = "k",
    queue: str = "default",
) -> Claimed:
    """A :class:`Claimed` record of a step a test put in ``running`` by hand, as a worker
    that claimed it as ``owner`` with lease ``generation`` would hold it."""
    return Claimed(
        id=step_id,
        run_id=run_id,
        node=node,
        kind=kind,
        input=None,
        attempt=0,
        max_attempts=5,
        generation=generation,
        timeout=None,
        sequence_key=None,
        workflow=workflow,
        def_version=def_version,
        queue=queue,
        owner=owner,
    )
