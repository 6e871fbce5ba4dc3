"""Cron schedules: parsing, time zones, the pure next-slot function, fire plans.

docs/design.md, Schedules and retention. No I/O: the client validates a schedule with
:class:`ScheduleSpec` before it writes anything and runs the plans here (generators
that yield statements) on its connections; the schedule scanner asks :func:`fire_plan`
which slot to fire and where ``next_run_at`` goes next.

Cron expressions are parsed and evaluated by `cronsim <https://pypi.org/project/cronsim/>`_
(the standard five fields, ``L``, ``#``, names of months and days, and an optional
leading seconds field), with the common macros ``@yearly``, ``@annually``, ``@monthly``,
``@weekly``, ``@daily``, ``@midnight`` and ``@hourly``. Time zones are IANA names
resolved by :mod:`zoneinfo`; ``"Local"`` is the creating machine's zone (from
``tzlocal``), stored by name so every scanner computes the same slots.

Daylight saving (docs/design.md, Schedules and retention): a schedule whose hour field
is a wildcard or a step runs in every real hour (both 01:00s of a fall-back night, none
in the hour a spring-forward night skips); a fixed wall-clock time that does not exist
runs once at the next valid instant (02:30 on a spring-forward day runs at 03:00), and
one that occurs twice runs once, at its first occurrence. This is cronsim's evaluation;
the tests pin it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import cache
from itertools import islice
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

import tzlocal
from cronsim import CronSim, CronSimError

from cyclone.dbio import Plan, Stmt
from cyclone.errors import ConfigurationError, NotFoundError, ValidationError
from cyclone.handlers import Handler
from cyclone.options import JobOptions, check_text, micros
from cyclone.payloads import encode_json
from cyclone.sql import Q
from cyclone.sql.rows import NowRow, ScheduleRow

__all__ = [
    "MACROS",
    "MAX_ID_BYTES",
    "SKIP_COUNT_LIMIT",
    "CatchUp",
    "FirePlan",
    "ScheduleSpec",
    "create_plan",
    "fire_plan",
    "latest_slot",
    "next_slot",
    "parse_cron",
    "resolve_location",
    "set_enabled_plan",
    "slots_between",
    "update_plan",
]

LOCAL = "Local"
"""The location that means "the creating client's time zone"."""

MACROS: Mapping[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""Cron macros and the five-field expressions they stand for."""

CatchUp = Literal["latest", "all"]
"""What a scanner fires for slots missed while no client ran: ``"latest"`` fires only
the most recent missed slot, once; ``"all"`` fires every missed slot, oldest first."""

MAX_ID_BYTES = 256
"""Longest schedule id, in bytes of UTF-8."""

SKIP_COUNT_LIMIT = 10_000
"""Most skipped slots :func:`fire_plan` counts."""

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
_MAX_PAST_CANDIDATES = 10_000
_MAX_CRON_CHARS = 1_000
"""A longer expression is refused (cronsim's cost grows with it)."""
_JUMP_MARGIN = timedelta(hours=3)
"""How far before the reverse-evaluated latest slot a long catch-up walk resumes (more
than any daylight-saving shift, where reverse and forward evaluation may differ)."""


def parse_cron(spec: Any) -> str:
    """The cron expression ``spec`` checked and with a macro expanded.

    Args:
        spec: five fields (minute hour day-of-month month day-of-week), six with a
            leading seconds field, or a macro such as ``"@daily"``.

    Returns:
        The expression cronsim evaluates (a macro replaced by its fields).

    Raises:
        ValidationError: not a string, an unknown macro, or an expression cronsim
            rejects (the message names the expression and the reason).
    """
    if not isinstance(spec, str):
        raise ValidationError(f"cron must be a string, got {spec!r}")
    if len(spec) > _MAX_CRON_CHARS:
        raise ValidationError(
            f"cron expression {spec[:40]!r}... is longer than {_MAX_CRON_CHARS} characters"
        )
    text = " ".join(spec.split())
    if text.startswith("@"):
        if text.lower() not in MACROS:
            raise ValidationError(
                f"cron macro {spec!r} is not supported; use one of {sorted(MACROS)}"
            )
        return MACROS[text.lower()]
    try:
        sim = CronSim(text, _EPOCH)
        next(sim)
    except (CronSimError, ValueError) as exc:
        raise ValidationError(f"cron expression {spec!r} is invalid: {exc}") from None
    except StopIteration:  # pragma: no cover - cronsim raises CronSimError instead
        raise ValidationError(f"cron expression {spec!r} never fires") from None
    return text


def resolve_location(location: Any) -> str:
    """The IANA zone name for ``location``; ``"Local"`` becomes this machine's zone.

    Raises:
        ValidationError: not a string, or a name :mod:`zoneinfo` does not know.
        ConfigurationError: ``"Local"`` and this machine's zone has no IANA name.
    """
    if not isinstance(location, str) or not location:
        raise ValidationError(f"location must be an IANA time zone name, got {location!r}")
    name = location
    if location == LOCAL:
        name = tzlocal.get_localzone_name() or ""
        if not name:
            raise ConfigurationError(
                "this machine's time zone has no IANA name; give location= explicitly"
            )
    _zone(name)
    return name


@cache
def _iana_names() -> frozenset[str]:
    return frozenset(available_timezones()) - {"localtime", "posixrules"}


def _zone(name: str) -> ZoneInfo:
    # Only IANA keys: machine-dependent files such as "localtime" or "posixrules" would
    # let two scanners compute different slots.
    if name not in _iana_names():
        raise ValidationError(f"unknown time zone {name!r} (an IANA name is needed)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValidationError(f"unknown time zone {name!r}") from None


def _instant(value: datetime, name: str) -> datetime:
    """``value`` as an instant in UTC.

    Every datetime that is compared, subtracted or stepped here goes through this first.
    psycopg gives a timestamptz the session's time zone, and Python compares (and
    subtracts) two aware datetimes that share one tzinfo by their wall clocks, fold
    ignored: in a zone with daylight saving, 01:00:20 PST would come before 01:59 PDT,
    which it follows by an hour. In UTC the wall clock is the instant.

    Raises:
        ValidationError: ``value`` is naive.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(f"{name} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


def next_slot(cron: str, location: str, after: datetime) -> datetime:
    """The first slot of ``cron`` in zone ``location`` strictly after ``after``.

    Pure: the same arguments give the same slot on every machine.

    Args:
        cron: an expression as returned by :func:`parse_cron`.
        location: an IANA zone name (not ``"Local"``).
        after: an aware datetime.

    Returns:
        The slot, an aware datetime in UTC.

    Raises:
        ValidationError: a naive ``after``, a bad expression or zone.
    """
    after = _instant(after, "after")
    start = after.astimezone(_zone(location))
    try:
        # Inside a repeated (fall-back) hour cronsim may answer with the first
        # occurrence of a wall-clock time that is already past in absolute time:
        # such a candidate is skipped, so a slot is always in the future of ``after``.
        for candidate in islice(CronSim(cron, start), _MAX_PAST_CANDIDATES):
            slot = candidate.astimezone(UTC)
            if slot > after:
                return slot
    except (CronSimError, ValueError) as exc:
        raise ValidationError(f"cron expression {cron!r} is invalid: {exc}") from None
    raise ValidationError(f"cron expression {cron!r} has no slot after {after}")


def latest_slot(cron: str, location: str, at: datetime) -> datetime:
    """The last slot of ``cron`` in zone ``location`` at or before ``at`` (UTC), by
    cronsim's reverse evaluation: fast, but around a daylight-saving change it may
    differ from the forward evaluation of :func:`next_slot` (which fires use); only
    :func:`fire_plan`'s long catch-up walks use it, to jump close to ``at``."""
    # one microsecond later as an instant, then local: adding to the local time would
    # drop its fold and step an hour back in a repeated hour
    end = (_instant(at, "at") + timedelta(microseconds=1)).astimezone(_zone(location))
    try:
        return next(CronSim(cron, end, reverse=True)).astimezone(UTC)
    except CronSimError as exc:
        raise ValidationError(f"cron expression {cron!r} is invalid: {exc}") from None


def slots_between(cron: str, location: str, start: datetime, end: datetime) -> Iterator[datetime]:
    """Every slot ``s`` with ``start < s < end``, in order, in UTC."""
    end = _instant(end, "end")
    slot = next_slot(cron, location, start)
    while slot < end:
        yield slot
        slot = next_slot(cron, location, slot)


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one fire transaction does: fire ``slot``, then move ``next_run_at``.

    Attributes:
        slot: the slot the run is fired for (the fire row's ``scheduled_for``).
        next_run_at: the schedule's next slot, always after ``slot``.
        skipped: how many missed slots before ``slot`` are not fired (catch-up
            ``"latest"``), 0 when the scanner was on time; counted up to
            :data:`SKIP_COUNT_LIMIT`.
    """

    slot: datetime
    next_run_at: datetime
    skipped: int = 0


def fire_plan(
    cron: str, location: str, due: datetime, now: datetime, catch_up: CatchUp = "latest"
) -> FirePlan:
    """Which slot a scanner fires for a schedule due at ``due``, seen at ``now``.

    With ``catch_up="latest"`` (the default) the most recent slot at or before ``now``
    fires, once, and the slots missed before it are skipped, so a schedule that no
    client ran for a week fires once, not a burst; with ``"all"`` the slot ``due``
    fires and ``next_run_at`` moves to the slot after it, so the scanner works through
    the missed slots in order. Either way ``next_run_at`` moves forward only.

    ``due`` and ``now`` are compared as instants, whatever zone they carry (the
    database session's, as psycopg returns them): across a fall-back night a slot due at
    01:59 PDT is due at 01:00:20 PST, later in real time. The plan's datetimes are UTC.

    Raises:
        ValidationError: ``due`` is after ``now`` (nothing is due), or bad arguments.
    """
    due, now = _instant(due, "due"), _instant(now, "now")
    if due > now:
        raise ValidationError(f"the schedule is not due: next slot {due} is after {now}")
    if catch_up == "all":
        return FirePlan(slot=due, next_run_at=next_slot(cron, location, due))
    if catch_up != "latest":
        raise ValidationError(f"catch_up must be 'latest' or 'all', got {catch_up!r}")
    # Walk forward with next_slot (the one evaluation of the schedule, daylight saving
    # included) to the last slot at or before now; far behind, jump near now first.
    last, count = due, 0
    slot = next_slot(cron, location, due)
    while slot <= now:
        last, count = slot, count + 1
        if count == SKIP_COUNT_LIMIT:
            jump = latest_slot(cron, location, now) - _JUMP_MARGIN
            if jump > slot:
                slot = next_slot(cron, location, jump)
                continue
        slot = next_slot(cron, location, slot)
    return FirePlan(
        slot=last, next_run_at=next_slot(cron, location, last), skipped=min(count, SKIP_COUNT_LIMIT)
    )


_STEP_OPTIONS = ("queue", "priority", "max_attempts", "timeout", "retention")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A validated schedule, ready to be written as one ``cyclone_schedules`` row.

    Attributes:
        id: the schedule's id (primary key).
        kind: the fired kind, or the workflow's name for a workflow schedule.
        def_version: the pinned workflow definition, ``None`` for a kind.
        input: the fired run's input as JSON text.
        cron: the expression (macros expanded).
        location: the IANA zone name (``"Local"`` already resolved).
        options: the fired step's queue, priority, max_attempts, timeout and retention
            (seconds or ``None``); for a workflow its nodes carry their own.
    """

    id: str
    kind: str
    def_version: str | None
    input: str
    cron: str
    location: str
    options: JobOptions

    @classmethod
    def build(
        cls,
        id: Any,
        *,
        kind: str,
        def_version: str | None,
        input: Any,
        cron: Any,
        location: Any,
        handler: Handler | None,
        default_retention: float | None,
        options: Mapping[str, Any],
        defaults: JobOptions | None = None,
        input_is_json: bool = False,
    ) -> ScheduleSpec:
        """Validate every part; ``options`` are step options (kind schedules only).

        Args:
            id: the schedule id (text, at most 256 bytes).
            kind, def_version: the target (``def_version`` set for a workflow).
            input: the fired run's input, a JSON value (JSON text with
                ``input_is_json``).
            cron: a cron expression or macro; location: an IANA zone or ``"Local"``.
            handler: the kind's handler when known (its defaults and input codec).
            default_retention: the client's default retention, seconds or ``None``.
            options: queue, priority, max_attempts, timeout, retention overrides.
            defaults: the option values to override (an update passes the stored
                ones); ``None`` takes the kind's defaults and the client's retention.

        Raises:
            ValidationError: naming the first bad value (id, cron, zone, input, option).
        """
        check_text(id, "schedule id", max_bytes=MAX_ID_BYTES)
        if not id:
            raise ValidationError("schedule id must not be empty")
        expression = parse_cron(cron)
        zone = resolve_location(location)
        unknown = set(options) - set(_STEP_OPTIONS)
        if unknown:
            raise ValidationError(
                f"unknown schedule option(s) {sorted(unknown)}; the options are "
                f"{list(_STEP_OPTIONS)}"
            )
        given = {key: value for key, value in options.items() if value is not None}
        what = f"input of schedule {id!r}"
        if def_version is not None:
            if given:
                raise ValidationError(
                    f"step options {sorted(given)} apply to a kind schedule; the nodes of "
                    f"workflow {kind!r} carry their own"
                )
            job = JobOptions()
            encoded = input if input_is_json else encode_json(input, what)
        else:
            if defaults is None:
                base = handler.options if handler else JobOptions()
                if base.retention is None and default_retention is not None:
                    base = replace(base, retention=default_retention)
            else:
                base = defaults
            job = base.override(**given)
            encode = handler.codec.encode if handler else (lambda v: v)
            encoded = input if input_is_json else encode_json(encode(input), what)
        return cls(
            id=id,
            kind=kind,
            def_version=def_version,
            input=encoded,
            cron=expression,
            location=zone,
            options=job,
        )

    def params(self, next_run_at: datetime) -> dict[str, Any]:
        """The parameters of ``schedules_insert`` / ``schedules_replace``."""
        return {
            "id": self.id,
            "kind": self.kind,
            "def_version": self.def_version,
            "input": self.input,
            "cron_spec": self.cron,
            "location": self.location,
            "next_run_at": next_run_at,
            "queue": self.options.queue,
            "priority": self.options.priority,
            "max_attempts": self.options.max_attempts,
            "timeout_us": micros(self.options.timeout),
            "retention_us": micros(self.options.retention),
        }


def create_plan(spec: ScheduleSpec) -> Plan[None]:
    """Insert ``spec`` with ``next_run_at`` the first slot after the database's now().

    Raises:
        ValidationError: a schedule with that id exists (nothing is written).
    """
    clock: list[NowRow] = yield Stmt(Q.schedules_now)
    first = next_slot(spec.cron, spec.location, clock[0].now)
    if not (yield Stmt(Q.schedules_insert, spec.params(first))):
        raise ValidationError(f"schedule {spec.id!r} already exists")


def update_plan(schedule_id: str, rebuild: Callable[[dict[str, Any]], ScheduleSpec]) -> Plan[None]:
    """Lock the schedule, build its new definition from the current row, write it.

    Run inside a transaction. A changed cron expression or zone starts at the first
    slot after now(); otherwise ``next_run_at`` is kept.

    Raises:
        NotFoundError: no schedule has that id.
        ValidationError: from ``rebuild``; nothing is written.
    """
    rows: list[ScheduleRow] = yield Stmt(Q.schedules_lock, {"id": schedule_id})
    if not rows:
        raise NotFoundError(f"schedule {schedule_id!r} does not exist")
    (row,) = rows
    spec = rebuild(row._asdict())
    next_run_at = row.next_run_at
    if (spec.cron, spec.location) != (row.cron_spec, row.location):
        next_run_at = next_slot(spec.cron, spec.location, row.now)
    yield Stmt(Q.schedules_replace, spec.params(next_run_at))


def set_enabled_plan(schedule_id: str, enabled: bool) -> Plan[None]:
    """Enable (slots missed while disabled are skipped; the failure record and back-off
    are cleared) or disable a schedule; no change when it already is.

    Run inside a transaction.

    Raises:
        NotFoundError: no schedule has that id.
    """
    rows: list[ScheduleRow] = yield Stmt(Q.schedules_lock, {"id": schedule_id})
    if not rows:
        raise NotFoundError(f"schedule {schedule_id!r} does not exist")
    (current,) = rows
    if current.enabled == enabled:
        return  # nothing changes: a due slot of an enabled schedule stays due
    # instants, not the session zone's wall clocks (see fire_plan)
    upcoming = _instant(current.next_run_at, "next_run_at")
    now = _instant(current.now, "now")
    if enabled and upcoming <= now:
        upcoming = next_slot(current.cron_spec, current.location, now)
    yield Stmt(
        Q.schedules_set_enabled,
        {"id": schedule_id, "enabled": enabled, "next_run_at": upcoming},
    )
