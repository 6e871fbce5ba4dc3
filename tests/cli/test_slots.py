"""``cyclone worker --slots N --queue NAME=SLOTS``: a worker process runs as many steps
at once as the slots asked for, and bad values are refused before anything starts."""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

import cyclone
from tests.cli.test_cli import run_cli
from tests.helpers import kill, poll_until, scalar, start_worker, worker_log

pytestmark = pytest.mark.slow  # each test runs the `cyclone` command in a process

APP = "tests.apps.hold:client"  # serves default and c with 2 slots each, not b


def running(db: psycopg.Connection[Any]) -> dict[str, int]:
    rows = db.execute(
        "SELECT queue, count(*) FROM cyclone_steps WHERE state = 'running' GROUP BY queue"
    ).fetchall()
    return dict(rows)


def held_jobs(dsn: str, db: psycopg.Connection[Any], counts: dict[str, int]) -> None:
    """Enqueue ``hold`` steps, so many per queue, each waiting for a lock ``db`` holds."""
    key = 0
    with cyclone.SyncClient(dsn) as producer:
        for queue, count in counts.items():
            keys = range(key, key + count)
            for k in keys:
                db.execute("SELECT pg_advisory_lock(%s)", (k,))
            producer.enqueue_many("hold", [{"key": k} for k in keys], queue=queue)
            key += count


def holds_exactly(
    dsn: str, db: psycopg.Connection[Any], args: list[str], expected: dict[str, int]
) -> None:
    """A worker started with ``args`` fills exactly ``expected`` slots per queue, keeps
    to them when a step ends and another takes its slot, and drains on SIGTERM."""
    backlog = {queue: slots + 3 for queue, slots in expected.items()} | {"unserved": 3}
    held_jobs(dsn, db, backlog)
    proc = start_worker(APP, {"CYCLONE_TEST_APP_DSN": dsn}, log_level="INFO", args=args)
    try:
        # A claim takes all the free slots at once, so a queue given more slots than
        # asked would pass straight over the expected count: wait for it, then compare.
        poll_until(
            lambda: all(running(db).get(q, 0) >= n for q, n in expected.items()),
            what=f"{expected} running steps",
        )
        assert running(db) == expected, worker_log(proc)
        # Let one step of each queue end: the freed slot takes one more, never two.
        for queue in expected:
            key = scalar(  # a job's input is its run's
                db,
                "SELECT (r.input->>'key')::int FROM cyclone_steps s JOIN cyclone_runs r "
                "ON r.id = s.run_id WHERE s.state = 'running' AND s.queue = %s LIMIT 1",
                (queue,),
            )
            db.execute("SELECT pg_advisory_unlock(%s)", (key,))
        completed = "SELECT count(*) FROM cyclone_steps WHERE state = 'completed'"
        poll_until(
            lambda: scalar(db, completed) == len(expected) and running(db) == expected,
            what="one step per queue completed and its slot taken again",
        )
        assert running(db) == expected, worker_log(proc)
        db.execute("SELECT pg_advisory_unlock_all()")
        total = sum(expected.values()) + 3 * len(expected)
        poll_until(lambda: scalar(db, completed) == total, what="the served backlog done")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, worker_log(proc)
    finally:
        kill(proc)
    left = "SELECT count(*) FROM cyclone_steps WHERE queue = 'unserved' AND state = 'available'"
    assert scalar(db, left) == 3


def test_slots_sets_every_served_queue(dsn: str, db: psycopg.Connection[Any]) -> None:
    """``--slots 4``: both queues the client serves run 4 steps at once (not its 2)."""
    holds_exactly(dsn, db, ["--slots", "4"], {"default": 4, "c": 4})


def test_queue_overrides_slots_and_adds_a_queue(dsn: str, db: psycopg.Connection[Any]) -> None:
    """``--queue`` applies after ``--slots`` (default gets 3, c keeps the 1 of --slots)
    and serves a queue the client does not (b)."""
    args = ["--slots", "1", "--queue", "default=3", "--queue", "b=2"]
    holds_exactly(dsn, db, args, {"default": 3, "c": 1, "b": 2})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "a"], "'a': expected NAME=SLOTS"),
        (["--queue", "a=0"], "'a=0': slots of queue 'a' must be between 1 and 10000, got 0"),
        (["--queue", "a=x"], "'a=x': slots of queue 'a' must be an integer, got 'x'"),
        (["--queue", "a=10001"], "must be between 1 and 10000, got 10001"),
        (["--slots", "0"], "Invalid value for '--slots': 0 is not in the range 1<=x<=10000"),
        (["--slots", "x"], "Invalid value for '--slots': 'x' is not a valid integer"),
        (["--queue", "=3"], "'=3': queue must not be empty"),
        (["--queue", "q" * 257 + "=3"], "queue is 257 bytes, over the 256-byte cap"),
    ],
)
def test_bad_slots_are_refused_before_anything_starts(
    dsn: str, db: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    """One line naming the bad value, the usage exit status 2, and no worker: the step
    enqueued before stays available with no lease."""
    with cyclone.SyncClient(dsn) as producer:
        producer.enqueue("hold", {"key": 0})
    result = run_cli("worker", APP, *args, env={"CYCLONE_TEST_APP_DSN": dsn})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Invalid value for" in result.stderr and "Traceback" not in result.stderr
    step = db.execute("SELECT state, lease_owner, lease_generation FROM cyclone_steps").fetchone()
    assert step == ("available", None, 0)
