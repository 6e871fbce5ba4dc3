"""Flow control (issue 16, item 8): max_concurrency, rate limits and fairness, with real
PostgreSQL and real worker processes.

A test that checks when steps ran installs, in its own database, an ``AFTER UPDATE OF
state`` trigger on ``cyclone_steps`` (:func:`_log_running`) that logs every running
interval: ``clock_timestamp()`` when a step enters ``running`` and when it leaves it,
with its keys and the ``started_at`` its claim wrote. A claim that admits a step into a
place a completion freed sees that completion committed, so the completion's leaving
time precedes the admitted step's entering time: intervals of one group that overlap
in the log were running at once. Workers of :mod:`tests.apps.limited` run the
multi-process tests; the others run clients in this process.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import kill, poll_until, scalar, start_worker, worker_log

APP = "tests.apps.limited:client"

_RUNNING_LOG = """
CREATE TABLE flow_running (
    step_id    bigint      NOT NULL,
    generation integer     NOT NULL,
    kind       text        NOT NULL,
    ckey       text,
    rkey       text,
    started_at timestamptz NOT NULL,
    entered    timestamptz NOT NULL,
    left_at    timestamptz,
    PRIMARY KEY (step_id, generation)
);

CREATE FUNCTION flow_running_log() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'running' THEN
        INSERT INTO flow_running (step_id, generation, kind, ckey, rkey, started_at, entered)
        VALUES (NEW.id, NEW.lease_generation, NEW.kind, NEW.concurrency_key, NEW.rate_key,
                NEW.started_at, clock_timestamp());
    ELSE
        UPDATE flow_running
        SET left_at = clock_timestamp()
        WHERE step_id = OLD.id AND generation = OLD.lease_generation;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER flow_running_log
AFTER UPDATE OF state ON cyclone_steps
FOR EACH ROW
WHEN ((OLD.state = 'running') IS DISTINCT FROM (NEW.state = 'running'))
EXECUTE FUNCTION flow_running_log();
"""

_MAX_OVERLAP = """
SELECT coalesce(a.ckey, '<null>'), max(a.n)
FROM (
    SELECT a.ckey, count(*) AS n
    FROM flow_running a
    JOIN flow_running b
      ON b.kind = a.kind
     AND b.ckey IS NOT DISTINCT FROM a.ckey
     AND b.entered <= a.entered
     AND (b.left_at IS NULL OR b.left_at > a.entered)
    WHERE a.kind = %s
    GROUP BY a.ckey, a.step_id, a.generation
) AS a
GROUP BY a.ckey
"""
"""Per concurrency key of a kind: the most intervals running at once (the largest
number of intervals holding the entering time of one of them)."""

_MAX_WINDOW = """
SELECT coalesce(a.rkey, ''), max((
    SELECT count(*)
    FROM flow_running b
    WHERE b.kind = a.kind
      AND b.rkey IS NOT DISTINCT FROM a.rkey
      AND b.started_at >= a.started_at
      AND b.started_at < a.started_at + interval '1 second'))
FROM flow_running a
WHERE a.kind = %s
GROUP BY a.rkey
"""
"""Per rate key of a kind: the most starts in a half-open window ``[s, s + 1 s)``, over
every start ``s`` (the busiest such window begins at a start)."""


def _log_running(db: psycopg.Connection[Any]) -> None:
    """Log every running interval in ``flow_running`` (see the module docstring)."""
    db.execute(_RUNNING_LOG)


def _max_overlap(db: psycopg.Connection[Any], kind: str) -> dict[str, int]:
    return {str(key): int(n) for key, n in db.execute(_MAX_OVERLAP, (kind,)).fetchall()}


def _completed(db: psycopg.Connection[Any], kind: str) -> int:
    return int(
        scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE kind = %s AND state = 'completed'",
            (kind,),
        )
    )


def _wait_completed(db: psycopg.Connection[Any], kind: str, n: int, *, timeout: float) -> None:
    poll_until(
        lambda: _completed(db, kind) == n,
        timeout=timeout,
        interval=0.1,
        what=f"{n} completed steps of {kind}",
    )


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Worker processes the test starts with :func:`_start`; SIGKILLed at the end, their
    logs printed (pytest shows them when the test fails) and deleted."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        kill(proc)
    for proc in procs:
        print(f"--- worker {proc.pid} ---\n{worker_log(proc)}")
        Path(proc.log_path).unlink(missing_ok=True)  # type: ignore[attr-defined]


def _start(dsn: str, procs: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A worker process of :mod:`tests.apps.limited` on ``dsn``, added to ``procs``."""
    proc = start_worker(APP, {"CYCLONE_TEST_APP_DSN": dsn})
    procs.append(proc)
    return proc


# -- concurrency across worker processes ---------------------------------------------


def test_four_workers_never_run_more_than_max_concurrency_of_a_key(
    dsn: str, db: psycopg.Connection[Any], workers: list[subprocess.Popen[bytes]]
) -> None:
    """2,000 jobs of a ``max_concurrency=2`` kind over 20 concurrency keys, enqueued
    interleaved in chunks of 10, drained by 4 worker processes of 10 slots each: the
    log never shows more than 2 running intervals of a key at once (and shows 2, so the
    limit was reached), and every job completes, each started once."""
    _log_running(db)
    keys = [f"tenant-{i:02d}" for i in range(20)]
    with cyclone.SyncClient(dsn) as producer:
        for chunk in range(10):
            for key in keys:
                inputs = [{"n": chunk * 10 + i} for i in range(10)]
                producer.enqueue_many("lim_pair", inputs, concurrency_key=key)
    for _ in range(4):
        _start(dsn, workers)
    _wait_completed(db, "lim_pair", 2000, timeout=240)
    overlaps = _max_overlap(db, "lim_pair")
    assert sorted(overlaps) == keys
    assert max(overlaps.values()) == 2, overlaps
    assert scalar(db, "SELECT count(*) FROM flow_running WHERE left_at IS NULL") == 0
    assert scalar(db, "SELECT count(DISTINCT step_id) FROM flow_running") == 2000
    assert scalar(db, "SELECT count(*) FROM flow_running") == 2000
    assert scalar(db, "SELECT count(*) FROM cyclone_runs WHERE state = 'completed'") == 2000


def test_a_killed_workers_places_return_only_when_the_sweep_reclaims_its_steps(
    dsn: str, db: psycopg.Connection[Any], workers: list[subprocess.Popen[bytes]]
) -> None:
    """4 keys x 3 jobs of a ``max_concurrency=1`` kind whose handler blocks. Worker A
    holds one step of every key; worker B starts, then A is SIGKILLed. B keeps claiming
    (it runs probe jobs enqueued after the kill) but starts no step of those keys while
    A's leases hold; once the leases are expired by hand, B's sweep reclaims A's steps
    and B starts one step of every key again; released, every job completes. No key
    ever ran two steps at once."""
    _log_running(db)
    lock = 16_008
    keys = ["k0", "k1", "k2", "k3"]
    hold_log = "SELECT count(*) FROM flow_running WHERE kind = 'lim_hold'"
    written_by = "SELECT written_by FROM cyclone_kind_limits WHERE kind = 'lim_hold'"
    with psycopg.connect(dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (lock,))
        with cyclone.SyncClient(dsn) as producer:
            for key in keys:
                producer.enqueue_many("lim_hold", [{"lock": lock}] * 3, concurrency_key=key)
            first = _start(dsn, workers)
            poll_until(lambda: scalar(db, hold_log) == 4, what="A to start a step of each key")
            held = db.execute(
                "SELECT concurrency_key, id, lease_owner FROM cyclone_steps"
                " WHERE state = 'running' ORDER BY concurrency_key"
            ).fetchall()
            assert [key for key, _id, _owner in held] == keys
            held_ids = [step_id for _key, step_id, _owner in held]
            owners = sorted({owner for _key, _id, owner in held})
            a_wrote = scalar(db, written_by)
            second = _start(dsn, workers)
            poll_until(lambda: scalar(db, written_by) != a_wrote, what="B to start")
            kill(first)
            pids = {
                producer.wait(producer.enqueue("lim_probe"), timeout=30).result for _ in range(5)
            }
            assert pids == {second.pid}  # B claimed, five times over, after the kill
            assert scalar(db, hold_log) == 4  # and started no step of the held keys
            assert scalar(db, hold_log + " AND left_at IS NULL") == 4
            db.execute(
                "UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second'"
                " WHERE state = 'running' AND lease_owner = ANY(%s)",
                (owners,),
            )
            poll_until(
                lambda: (
                    scalar(
                        db,
                        "SELECT count(*) FROM cyclone_steps WHERE kind = 'lim_hold'"
                        " AND state = 'running' AND lease_owner <> ALL(%s)",
                        (owners,),
                    )
                    == 4
                ),
                what="B to start a step of each key again",
            )
            reclaimed = db.execute(
                "SELECT id FROM cyclone_steps WHERE reclaims = 1 ORDER BY concurrency_key"
            ).fetchall()
            assert reclaimed == [(step_id,) for step_id in held_ids]
            assert scalar(db, hold_log) == 8
        # closing the gate's connection releases the lock: every handler returns
    _wait_completed(db, "lim_hold", 12, timeout=60)
    assert _max_overlap(db, "lim_hold") == dict.fromkeys(keys, 1)
    # A's intervals ended (at the reclaim) before any other step of their key started
    early = db.execute(
        "SELECT b.step_id FROM flow_running a JOIN flow_running b ON b.ckey = a.ckey"
        " WHERE a.kind = 'lim_hold' AND b.kind = 'lim_hold' AND a.step_id = ANY(%s)"
        " AND a.generation = 1 AND (b.step_id, b.generation) <> (a.step_id, 1)"
        " AND b.entered < a.left_at",
        (held_ids,),
    ).fetchall()
    assert early == []


# -- rate limits ---------------------------------------------------------------------


@pytest.mark.slow  # ten seconds of starts at 50 a second
def test_rate_limit_holds_in_every_one_second_window(
    dsn: str, db: psycopg.Connection[Any], workers: list[subprocess.Popen[bytes]]
) -> None:
    """``RateLimit(50, per=1)``: 500 jobs in the kind's one bucket and 100 with
    ``rate_key="other"``, interleaved, drained by 2 worker processes: in no window
    ``[s, s + 1 s)``, for any start ``s``, does either bucket start more than 50 steps
    (the starts' ``started_at``, the claim's clock, from the log); every step started
    once and completed."""
    _log_running(db)
    with cyclone.SyncClient(dsn) as producer:
        for _ in range(10):
            producer.enqueue_many("lim_rate", [{}] * 50)
            producer.enqueue_many("lim_rate", [{}] * 10, rate_key="other")
    _start(dsn, workers)
    _start(dsn, workers)
    _wait_completed(db, "lim_rate", 600, timeout=120)
    windows = dict(db.execute(_MAX_WINDOW, ("lim_rate",)).fetchall())
    assert set(windows) == {"", "other"}
    assert all(n <= 50 for n in windows.values()), windows
    starts = db.execute(
        "SELECT coalesce(rkey, ''), count(*), count(DISTINCT step_id) FROM flow_running"
        " GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert starts == [("", 500, 500), ("other", 100, 100)]


# -- fairness ------------------------------------------------------------------------


@cyclone.action("fair_job")
async def fair_job(ctx: cyclone.Context, inp: Any) -> None:
    return None


async def test_a_small_fairness_key_is_not_starved_by_a_large_one(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """10,000 jobs of fairness key A enqueued first, then 10 of key B: the worker
    started all of B's before 100 of A's (A steps started no later than B's last)."""
    async with cyclone.Client(dsn) as producer:
        await producer.enqueue_many("fair_job", [{}] * 10_000, fairness_key="A")
        late = await producer.enqueue_many("fair_job", [{}] * 10, fairness_key="B")
    async with cyclone.Client(
        dsn, handlers=[fair_job], queues={"default": 10}, poll_interval=0.05
    ) as worker:
        for handle in late:
            assert (await worker.wait(handle, timeout=60)).state == cyclone.RunState.COMPLETED
    a_first = scalar(
        db,
        "SELECT count(*) FROM cyclone_steps WHERE fairness_key = 'A' AND started_at <= ("
        " SELECT max(started_at) FROM cyclone_steps WHERE fairness_key = 'B')",
    )
    assert a_first < 100


# -- workflows: fan-out items keyed by a field of their item -------------------------


@cyclone.step("lim_items")
async def lim_items(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


@cyclone.action("lim_tenant", max_concurrency=1)
async def lim_tenant(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.sleep(0.003)  # the handler's work


def per_tenant(key: str | cyclone.ItemKey | None) -> cyclone.Workflow:
    """Items from the run input, each run by ``lim_tenant`` with ``key`` (on both nodes
    when it is a plain string)."""
    wf = cyclone.Workflow("per_tenant")
    plain = key if isinstance(key, str) else None
    items = wf.node("items", lim_items, concurrency_key=plain)
    wf.fan_out("each", lim_tenant, over=items, concurrency_key=key)
    return wf


async def test_fan_out_items_of_one_tenant_never_overlap(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A fan-out with ``concurrency_key=ItemKey("tenant")`` over 30 items of 3 tenants,
    run by two clients: each item's key is its tenant, items of one tenant never ran at
    once (items of different tenants did), and the run completes."""
    _log_running(db)
    wf = per_tenant(cyclone.ItemKey("tenant"))
    values = [{"tenant": f"t{i % 3}", "n": i} for i in range(30)]
    async with (
        cyclone.Client(dsn, workflows=[wf], queues={"default": 8}, poll_interval=0.05) as one,
        cyclone.Client(dsn, workflows=[wf], queues={"default": 8}, poll_interval=0.05),
    ):
        run = await one.wait(await one.submit(wf, values), timeout=60)
    assert run.state == cyclone.RunState.COMPLETED
    keys = db.execute(
        "SELECT input ->> 'tenant', concurrency_key FROM cyclone_steps WHERE item_of = 'each'"
    ).fetchall()
    assert len(keys) == 30 and all(tenant == key for tenant, key in keys)
    assert _max_overlap(db, "lim_tenant") == {"t0": 1, "t1": 1, "t2": 1}
    across = scalar(
        db,
        "SELECT count(*) FROM flow_running a JOIN flow_running b ON b.kind = a.kind"
        " AND b.ckey <> a.ckey AND b.entered <= a.entered AND b.left_at > a.entered"
        " WHERE a.kind = 'lim_tenant'",
    )
    assert across > 0


@cyclone.action("lim_solo", max_concurrency=1)
async def lim_solo(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.sleep(0.003)  # the handler's work


async def test_steps_without_a_key_share_the_kinds_one_group(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """20 jobs without a concurrency key and 10 with key ``"x"`` of a
    ``max_concurrency=1`` kind, run by two clients of 4 slots: no two unkeyed jobs ran at
    once (they count in the kind's one group, stored as key ``''`` once claimed), and
    the ``"x"`` jobs form a group of their own."""
    _log_running(db)
    async with cyclone.Client(dsn) as producer:
        unkeyed = await producer.enqueue_many("lim_solo", [{}] * 20)
        keyed = await producer.enqueue_many("lim_solo", [{}] * 10, concurrency_key="x")
    async with (
        cyclone.Client(dsn, handlers=[lim_solo], queues={"default": 4}, poll_interval=0.05) as one,
        cyclone.Client(dsn, handlers=[lim_solo], queues={"default": 4}, poll_interval=0.05),
    ):
        for handle in [*unkeyed, *keyed]:
            assert (await one.wait(handle, timeout=60)).state == cyclone.RunState.COMPLETED
    assert _max_overlap(db, "lim_solo") == {"": 1, "x": 1}
    stored = db.execute(
        "SELECT concurrency_key, count(*) FROM cyclone_steps GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert stored == [("", 20), ("x", 10)]


GATES: dict[str, asyncio.Event] = {}
"""Events the blocking ``lim_gate`` steps wait for, by the input's ``gate``."""


@cyclone.action("lim_gate", max_concurrency=1)
async def lim_gate(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    if inp.get("gate"):
        await GATES[inp["gate"]].wait()


@cyclone.action("lim_free")
async def lim_free(ctx: cyclone.Context, inp: Any) -> None:
    return None


async def test_a_full_group_does_not_hold_up_other_kinds_or_keys(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A backlog of 20 blocking steps of a ``max_concurrency=1`` kind in one group
    ("busy"), enqueued first, then 10 steps of that kind with key "other" and 30 of an
    unlimited kind, in the same queue: while "busy" is full (one running, 19
    available), every later step completes; released, the backlog completes too."""
    GATES["busy"] = asyncio.Event()
    async with cyclone.Client(
        dsn, handlers=[lim_gate, lim_free], queues={"default": 4}, poll_interval=0.05
    ) as c:
        busy = await c.enqueue_many("lim_gate", [{"gate": "busy"}] * 20, concurrency_key="busy")
        other = await c.enqueue_many("lim_gate", [{}] * 10, concurrency_key="other")
        free = await c.enqueue_many("lim_free", [{}] * 30)
        for handle in [*other, *free]:
            assert (await c.wait(handle, timeout=60)).state == cyclone.RunState.COMPLETED
        states = db.execute(
            "SELECT state, count(*) FROM cyclone_steps WHERE concurrency_key = 'busy'"
            " GROUP BY 1 ORDER BY 1"
        ).fetchall()
        assert states == [("available", 19), ("running", 1)]
        GATES["busy"].set()
        for handle in busy:
            assert (await c.wait(handle, timeout=60)).state == cyclone.RunState.COMPLETED
    assert _completed(db, "lim_gate") == 30
