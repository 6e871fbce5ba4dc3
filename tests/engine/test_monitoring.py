"""The monitoring views and ``client.stats()`` on real work: depths, oldest available
age, expired leases (expired by the database clock), wait counts, panic_stack, item
task fields. Time passes by moving timestamps, never by sleeping."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg

import cyclone
from tests.helpers import apoll_until, scalar

held = asyncio.Event()
release = asyncio.Event()


@cyclone.action("mon_hold", queue="mon_q")
async def hold(ctx: cyclone.Context, value: Any) -> None:
    held.set()
    await release.wait()


@cyclone.action("mon_crash", max_attempts=1)
async def crash(ctx: cyclone.Context, value: Any) -> None:
    raise RuntimeError(f"crashed on {value}")


@cyclone.step("mon_echo")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


def waits() -> cyclone.Workflow:
    wf = cyclone.Workflow("mon_waits")
    start = wf.node("start", echo)
    wf.wait_signal("approve", after=[start])
    wf.sleep("nap", timedelta(hours=1), after=[start])
    wf.fan_out("each", echo, over=start, max_parallel=1)
    return wf


async def test_views_and_stats_show_live_work(dsn: str, db: psycopg.Connection[Any]) -> None:
    held.clear()
    release.clear()
    wf = waits()
    async with cyclone.Client(
        dsn,
        handlers=[hold, crash, echo],
        workflows=[wf],
        queues={"mon_q": 1, "default": 5},
        poll_interval=0.05,
        sweep_interval=3600,  # the expired lease below stays expired while we look
        purge_interval=None,
    ) as c:
        running = await c.enqueue(hold, 1)
        await asyncio.wait_for(held.wait(), 30)
        backlog = [await c.enqueue(hold, n) for n in (2, 3)]  # one slot: they wait
        db.execute(
            "UPDATE cyclone_steps SET scheduled_at = scheduled_at - interval '90 seconds'"
            " WHERE run_id = %s",
            (backlog[0].run_id,),
        )
        db.execute(
            "UPDATE cyclone_steps SET lease_expiry = now() - interval '1 second' WHERE run_id = %s",
            (running.run_id,),
        )
        crashed = await c.enqueue(crash, "input-7")
        sub = await c.submit(wf, [10, 20])

        async def reached() -> bool:
            states = {s.node: s.state.value for s in await c.list_steps(sub)}
            return states.get("approve") == "waiting_signal" and states.get("nap") == (
                "waiting_timer"
            )

        await apoll_until(reached, what="the waits to be reached")
        await c.wait(crashed, timeout=30)

        stats = await c.stats()
        mon = stats["mon_q"]
        assert isinstance(mon, cyclone.QueueStats)
        assert (mon.available, mon.running, mon.expired_leases) == (2, 1, 1)
        assert mon.oldest_available_age is not None and mon.oldest_available_age >= 90
        assert stats["default"].waiting == 2  # the signal wait and the timer
        with cyclone.SyncClient(dsn) as sync:
            assert sync.stats()["mon_q"].available == 2

        run_row = db.execute(
            "SELECT steps_total, steps_waiting_signal, steps_waiting_timer, parent_run_id"
            " FROM cyclone_v_runs WHERE id = %s",
            (sub.run_id,),
        ).fetchone()
        assert run_row is not None
        total, waiting_signal, waiting_timer, parent = run_row
        assert (waiting_signal, waiting_timer, parent) == (1, 1, None)
        assert total >= 6  # start, approve, nap, each and its two items
        items = db.execute(
            "SELECT node, item_of, item_index FROM cyclone_v_steps"
            " WHERE run_id = %s AND item_of IS NOT NULL ORDER BY item_index",
            (sub.run_id,),
        ).fetchall()
        assert items == [("each[0]", "each", 0), ("each[1]", "each", 1)]
        crash_row = db.execute(
            "SELECT state, error_kind, error, panic_stack, reclaims FROM cyclone_v_steps"
            " WHERE run_id = %s",
            (crashed.run_id,),
        ).fetchone()
        assert crash_row is not None
        state, error_kind, error, stack, reclaims = crash_row
        assert (state, reclaims) == ("discarded", 0)
        assert "crashed on input-7" in error and "RuntimeError" in stack
        assert error_kind is not None
        expired = db.execute(
            "SELECT lease_expired, lease_owner IS NOT NULL FROM cyclone_v_steps WHERE run_id = %s",
            (running.run_id,),
        ).fetchone()
        assert expired == (True, True)
        kinds = {
            (k, s): (n, age, exp)
            for k, s, n, age, exp in db.execute(
                "SELECT kind, state, count, oldest_available_age, expired_leases"
                " FROM cyclone_v_kinds WHERE kind = 'mon_hold'"
            ).fetchall()
        }
        assert kinds[("mon_hold", "running")][0::2] == (1, 1)
        assert kinds[("mon_hold", "available")][0] == 2
        assert kinds[("mon_hold", "available")][1] >= timedelta(seconds=90)
        release.set()
        await c.cancel(sub)
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'") == 0
