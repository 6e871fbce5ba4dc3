"""Cron schedules against real PostgreSQL: exactly one run and one fire row per slot.

Time passes by the database clock: tests move ``next_run_at`` (or a back-off's
``lease_expiry``) into the past instead of waiting for a slot.
"""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone import RunState
from tests.helpers import apoll_until, scalar, set_database_timezone


@cyclone.action("sched_tick")
async def tick(ctx: cyclone.Context, value: Any) -> None:
    return None


@cyclone.step("sched_echo")
async def echo(ctx: cyclone.Context, value: Any) -> Any:
    return value


SESSION_ZONE = "America/Los_Angeles"
"""Every database of this module runs its sessions in a zone with daylight saving, so
timestamptz values come back in it (psycopg gives them the session's zone)."""


@pytest.fixture
def dsn(dsn: str) -> str:
    """The test's database, its sessions in :data:`SESSION_ZONE`."""
    return set_database_timezone(dsn, SESSION_ZONE)


def make_client(dsn: str, *workflows: cyclone.Workflow, **options: Any) -> cyclone.Client:
    options.setdefault("poll_interval", 3600)  # passes run when a test calls scan_once
    options.setdefault("handlers", [tick, echo])
    options.setdefault("purge_interval", None)
    return cyclone.Client(dsn, workflows=workflows, **options)


async def settled(*clients: cyclone.Client) -> None:
    """Wait until each client's own scanner finished its first pass (made at start), so
    that from then on only the test's ``scan_once`` calls fire."""

    async def done() -> bool:
        return all(c.schedule_scanner is not None and c.schedule_scanner.passes for c in clients)

    await apoll_until(done, what="the first scanner passes")


def make_due(db: psycopg.Connection[Any], schedule_id: str | None = None) -> None:
    """Move next_run_at to the slot just before now (by the database clock)."""
    db.execute(
        "UPDATE cyclone_schedules SET next_run_at = date_trunc('second', now()) - "
        "interval '1 second' WHERE %(id)s::text IS NULL OR id = %(id)s",
        {"id": schedule_id},
    )


def count(db: psycopg.Connection[Any], table: str) -> int:
    return int(scalar(db, f"SELECT count(*) FROM {table}"))


async def test_five_clients_fire_each_slot_exactly_once(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Five scanners race over schedules that fall due again and again (``next_run_at``
    moved a minute back, to a new slot, between rounds): every slot fires once, with
    one run and one fire row, and the losers raise and record nothing."""
    clients = [make_client(dsn, schedule_catch_up="all") for _ in range(5)]
    for c in clients:
        await c.start()
    await settled(*clients)
    try:
        ids = [f"every-minute-{i}" for i in range(6)]
        for schedule_id in ids:
            await clients[0].create_schedule(schedule_id, tick, {"s": schedule_id}, "* * * * *")
        rounds = 8
        results = []
        base = scalar(db, "SELECT date_trunc('minute', now())")  # read once: no rollover
        for r in range(rounds):
            # round r: every schedule is due at the minute slot 1000 - 10 r minutes ago;
            # with catch-up "all" a scanner that comes after another's fire may fire the
            # next missed slot, so a round fires 1 to 5 slots of each schedule, all
            # before the next round's first slot
            db.execute(
                "UPDATE cyclone_schedules SET next_run_at = %s - make_interval(mins => %s)",
                (base, 1000 - 10 * r),
            )
            scanners = [c.schedule_scanner for c in clients]
            assert all(s is not None for s in scanners)
            results += await asyncio.gather(*(s.scan_once() for s in scanners if s))
            fired_this_round = db.execute(
                "SELECT schedule_id, min(scheduled_for) = %(at)s FROM cyclone_schedule_fires "
                "WHERE scheduled_for >= %(at)s GROUP BY schedule_id",
                {"at": base - timedelta(minutes=1000 - 10 * r)},
            ).fetchall()
            assert sorted(fired_this_round) == [(i, True) for i in sorted(ids)]
        fires = count(db, "cyclone_schedule_fires")
        assert sum(r.fired for r in results) == fires >= rounds * len(ids)
        assert sum(r.failed for r in results) == 0
        assert count(db, "cyclone_runs") == fires  # one run per fired slot, no orphan
        assert (
            scalar(
                db,
                "SELECT count(DISTINCT f.run_id) FROM cyclone_schedule_fires f "
                "JOIN cyclone_runs r ON r.id = f.run_id AND r.workflow = 'sched_tick' "
                "AND r.input = jsonb_build_object('s', f.schedule_id)",
            )
            == fires
        )
        assert (
            scalar(db, "SELECT count(*) FROM cyclone_schedules WHERE last_error IS NOT NULL") == 0
        )
        assert scalar(db, "SELECT sum(consecutive_failures) FROM cyclone_schedules") == 0
    finally:
        for c in clients:
            await c.stop()


async def test_five_started_clients_on_a_per_second_schedule(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Five started clients scanning on their own over a per-second schedule: one run per
    fired slot, every fired run completes, no errors."""
    clients = [make_client(dsn, poll_interval=0.1) for _ in range(5)]
    for c in clients:
        await c.start()
    try:
        await clients[0].create_schedule("per-second", tick, None, "* * * * * *")

        async def fired() -> bool:
            return count(db, "cyclone_schedule_fires") >= 4

        await apoll_until(fired, what="four fires", timeout=30)
        await clients[0].disable_schedule("per-second")
    finally:
        for c in clients:
            await c.stop()
    fires = count(db, "cyclone_schedule_fires")
    assert count(db, "cyclone_runs") == fires
    assert scalar(db, "SELECT count(DISTINCT scheduled_for) FROM cyclone_schedule_fires") == fires
    assert scalar(db, "SELECT last_error FROM cyclone_schedules") is None
    # slots are whole seconds, each fired at or after its slot
    assert (
        scalar(
            db,
            "SELECT count(*) FROM cyclone_schedule_fires WHERE created_at < scheduled_for "
            "OR scheduled_for <> date_trunc('second', scheduled_for)",
        )
        == 0
    )


async def test_fired_run_carries_the_schedule_options_and_input(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with make_client(dsn) as c:
        await settled(c)
        s = await c.create_schedule(
            "opts",
            tick,
            {"n": 7},
            "@hourly",
            location="UTC",
            queue="sched_q",
            priority=4,
            max_attempts=2,
            timeout=30,
            retention=timedelta(hours=2),
        )
        assert (s.queue, s.priority, s.max_attempts, s.timeout, s.retention) == (
            "sched_q",
            4,
            2,
            30.0,
            7200.0,
        )
        assert s.location == "UTC" and s.cron == "0 * * * *"
        assert s.next_run_at.minute == 0 and s.next_run_at.second == 0
        make_due(db)
        assert c.schedule_scanner is not None
        result = await c.schedule_scanner.scan_once()
        assert result.fired == 1
        after = await c.get_schedule("opts")
        assert after.last_run_id is not None and after.next_run_at > s.next_run_at - timedelta(
            hours=1
        )
        row = db.execute(
            "SELECT kind, queue, priority, max_attempts, timeout, s.retention, r.input "
            "FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id WHERE r.id = %s",
            (after.last_run_id,),
        ).fetchone()
        assert row == (
            "sched_tick",
            "sched_q",
            4,
            2,
            timedelta(seconds=30),
            timedelta(hours=2),
            {"n": 7},
        )


async def test_workflow_schedule_pins_its_definition(dsn: str, db: psycopg.Connection[Any]) -> None:
    """A workflow schedule submits the pinned def_version; a client that does not
    register that definition never fires it."""
    wf = cyclone.Workflow("sched_wf")
    first = wf.node("first", echo)
    wf.result(wf.node("second", echo, input_from=first))
    async with make_client(dsn, handlers=[tick]) as stranger:
        await settled(stranger)
        s = await stranger.create_schedule("wf", wf, {"v": 1}, "@daily", location="UTC")
        assert s.def_version is not None and s.target == "sched_wf"
        make_due(db)
        assert stranger.schedule_scanner is not None
        assert (await stranger.schedule_scanner.scan_once()).fired == 0
        assert count(db, "cyclone_runs") == 0
    async with make_client(dsn, wf) as c:
        await settled(c)  # its first pass, at start, fired the due slot
        assert count(db, "cyclone_schedule_fires") == 1
        run_id = (await c.get_schedule("wf")).last_run_id
        assert run_id is not None
        run = await c.wait(run_id, timeout=30)
        assert run.state is RunState.COMPLETED
        assert run.result == {"v": 1}
        assert run.def_version == s.def_version


async def test_missed_slots_fire_once_with_catch_up_latest_and_each_with_all(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """A yearly schedule that no client ran for five years (yearly: the expected slots
    cannot change while the test runs, except at New Year)."""
    this_year = scalar(db, "SELECT date_trunc('year', now(), 'UTC')")  # the UTC slot
    async with make_client(dsn) as c:
        await settled(c)
        await c.create_schedule("yearly", tick, None, "@yearly", location="UTC")
        db.execute(
            "UPDATE cyclone_schedules SET next_run_at = %s - interval '5 years'", (this_year,)
        )
        assert c.schedule_scanner is not None
        assert (await c.schedule_scanner.scan_once()).fired == 1
        assert (await c.schedule_scanner.scan_once()).fired == 0
        assert scalar(db, "SELECT scheduled_for FROM cyclone_schedule_fires") == this_year
        assert scalar(db, "SELECT next_run_at FROM cyclone_schedules") == this_year.replace(
            year=this_year.year + 1
        )
    db.execute("DELETE FROM cyclone_schedule_fires")
    db.execute("UPDATE cyclone_schedules SET next_run_at = %s - interval '5 years'", (this_year,))
    async with make_client(dsn, schedule_catch_up="all") as c:
        await settled(c)
        assert c.schedule_scanner is not None  # its first pass fired the oldest slot
        while (await c.schedule_scanner.scan_once()).fired:
            pass
        slots = [
            r[0]
            for r in db.execute(
                "SELECT scheduled_for FROM cyclone_schedule_fires ORDER BY 1"
            ).fetchall()
        ]
        assert slots == [this_year.replace(year=this_year.year - n) for n in range(5, -1, -1)]


async def test_a_scanner_that_lost_its_lease_fires_nothing(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """Scanner A claims, its lease passes to B (A looks dead), B fires; A's late fire
    matches nothing and rolls back its run: one run, one fire row."""
    a = make_client(dsn)
    b = make_client(dsn)
    async with a, b:
        await settled(a, b)
        await a.create_schedule("contested", tick, None, "@daily", location="UTC")
        make_due(db)
        assert a.schedule_scanner is not None and b.schedule_scanner is not None
        claimed_by_a = await a.schedule_scanner.claim()
        assert len(claimed_by_a) == 1
        assert await b.schedule_scanner.claim() == []  # A's lease holds
        db.execute("UPDATE cyclone_schedules SET lease_expiry = now() - interval '1 second'")
        claimed_by_b = await b.schedule_scanner.claim()
        assert (await b.schedule_scanner.fire(claimed_by_b)).fired == 1
        late = await a.schedule_scanner.fire(claimed_by_a)
        assert (late.fired, late.lost, late.failed) == (0, 1, 0)
        assert count(db, "cyclone_runs") == 1 and count(db, "cyclone_schedule_fires") == 1
        assert scalar(db, "SELECT last_error FROM cyclone_schedules") is None


async def test_disabling_wins_over_a_claimed_slot(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with make_client(dsn) as c:
        await settled(c)
        await c.create_schedule("stop-me", tick, None, "@daily", location="UTC")
        make_due(db)
        assert c.schedule_scanner is not None
        claimed = await c.schedule_scanner.claim()
        await c.disable_schedule("stop-me")  # between the claim and the fire
        assert (await c.schedule_scanner.fire(claimed)).lost == 1
        assert count(db, "cyclone_runs") == 0


async def test_a_failing_schedule_records_its_error_and_backs_off(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with make_client(dsn) as c:
        await settled(c)
        await c.create_schedule("broken", tick, None, "@hourly", location="UTC")
        # a definition this version cannot evaluate (an edit by hand, an older writer)
        db.execute("UPDATE cyclone_schedules SET cron_spec = 'bogus * *'")
        make_due(db)
        assert c.schedule_scanner is not None
        assert (await c.schedule_scanner.scan_once()).failed == 1
        s = await c.get_schedule("broken")
        assert s.consecutive_failures == 1 and "bogus" in (s.last_error or "")
        assert s.lease_owner is None and s.lease_expiry is not None
        assert (await c.schedule_scanner.scan_once()).failed == 0  # backing off
        db.execute("UPDATE cyclone_schedules SET lease_expiry = now() - interval '1 second'")
        assert (await c.schedule_scanner.scan_once()).failed == 1
        s = await c.get_schedule("broken")
        assert s.consecutive_failures == 2
        assert s.lease_expiry is not None
        assert s.lease_expiry - s.updated_at == timedelta(seconds=2)  # 2^1 s, by the DB clock
        assert count(db, "cyclone_runs") == 0 and count(db, "cyclone_schedule_fires") == 0
        # a fixed definition fires and clears the failure record
        await c.update_schedule("broken", cron="@hourly")
        make_due(db)
        assert (await c.schedule_scanner.scan_once()).fired == 1
        s = await c.get_schedule("broken")
        assert (s.consecutive_failures, s.last_error) == (0, None)


async def test_purging_a_fired_run_never_lets_its_slot_fire_again(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with make_client(dsn, retention=0) as c:
        await settled(c)
        await c.create_schedule("once", tick, None, "@daily", location="UTC")
        make_due(db)
        assert c.schedule_scanner is not None
        assert (await c.schedule_scanner.scan_once()).fired == 1
        s = await c.get_schedule("once")
        assert s.last_run_id is not None
        await c.wait(s.last_run_id, timeout=30)
        assert await c.purge() == 1
        assert count(db, "cyclone_schedule_fires") == 0  # gone with its run
        s2 = await c.get_schedule("once")
        assert s2.last_run_id is None and s2.next_run_at == s.next_run_at
        assert (await c.schedule_scanner.scan_once()).fired == 0
        assert count(db, "cyclone_runs") == 0


async def test_create_update_enable_disable_delete(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with make_client(dsn) as c:
        await settled(c)
        s = await c.create_schedule(
            "crud", "some.kind", [1, 2], "0 9 * * 1-5", location="Europe/Berlin"
        )
        assert s.target == "some.kind" and s.input == [1, 2] and s.enabled
        assert s.retention == 7 * 24 * 3600.0  # the client default, stored
        assert [x.id for x in await c.list_schedules()] == ["crud"]
        # an update that keeps the cron keeps next_run_at; a new cron moves it
        kept = await c.update_schedule("crud", priority=9)
        assert (kept.priority, kept.input, kept.next_run_at) == (9, [1, 2], s.next_run_at)
        # (03:15 daily never coincides with the next 09:00 weekday slot)
        moved = await c.update_schedule("crud", cron="15 3 * * *", input=None)
        assert moved.input is None and moved.priority == 9
        assert moved.next_run_at != s.next_run_at and moved.next_run_at.minute == 15
        # a new kind target keeps the stored step options
        retargeted = await c.update_schedule("crud", target=tick, queue="elsewhere")
        assert (retargeted.target, retargeted.queue, retargeted.priority) == (
            "sched_tick",
            "elsewhere",
            9,
        )
        # enabling an enabled schedule changes nothing, a due slot included
        make_due(db)
        due = scalar(db, "SELECT next_run_at FROM cyclone_schedules")
        assert (await c.enable_schedule("crud")).next_run_at == due
        # disabled: never fires; enabled after its slot passed: from the next slot on
        await c.disable_schedule("crud")
        assert c.schedule_scanner is not None
        assert (await c.schedule_scanner.scan_once()).fired == 0
        enabled = await c.enable_schedule("crud")
        assert enabled.enabled
        assert scalar(db, "SELECT next_run_at > now() FROM cyclone_schedules")
        assert (await c.schedule_scanner.scan_once()).fired == 0
        make_due(db)
        assert (await c.schedule_scanner.scan_once()).fired == 1
        await c.delete_schedule("crud")
        assert await c.list_schedules() == []
        assert count(db, "cyclone_schedule_fires") == 0 and count(db, "cyclone_runs") == 1
        for call in (
            c.delete_schedule("crud"),
            c.enable_schedule("crud"),
            c.update_schedule("crud", priority=1),
            c.get_schedule("crud"),
        ):
            with pytest.raises(cyclone.NotFoundError, match="'crud'"):
                await call


async def test_bad_schedules_raise_and_write_nothing(dsn: str, db: psycopg.Connection[Any]) -> None:
    wf = cyclone.Workflow("sched_bad_wf")
    wf.node("a", echo)
    async with make_client(dsn) as c:
        await settled(c)
        await c.create_schedule("taken", tick, None, "@daily", location="UTC")
        before = db.execute("SELECT * FROM cyclone_schedules").fetchall()
        cases: list[tuple[dict[str, Any], str]] = [
            ({"id": "taken"}, "'taken' already exists"),
            ({"cron": "61 * * * *"}, "'61 * * * *'"),
            ({"cron": "@fortnightly"}, "'@fortnightly'"),
            ({"location": "Atlantis/Capital"}, "'Atlantis/Capital'"),
            ({"input": {"bad": {1, 2}}}, "input of schedule"),
            ({"queue": "q" * 257}, "queue"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"target": wf, "priority": 3}, "apply to a kind schedule"),
            ({"colour": "blue"}, "unknown schedule option"),
        ]
        for change, message in cases:
            args: dict[str, Any] = {
                "id": "new",
                "target": tick,
                "input": None,
                "cron": "@daily",
                "location": "UTC",
            } | change
            with pytest.raises(cyclone.ValidationError, match=re.escape(message)):
                await c.create_schedule(**args)
        for change, message in cases[1:]:
            if "id" in change or "target" in change:
                continue
            update = {"cron" if k == "cron" else k: v for k, v in change.items()}
            with pytest.raises(cyclone.ValidationError, match=re.escape(message)):
                await c.update_schedule("taken", **update)
        assert db.execute("SELECT * FROM cyclone_schedules").fetchall() == before


def test_sync_client_manages_schedules(dsn: str, db: psycopg.Connection[Any]) -> None:
    with cyclone.SyncClient(dsn, handlers=[tick]) as c:
        s = c.create_schedule("sync", tick, {"a": 1}, "@weekly", location="Asia/Tokyo")
        assert s.location == "Asia/Tokyo" and s.cron == "0 0 * * 0"
        assert c.update_schedule("sync", location="UTC").location == "UTC"
        assert not c.disable_schedule("sync").enabled
        assert c.enable_schedule("sync").enabled
        assert [x.id for x in c.list_schedules()] == ["sync"]
        with pytest.raises(cyclone.ValidationError, match="already exists"):
            c.create_schedule("sync", tick, None, "@daily")
        c.delete_schedule("sync")
        with pytest.raises(cyclone.NotFoundError):
            c.get_schedule("sync")
    assert count(db, "cyclone_schedules") == 0


async def test_a_slot_that_fired_before_is_passed_over_not_failed(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """next_run_at moved back by hand onto a slot that has its fire row: the scanner
    passes it over (no second run, no failure) and moves on."""
    async with make_client(dsn) as c:
        await settled(c)
        await c.create_schedule("again", tick, None, "@daily", location="UTC")
        make_due(db)
        assert c.schedule_scanner is not None
        assert (await c.schedule_scanner.scan_once()).fired == 1
        slot = scalar(db, "SELECT scheduled_for FROM cyclone_schedule_fires")
        db.execute("UPDATE cyclone_schedules SET next_run_at = %s", (slot,))
        result = await c.schedule_scanner.scan_once()
        assert (result.fired, result.failed, result.lost) == (0, 0, 1)
        s = await c.get_schedule("again")
        assert s.next_run_at > slot and s.consecutive_failures == 0 and s.last_error is None
        assert count(db, "cyclone_runs") == 1 and count(db, "cyclone_schedule_fires") == 1


async def test_a_slot_due_before_the_fall_back_fires_when_seen_after_it(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """The 2026-11-01 fall-back in America/Los_Angeles, the sessions' zone: a slot due at
    01:59 PDT, claimed at 01:00:20 PST (80 s later in real time, earlier by the wall
    clock), fires; it is not a failure and there is no back-off.

    The database clock cannot be moved to that night: the slot is put there with SQL
    and the claim's ``now`` is the value the session gives for 01:00:20 PST, exactly as
    psycopg returns it (the session zone, fold 1)."""
    async with make_client(dsn) as c:
        await settled(c)
        assert scalar(db, "SHOW timezone") == SESSION_ZONE
        await c.create_schedule("minute-59", tick, None, "59 * * * *", location=SESSION_ZONE)
        db.execute("UPDATE cyclone_schedules SET next_run_at = '2026-11-01 01:59:00-07'")
        assert c.schedule_scanner is not None
        (row,) = await c.schedule_scanner.claim()
        seen = scalar(db, "SELECT '2026-11-01 01:00:20-08'::timestamptz")
        assert row.next_run_at.tzinfo is seen.tzinfo  # one zone: wall clocks compare
        assert (row.next_run_at.fold, seen.fold) == (0, 1)
        assert seen < row.next_run_at  # by the wall clock, the trap
        result = await c.schedule_scanner.fire([row._replace(now=seen)])
        assert (result.fired, result.failed, result.lost) == (1, 0, 0)
        fire = db.execute(
            "SELECT scheduled_for = '2026-11-01 08:59:00+00' FROM cyclone_schedule_fires"
        ).fetchall()
        assert fire == [(True,)]
        state = db.execute(
            "SELECT next_run_at = '2026-11-01 09:59:00+00', consecutive_failures, last_error, "
            "lease_expiry FROM cyclone_schedules"
        ).fetchone()
        assert state == (True, 0, None, None)  # 01:59 PST next; no failure, no back-off
