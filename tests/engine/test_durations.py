"""Every public duration takes a ``timedelta`` or seconds, and refuses anything else
with a ValidationError that names the value (docs/jobs.md)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from tests.helpers import scalar

BAD: Any = "soon"  # not a duration: each call below must name it


@cyclone.action("child")
async def child(ctx: cyclone.Context, inp: Any) -> None:
    return None


@cyclone.step("spawn")
async def spawn(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    """Context.enqueue_completion with timedeltas, and with a bad duration."""
    errors = []
    for option in ("timeout", "retention", "scheduled_at"):
        try:
            await ctx.enqueue_completion("child", None, **{option: BAD})
        except cyclone.ValidationError as exc:
            errors.append(str(exc))
    job = await ctx.enqueue_completion(
        "child",
        None,
        scheduled_at=timedelta(hours=1),
        timeout=timedelta(seconds=90),
        retention=timedelta(days=2),
    )
    return {"errors": errors, "child": job.step_id}


def _step_seconds(db: psycopg.Connection[Any], step_id: int) -> tuple[float, float, bool]:
    row = db.execute(
        "SELECT extract(epoch FROM timeout)::float8, extract(epoch FROM retention)::float8, "
        "scheduled_at > now() + interval '50 minutes' FROM cyclone_steps WHERE id = %s",
        (step_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


async def test_every_public_duration_takes_a_timedelta_and_names_a_bad_value(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    td = timedelta
    # Clients: each duration read back as float seconds.
    client = cyclone.Client(
        dsn,
        handlers=[spawn],
        lease_ttl=td(seconds=12),
        poll_interval=td(milliseconds=100),
        notify_coalesce=td(milliseconds=5),
        retention=td(days=3),
        shutdown_grace=td(seconds=7),
        sweep_interval=td(seconds=2),
        purge_interval=td(minutes=10),
        connect_timeout=td(seconds=4),
    )
    assert (client.lease_ttl, client.poll_interval, client.notify_coalesce) == (12, 0.1, 0.005)
    assert (client.shutdown_grace, client.sweep_interval, client.purge_interval) == (7, 2, 600)
    assert (client.config.retention, client.connect_timeout) == (3 * 86400, 4)
    sync_client = cyclone.SyncClient(
        dsn, poll_interval=td(seconds=2), retention=td(hours=1), connect_timeout=td(seconds=4)
    )
    assert (sync_client.poll_interval, sync_client.config.retention) == (2, 3600)
    assert sync_client.connect_timeout == 4

    # Kinds and their retry policy.
    policy = cyclone.RetryPolicy(base=td(seconds=1), cap=td(minutes=5))
    assert (policy.base, policy.cap) == (1.0, 300.0)
    kind = cyclone.step("timed", timeout=td(minutes=2), retention=td(hours=2), retry=policy)(
        lambda ctx, inp: None
    )
    assert (kind.options.timeout, kind.options.retention) == (120, 7200)

    # Workflow nodes.
    wf = cyclone.Workflow("durations")
    first = wf.node("first", kind, timeout=td(seconds=30), retention=td(days=1))
    wf.fan_out("each", kind, over=first, timeout=td(seconds=30), retention=td(days=1))
    nap = wf.sleep("nap", td(minutes=1), after=[first])
    wf.wait_signal("one", timeout=td(hours=1), after=[nap])
    wf.wait_n("some", "s", 2, timeout=td(hours=1), after=[nap])
    wf.wait_any("any", ["x", "y"], timeout=td(hours=1), after=[nap])
    assert wf.nodes["nap"].wait_for == 60 and wf.nodes["one"].wait_for == 3600

    async with client:
        # Producer calls, read back from the rows.
        job = await client.enqueue(
            "child", None, scheduled_at=td(hours=1), timeout=td(seconds=90), retention=td(days=2)
        )
        (many,) = await client.enqueue_many(
            "child", [None], scheduled_at=td(hours=1), timeout=td(seconds=90), retention=td(days=2)
        )
        assert _step_seconds(db, job.step_id) == (90, 2 * 86400, True)
        assert _step_seconds(db, many.step_id) == (90, 2 * 86400, True)
        sub = await client.submit(wf, [1], deadline=td(hours=2))
        late = scalar(
            db,
            "SELECT deadline_at > now() + interval '1 hour' FROM cyclone_runs WHERE id = %s",
            (sub.run_id,),
        )
        assert late
        schedule = await client.create_schedule(
            "nightly", "child", None, "@daily", "UTC", timeout=td(seconds=90), retention=td(days=2)
        )
        assert (schedule.timeout, schedule.retention) == (90, 2 * 86400)
        with pytest.raises(cyclone.WaitTimeout):
            await client.wait(job, timeout=td(milliseconds=10))
        await client.cancel(job)
        assert await client.retry(job, deadline=td(hours=1)) == 1
        assert await client.purge(older_than=td(days=365)) == 0
        # Context.enqueue_completion.
        spawned = await client.wait(await client.enqueue("spawn", None), timeout=60)
        assert spawned.state == RunState.COMPLETED
        assert _step_seconds(db, spawned.result["child"]) == (90, 2 * 86400, True)
        assert len(spawned.result["errors"]) == 3
        assert all(repr(BAD) in error for error in spawned.result["errors"])

        # A bad value anywhere: a ValidationError that names it.
        bad_calls: list[tuple[str, Callable[[], Any]]] = [
            *(
                (f"Client {name}", lambda name=name: cyclone.Client(dsn, **{name: BAD}))
                for name in (
                    "lease_ttl",
                    "poll_interval",
                    "notify_coalesce",
                    "retention",
                    "shutdown_grace",
                    "sweep_interval",
                    "purge_interval",
                    "connect_timeout",
                )
            ),
            *(
                (f"SyncClient {name}", lambda name=name: cyclone.SyncClient(dsn, **{name: BAD}))
                for name in ("poll_interval", "retention", "connect_timeout")
            ),
            *(
                (f"RetryPolicy {name}", lambda name=name: cyclone.RetryPolicy(**{name: BAD}))
                for name in ("base", "cap")
            ),
            *(
                (f"step {name}", lambda name=name: cyclone.step("k", **{name: BAD}))
                for name in ("timeout", "retention")
            ),
            *(
                (
                    f"node {name}",
                    lambda name=name: cyclone.Workflow("w").node("n", kind, **{name: BAD}),
                )
                for name in ("timeout", "retention")
            ),
            ("sleep", lambda: cyclone.Workflow("w").sleep("n", BAD)),
            ("wait_signal", lambda: cyclone.Workflow("w").wait_signal("n", timeout=BAD)),
            ("wait_n", lambda: cyclone.Workflow("w").wait_n("n", "s", 2, timeout=BAD)),
            ("wait_any", lambda: cyclone.Workflow("w").wait_any("n", ["s"], timeout=BAD)),
        ]
        assert [what for what, call in bad_calls if not _refused(call)] == []
        async_calls: list[Callable[[], Any]] = [
            *(
                lambda name=name: client.enqueue("child", None, **{name: BAD})
                for name in ("scheduled_at", "timeout", "retention")
            ),
            *(
                lambda name=name: client.enqueue_many("child", [None], **{name: BAD})
                for name in ("scheduled_at", "timeout", "retention")
            ),
            lambda: client.submit(wf, [1], deadline=BAD),
            lambda: client.create_schedule("s", "child", None, "@daily", "UTC", timeout=BAD),
            lambda: client.create_schedule("s", "child", None, "@daily", "UTC", retention=BAD),
            lambda: client.wait(job, timeout=BAD),
            lambda: client.retry(job, deadline=BAD),
            lambda: client.purge(older_than=BAD),
        ]
        assert [i for i, make in enumerate(async_calls) if not await _refused_async(make)] == []
    with sync_client:
        sync_calls: list[Callable[[], Any]] = [
            lambda: sync_client.enqueue("child", None, timeout=BAD),
            lambda: sync_client.wait(job, timeout=BAD),
            lambda: sync_client.retry(job, deadline=BAD),
            lambda: sync_client.purge(older_than=BAD),
        ]
        assert [i for i, call in enumerate(sync_calls) if not _refused(call)] == []


def _refused(call: Callable[[], Any]) -> bool:
    """True if ``call`` raises a ValidationError that names the bad value."""
    try:
        call()
    except cyclone.ValidationError as exc:
        return repr(BAD) in str(exc)
    return False


async def _refused_async(make: Callable[[], Any]) -> bool:
    try:
        await make()
    except cyclone.ValidationError as exc:
        return repr(BAD) in str(exc)
    return False
