"""The pure next-slot function and fire plans: cron parsing, zones, daylight saving.

docs/design.md, Schedules and retention: an hour-wildcard schedule runs in every real
hour; a fixed time that does not exist runs once at the next valid instant, one that
occurs twice runs once, at its first occurrence.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from rich.console import Console

import cyclone
from cyclone.config import ClientConfig
from cyclone.records import Schedule, StepInfo
from cyclone.render import schedules_table
from cyclone.schedules import (
    SKIP_COUNT_LIMIT,
    ScheduleSpec,
    fire_plan,
    latest_slot,
    next_slot,
    parse_cron,
    resolve_location,
    set_enabled_plan,
    slots_between,
)
from cyclone.sql import Q
from cyclone.sql.rows import ScheduleRow

LA = "America/Los_Angeles"
BERLIN = "Europe/Berlin"


def day_slots(cron: str, zone: str, year: int, month: int, day: int) -> list[datetime]:
    """Every slot of one local calendar day, as local times."""
    tz = ZoneInfo(zone)
    start = datetime(year, month, day, tzinfo=tz)
    end = start + timedelta(days=1)  # wall-clock midnight of the next day
    before = (start - timedelta(microseconds=1)).astimezone(UTC)
    return [s.astimezone(tz) for s in slots_between(parse_cron(cron), zone, before, end)]


def local(
    zone: str,
    year: int,
    month: int,
    day: int,
    hour: int = 0,
    minute: int = 0,
    second: int = 0,
    *,
    fold: int = 0,
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=ZoneInfo(zone), fold=fold)


@pytest.mark.parametrize(("zone", "fall_back"), [(LA, (2026, 11, 1)), (BERLIN, (2026, 10, 25))])
def test_hourly_schedule_runs_25_times_on_the_fall_back_day(
    zone: str, fall_back: tuple[int, int, int]
) -> None:
    slots = day_slots("0 * * * *", zone, *fall_back)
    assert len(slots) == 25
    assert len({s.astimezone(UTC) for s in slots}) == 25  # 25 distinct instants
    hours = [s.hour for s in slots]
    repeated = 1 if zone == LA else 2
    assert hours.count(repeated) == 2  # both of the repeated wall-clock hour


@pytest.mark.parametrize(("zone", "spring"), [(LA, (2026, 3, 8)), (BERLIN, (2026, 3, 29))])
def test_hourly_schedule_skips_the_missing_hour_of_spring_forward(
    zone: str, spring: tuple[int, int, int]
) -> None:
    slots = day_slots("0 * * * *", zone, *spring)
    assert len(slots) == 23
    assert 2 not in [s.hour for s in slots]


@pytest.mark.parametrize(("zone", "spring"), [(LA, (2026, 3, 8)), (BERLIN, (2026, 3, 29))])
def test_fixed_time_in_the_missing_hour_runs_once_at_the_next_valid_instant(
    zone: str, spring: tuple[int, int, int]
) -> None:
    slots = day_slots("30 2 * * *", zone, *spring)
    assert slots == [local(zone, *spring, 3, 0)]
    # the day before and after: 02:30 as usual
    before = day_slots("30 2 * * *", zone, *(datetime(*spring) - timedelta(days=1)).timetuple()[:3])
    assert [(s.hour, s.minute) for s in before] == [(2, 30)]


@pytest.mark.parametrize(
    ("zone", "fall_back", "hour"), [(LA, (2026, 11, 1), 1), (BERLIN, (2026, 10, 25), 2)]
)
def test_fixed_time_in_the_repeated_hour_runs_once_at_its_first_occurrence(
    zone: str, fall_back: tuple[int, int, int], hour: int
) -> None:
    slots = day_slots(f"30 {hour} * * *", zone, *fall_back)
    assert len(slots) == 1
    first = local(zone, *fall_back, hour, 30, fold=0)
    assert slots[0].astimezone(UTC) == first.astimezone(UTC)
    # the second occurrence is one hour later in absolute time, and is not a slot
    second = local(zone, *fall_back, hour, 30, fold=1)
    assert second.astimezone(UTC) - first.astimezone(UTC) == timedelta(hours=1)


def test_next_slot_is_strictly_after_and_in_utc() -> None:
    at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert next_slot("0 * * * *", "UTC", at) == datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    assert next_slot("0 * * * *", "UTC", at - timedelta(microseconds=1)) == at
    slot = next_slot("0 9 * * *", BERLIN, at)
    assert slot.tzinfo is UTC
    assert slot == datetime(2026, 1, 2, 8, 0, tzinfo=UTC)  # 09:00 CET
    assert latest_slot("0 * * * *", "UTC", at) == at
    assert latest_slot("0 * * * *", "UTC", at - timedelta(seconds=1)) == at - timedelta(hours=1)


def test_macros_and_seconds_field() -> None:
    assert parse_cron("@hourly") == "0 * * * *"
    assert parse_cron("@DAILY") == "0 0 * * *"
    assert parse_cron("@midnight") == parse_cron("@daily")
    assert parse_cron("@weekly") == "0 0 * * 0"
    assert parse_cron("@monthly") == "0 0 1 * *"
    assert parse_cron("@yearly") == parse_cron("@annually") == "0 0 1 1 *"
    assert parse_cron("  */5   *  * * * ") == "*/5 * * * *"
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert next_slot(parse_cron("*/10 * * * * *"), "UTC", at) == at + timedelta(seconds=10)


@pytest.mark.parametrize(
    "bad",
    ["", "* * *", "61 * * * *", "* 25 * * *", "@reboot", "@every 5m", "not a cron", 5, None],
)
def test_bad_cron_strings_raise_validation_error(bad: object) -> None:
    with pytest.raises(cyclone.ValidationError) as info:
        parse_cron(bad)
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["Mars/Olympus_Mons", "", "../etc/passwd", "UTC+5", 3])
def test_unknown_zones_raise_validation_error(bad: object) -> None:
    with pytest.raises(cyclone.ValidationError) as info:
        resolve_location(bad)
    assert repr(bad) in str(info.value)


def test_local_resolves_to_an_iana_name() -> None:
    name = resolve_location("Local")
    assert name != "Local"
    ZoneInfo(name)
    assert resolve_location(BERLIN) == BERLIN


def test_catch_up_latest_fires_the_last_missed_slot_once() -> None:
    now = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
    due = datetime(2026, 1, 1, 7, 0, tzinfo=UTC)  # five hours of slots missed
    plan = fire_plan("0 * * * *", "UTC", due, now)
    assert plan.slot == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert plan.next_run_at == datetime(2026, 1, 1, 13, 0, tzinfo=UTC)
    assert plan.skipped == 5  # 07:00 .. 11:00
    on_time = fire_plan("0 * * * *", "UTC", plan.slot, plan.slot + timedelta(seconds=1))
    assert (on_time.slot, on_time.skipped) == (plan.slot, 0)


def test_catch_up_all_works_through_the_missed_slots_in_order() -> None:
    now = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
    due = datetime(2026, 1, 1, 7, 0, tzinfo=UTC)
    fired = []
    while due <= now:
        plan = fire_plan("0 * * * *", "UTC", due, now, catch_up="all")
        fired.append(plan.slot.hour)
        assert plan.next_run_at > plan.slot
        due = plan.next_run_at
    assert fired == [7, 8, 9, 10, 11, 12]


def test_fire_plan_refuses_a_slot_not_yet_due_and_an_unknown_policy() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with pytest.raises(cyclone.ValidationError):
        fire_plan("0 * * * *", "UTC", now + timedelta(hours=1), now)
    with pytest.raises(cyclone.ValidationError, match="'burst'"):
        fire_plan("0 * * * *", "UTC", now, now, catch_up="burst")  # type: ignore[arg-type]


def test_schedule_spec_validates_before_anything_is_written() -> None:
    @cyclone.action("sched_unit_kind", queue="q1", max_attempts=3)
    async def kind(ctx: cyclone.Context, value: object) -> None:
        return None

    wf = cyclone.Workflow("sched_unit_wf")
    wf.node("a", kind)
    config = ClientConfig(handlers=[kind], schema="public", retention=60.0, notify=True)

    def spec(target: object = kind, **options: object) -> ScheduleSpec:
        return config.schedule_spec(
            "s1", target, {"x": 1}, cron="@hourly", location="UTC", options=options
        )

    made = spec()
    assert made.options.queue == "q1"
    assert made.options.max_attempts == 3
    assert made.options.retention == 60.0  # client default
    assert spec(priority=5).options.priority == 5
    pinned = spec(wf)
    assert pinned.def_version == config.compile(wf).def_version
    cases: list[tuple[dict[str, object], str]] = [
        ({"target": wf, "queue": "x"}, "apply to a kind schedule"),
        ({"colour": "red"}, "unknown schedule option"),
        ({"priority": "high"}, "priority"),
        ({"queue": "q" * 300}, "queue"),
        ({"target": 42}, "kind"),
    ]
    for bad, message in cases:
        with pytest.raises(cyclone.ValidationError, match=message):
            spec(**bad)
    with pytest.raises(cyclone.ValidationError, match="input of schedule 's1'"):
        config.schedule_spec("s1", kind, {1, 2}, cron="@hourly", location="UTC", options={})
    with pytest.raises(cyclone.ValidationError, match="schedule id"):
        config.schedule_spec("", kind, None, cron="@hourly", location="UTC", options={})


@pytest.mark.parametrize("cron", ["30 * * * *", "0 * * * *", "*/15 1 * * *", "30 1 * * *"])
def test_catch_up_latest_on_the_fall_back_night_fires_once(cron: str) -> None:
    """Around the repeated hour, the latest slot is found by the forward evaluation
    (the one fires use): after one fire, ``next_run_at`` is in the future, so a second
    pass at the same moment fires nothing."""
    due = local(LA, 2026, 10, 31, 22, 0).astimezone(UTC)  # missed since the evening
    for now_local in (
        local(LA, 2026, 11, 1, 1, 5, fold=1),  # 01:05 PST, the second 01:05
        local(LA, 2026, 11, 1, 1, 50, fold=0),  # 01:50 PDT, the first
        local(LA, 2026, 11, 1, 2, 40),
    ):
        now = now_local.astimezone(UTC)
        plan = fire_plan(parse_cron(cron), LA, due, now)
        assert plan.slot <= now < plan.next_run_at
        forward = [due, *slots_between(parse_cron(cron), LA, due, now + timedelta(microseconds=1))]
        assert plan.slot == forward[-1]
        assert plan.skipped == len(forward) - 1


def test_catch_up_latest_far_behind_is_bounded_and_lands_on_now() -> None:
    """A per-second schedule missed for a day: the walk jumps close to now."""
    now = datetime(2026, 3, 8, 12, 0, 0, 500_000, tzinfo=UTC)
    plan = fire_plan("* * * * * *", LA, now - timedelta(days=1), now)
    assert plan.slot == now.replace(microsecond=0)
    assert plan.next_run_at == plan.slot + timedelta(seconds=1)
    assert plan.skipped == SKIP_COUNT_LIMIT


@pytest.mark.parametrize("zone", [LA, BERLIN, "America/New_York", "Australia/Lord_Howe"])
@pytest.mark.parametrize("cron", ["30 1 * * *", "0 2 * * *", "*/20 * * * *", "30 * * * *"])
def test_next_slot_is_always_in_the_future_across_daylight_saving(zone: str, cron: str) -> None:
    """Every minute of both transition days: the next slot is strictly later (inside a
    repeated hour cronsim may answer with a wall-clock time already past)."""
    tz = ZoneInfo(zone)
    for day in _transition_days(tz, 2026):
        at = datetime(day.year, day.month, day.day, tzinfo=tz).astimezone(UTC)
        for _ in range(24 * 60 + 60):
            slot = next_slot(cron, zone, at)
            assert slot > at, (zone, cron, at)
            at += timedelta(minutes=1)


def _transition_days(tz: ZoneInfo, year: int) -> list[datetime]:
    days = []
    day = datetime(year, 1, 1, 12, tzinfo=tz)
    for _ in range(366):
        following = day + timedelta(days=1)
        if day.utcoffset() != following.utcoffset():
            days.append(day)
        day = following
    return days


def test_a_new_schedule_in_the_repeated_hour_starts_after_now() -> None:
    ny = "America/New_York"
    second_0110 = local(ny, 2026, 11, 1, 1, 10, fold=1).astimezone(UTC)  # 01:10 EST
    slot = next_slot("30 1 * * *", ny, second_0110)
    assert slot == local(ny, 2026, 11, 2, 1, 30).astimezone(UTC)  # tomorrow, not 40 min ago


@pytest.mark.parametrize("bad", ["1" * 5000 + " * * * *", "* " * 600, "localtime-zone-check"])
def test_oversized_and_overflowing_crons_raise_validation_error(bad: str) -> None:
    if bad == "localtime-zone-check":
        with pytest.raises(cyclone.ValidationError, match="'localtime'"):
            resolve_location("localtime")
        return
    with pytest.raises(cyclone.ValidationError, match="cron expression"):
        parse_cron(bad)


# What an America/Los_Angeles session returns around the 2026-11-01 fall-back: psycopg
# gives a timestamptz the session zone (one shared ZoneInfo), fold 0 in the first 01:xx
# (PDT) and fold 1 in the second (PST).
DUE_PDT = local(LA, 2026, 11, 1, 1, 59)  # 01:59 PDT = 08:59 UTC
SEEN_PST = local(LA, 2026, 11, 1, 1, 0, 20, fold=1)  # 01:00:20 PST = 09:00:20 UTC


def test_the_session_values_are_what_the_fall_back_gives() -> None:
    assert DUE_PDT.tzinfo is SEEN_PST.tzinfo
    assert SEEN_PST < DUE_PDT  # Python's wall-clock comparison: the trap
    assert SEEN_PST.astimezone(UTC) - DUE_PDT.astimezone(UTC) == timedelta(minutes=1, seconds=20)


@pytest.mark.parametrize("catch_up", ["latest", "all"])
def test_fire_plan_sees_a_slot_due_before_the_fall_back_as_due_after_it(catch_up: str) -> None:
    """A slot due at 01:59 PDT, seen at 01:00:20 PST (80 s later in real time), fires."""
    plan = fire_plan("59 * * * *", LA, DUE_PDT, SEEN_PST, catch_up=catch_up)  # type: ignore[arg-type]
    # (a time in the repeated hour never equals one of another zone: compare in UTC)
    assert plan.slot == datetime(2026, 11, 1, 8, 59, tzinfo=UTC)  # 01:59 PDT
    assert plan.skipped == 0
    assert plan.next_run_at == datetime(2026, 11, 1, 9, 59, tzinfo=UTC)  # 01:59 PST
    with pytest.raises(cyclone.ValidationError, match="not due"):
        fire_plan("59 * * * *", LA, SEEN_PST, DUE_PDT)  # the other way round: not yet


def test_fire_plan_latest_across_the_fall_back_fires_the_last_slot_seen() -> None:
    """*/15 due at 01:45 PDT, seen at 01:00:20 PST: 01:00 PST is the latest slot."""
    due = local(LA, 2026, 11, 1, 1, 45)
    plan = fire_plan("*/15 * * * *", LA, due, SEEN_PST)
    assert plan.slot == datetime(2026, 11, 1, 9, 0, tzinfo=UTC)  # 01:00 PST
    assert plan.skipped == 1  # 01:45 PDT
    assert plan.next_run_at == datetime(2026, 11, 1, 9, 15, tzinfo=UTC)


def test_latest_slot_in_the_repeated_hour_is_not_an_hour_early() -> None:
    assert latest_slot("* * * * *", LA, SEEN_PST) == datetime(2026, 11, 1, 9, 0, tzinfo=UTC)


def _enable(next_run_at: datetime, now: datetime, cron: str) -> dict[str, object]:
    """Drive set_enabled_plan on a disabled schedule; the schedules_set_enabled params."""
    plan = set_enabled_plan("s", True)
    stmt = next(plan)
    assert stmt.query == Q.schedules_lock
    row = ScheduleRow(
        "s", "k", None, "null", cron, LA, next_run_at, "default", 0, 1, None, None, False, now
    )
    stmt = plan.send([row])
    assert stmt.query == Q.schedules_set_enabled and stmt.params is not None
    with pytest.raises(StopIteration):
        plan.send([("s",)])
    return dict(stmt.params)


def test_enabling_after_the_fall_back_skips_the_slot_that_passed() -> None:
    """Disabled with next_run_at 01:59 PDT, enabled at 01:00:20 PST: that slot passed
    while disabled, so next_run_at moves to the next slot after now (01:59 PST)."""
    params = _enable(DUE_PDT, SEEN_PST, "59 * * * *")
    assert params["next_run_at"] == datetime(2026, 11, 1, 9, 59, tzinfo=UTC)
    # a slot still ahead in real time is kept
    ahead = local(LA, 2026, 11, 1, 1, 30, fold=1)  # 01:30 PST, after 01:59 PDT
    kept = _enable(ahead, DUE_PDT, "30 * * * *")["next_run_at"]
    assert kept == datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


def test_records_carry_instants_so_durations_hold_across_the_fall_back() -> None:
    """A step started at 01:59 PDT and completed at 01:00:20 PST took 80 s, not -59 min;
    a schedule due at 01:59 PDT is overdue at 01:05 PST."""
    started, completed = DUE_PDT, SEEN_PST
    step = StepInfo.from_row(_step_info_row(started, completed))
    assert step.duration == 80.0
    assert step.started_at is not None
    assert step.started_at.utcoffset() == timedelta(0)
    schedule = Schedule.from_row(_schedule_row(DUE_PDT))
    assert schedule.next_run_at.tzinfo is UTC
    table = schedules_table([schedule], local(LA, 2026, 11, 1, 1, 5, fold=1))  # 6 min late
    console = Console(width=200, record=True)
    console.print(table)
    assert "overdue" in console.export_text()


def _step_info_row(started: datetime, completed: datetime) -> dict[str, object]:
    names = [f.name for f in dataclasses.fields(StepInfo)]
    row: dict[str, object] = dict.fromkeys(names)
    row.update(state="completed", started_at=started, completed_at=completed)
    return row


def _schedule_row(next_run_at: datetime) -> dict[str, object]:
    return {
        "id": "s",
        "kind": "k",
        "def_version": None,
        "input": None,
        "cron_spec": "59 * * * *",
        "location": LA,
        "next_run_at": next_run_at,
        "enabled": True,
        "last_run_id": None,
        "last_error": None,
        "consecutive_failures": 0,
        "queue": "default",
        "priority": 0,
        "max_attempts": 1,
        "timeout_s": None,
        "retention_s": None,
        "lease_owner": None,
        "lease_expiry": None,
        "created_at": next_run_at,
        "updated_at": next_run_at,
    }
