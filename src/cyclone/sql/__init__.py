"""Every SQL statement the engine runs, one named block per statement.

The statements live in ``cyclone/sql/<resource>.sql`` as blocks that start with
``-- name: <resource>_<verb>``; they are parsed once at import. Each one is an attribute
of :data:`Q`, a :class:`Query` that carries the statement's text (a ``LiteralString``,
so a statement glued together from runtime strings fails type checking) and the type of
its rows (:mod:`cyclone.sql.rows`, or a public record): a misspelt name or a row read
by a field it does not have fails ``mypy``, and a column list that no longer matches the
declared type fails when the statement first returns rows. ``tests/unit`` checks that
the declared names and the files agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Generic, LiteralString, TypeVar, get_args, get_type_hints

from cyclone.records import KindStats, QueueStats, Run, Schedule, Step, StepInfo
from cyclone.sql.dashboard_rows import (
    ActiveRunsRow,
    ChildRunRow,
    CreatedRow,
    EdgeRow,
    FailureRow,
    ItemCountRow,
    ItemLineRow,
    KindFinishedRow,
    KindLineRow,
    LiveStatesRow,
    MailboxRow,
    MinuteRow,
    RunLineRow,
    RunPageRow,
    ScheduleLineRow,
    StepLineRow,
    StepValuesRow,
    UnservedRow,
    ValueRow,
    WorkerRow,
)
from cyclone.sql.flow_rows import KindNameRow, LimitedRow, LimitsRow, StoredLimitsRow
from cyclone.sql.rows import (
    BackendRow,
    ChildDoneRow,
    ChildStartRow,
    ClaimRow,
    CountRow,
    DepRow,
    DiscardRow,
    EnqueuedRow,
    FailedFireRow,
    FanOutRow,
    FiredRow,
    GraphRow,
    HeartbeatRow,
    IdRow,
    KeyedEnqueuedRow,
    KeyIdRow,
    NowRow,
    OutputRow,
    ParentRow,
    PausedRow,
    QueueRow,
    ResumedRow,
    RetryRow,
    RunCancelledRow,
    RunStateRow,
    RunVersionRow,
    ScheduleRow,
    SignalRow,
    SignalTimeoutRow,
    SnoozeRow,
    StateRow,
    StepNameRow,
    StepQueueRow,
    StepRunRow,
    SubmitKeyRow,
    SweepRow,
    TerminatedRow,
    TextRow,
    VersionRow,
    WaitRow,
    WokenEnqueuedRow,
)

R = TypeVar("R")

__all__ = [
    "CLAIM_LIMITS",
    "Q",
    "Queries",
    "Query",
    "claim_limit",
    "claim_limited_sql",
    "claim_sql",
    "load_blocks",
    "load_fragments",
]

_MARK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_EXTENDS = re.compile(r"^-- extends: (\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"^([ \t]*)-- use: (\w+)[ \t]*$", re.MULTILINE)
_FILES = (
    "fragments.sql",
    "enqueue.sql",
    "steps.sql",
    "claims.sql",
    "limits.sql",
    "waits.sql",
    "graph.sql",
    "runs.sql",
    "purge.sql",
    "signals.sql",
    "schedules.sql",
    "notify.sql",
    "migrate.sql",
    "monitor.sql",
    "dashboard.sql",
    "queues.sql",
    "testing.sql",
)


def _statement(raw: str) -> str:
    """A block's text without its comment lines, blank lines and final semicolon."""
    return (
        "\n".join(
            line for line in raw.splitlines() if line.strip() and not line.lstrip().startswith("--")
        )
        .rstrip()
        .rstrip(";")
    )


def _marked(text: str) -> list[tuple[str, str, str]]:
    """The blocks of ``text`` in order: ``(kind, name, raw text)``, kind ``name`` or
    ``fragment``."""
    marks = list(_MARK.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [
        (m.group(1), m.group(2), text[m.end() : end]) for m, end in zip(marks, ends, strict=False)
    ]


def _expand(raw: str, fragments: Mapping[str, str]) -> str:
    """``raw`` with each ``-- use: <fragment>`` line replaced by the fragment's text,
    every line of it indented as the ``use`` line is."""

    def use(match: re.Match[str]) -> str:
        indent, name = match.group(1), match.group(2)
        if name not in fragments:
            raise KeyError(f"SQL fragment {name!r} is used but never defined")
        return "\n".join(indent + line for line in fragments[name].splitlines())

    return _USE.sub(use, raw)


def load_blocks(text: str, fragments: Mapping[str, str] | None = None) -> dict[str, str]:
    """Split the text of one ``.sql`` file into ``{name: statement}``.

    A block runs from its ``-- name:`` line to the next ``-- name:`` or ``-- fragment:``
    line; comment lines and surrounding blank lines are kept out of the statement text.

    - A ``-- fragment: <name>`` block is a piece of SQL shared by several statements
      (a CTE, a guard, a column list), written once: a statement line
      ``-- use: <name>`` stands for it, indented as that line is. Fragments come from
      ``fragments`` (those of other files) and from this text; a fragment may use
      another defined before it. Fragments are not statements and are not returned.
    - A block with an ``-- extends: <base>`` line (a block earlier in the file) is the
      base statement with its last ``SELECT`` (from the last line that starts with
      ``SELECT``) replaced by the block's own text: a statement that differs from
      another only in what it returns.

    Raises:
        KeyError: an ``extends`` line names no earlier block, or a ``use`` line names no
            fragment.
    """
    known = dict(fragments or {})
    blocks: dict[str, str] = {}
    for kind, name, text_of in _marked(text):
        raw = _expand(text_of, known)
        if kind == "fragment":
            known[name] = _statement(raw)
            continue
        body = _statement(raw)
        base = _EXTENDS.search(raw)
        if base is not None:
            head = blocks[base.group(1)]
            body = head[: head.rindex("\nSELECT ") + 1] + body
        blocks[name] = body
    return blocks


def load_fragments(text: str, fragments: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``-- fragment:`` blocks of one ``.sql`` file, ``{name: text}``, added to
    ``fragments`` (a fragment here may use those).

    Raises:
        KeyError: a ``use`` line names no fragment defined before it.
    """
    known = dict(fragments or {})
    for kind, name, raw in _marked(text):
        if kind == "fragment":
            known[name] = _statement(_expand(raw, known))
    return known


@dataclass(frozen=True, slots=True)
class Query(Generic[R]):
    """One statement: its ``name``, its ``sql`` and the type of its rows.

    ``row`` is a :class:`typing.NamedTuple` of :mod:`cyclone.sql.rows` (made from the
    columns in order, after a check that their names are the tuple's fields), a record
    with a ``from_row(dict)`` class method (made from the columns by name), or
    ``NoneType`` for a statement whose rows, if any, are not read.
    """

    name: str
    sql: LiteralString
    row: type[R]

    def with_sql(self, sql: LiteralString) -> Query[R]:
        """This statement with another text of the same columns (a variant the loader
        or :func:`claim_sql` writes, never one built from runtime values)."""
        return Query(self.name, sql, self.row)

    @staticmethod
    def plain(sql: LiteralString) -> Query[None]:
        """A statement that is not a named block and whose rows are not read
        (transaction control, session settings)."""
        return Query("plain", sql, type(None))


class Queries:
    """The named statements, loaded from the package's ``.sql`` files."""

    # enqueue.sql
    steps_enqueue: Query[EnqueuedRow]
    steps_enqueue_woken: Query[WokenEnqueuedRow]
    steps_find_unique: Query[EnqueuedRow]
    steps_enqueue_many: Query[EnqueuedRow]
    steps_enqueue_keyed: Query[KeyedEnqueuedRow]
    steps_find_submit_keys: Query[SubmitKeyRow]
    # claims.sql
    steps_claim: Query[ClaimRow]
    steps_claim_fair: Query[ClaimRow]
    steps_claim_limited: Query[LimitedRow]
    steps_claim_limited_fair: Query[LimitedRow]
    steps_claim_admit: Query[ClaimRow]
    # limits.sql
    limits_write: Query[LimitsRow]
    limits_limited: Query[KindNameRow]
    limits_list: Query[StoredLimitsRow]
    # steps.sql
    steps_sequence_lock: Query[None]
    steps_sequence_release: Query[IdRow]
    steps_heartbeat: Query[HeartbeatRow]
    steps_complete: Query[GraphRow]
    steps_outputs: Query[OutputRow]
    steps_release_mismatch: Query[StepQueueRow]
    steps_retry: Query[IdRow]
    steps_discard: Query[IdRow]
    steps_release: Query[StepQueueRow]
    steps_sweep_candidates: Query[SweepRow]
    steps_reclaim: Query[StepQueueRow]
    steps_reclaim_discard: Query[IdRow]
    steps_list: Query[Step]
    steps_get: Query[Step]
    steps_tx_backend: Query[BackendRow]
    steps_end_tx_backend: Query[TerminatedRow]
    steps_snooze: Query[SnoozeRow]
    steps_snooze_discard: Query[IdRow]
    # waits.sql
    steps_timers_due: Query[StepRunRow]
    steps_signal_timeouts_due: Query[SignalTimeoutRow]
    steps_discard_waiting: Query[StepNameRow]
    steps_fan_outs_lock: Query[IdRow]
    steps_fan_outs_state: Query[FanOutRow]
    steps_release_items: Query[QueueRow]
    steps_fan_out_collect: Query[TextRow]
    steps_children_to_start: Query[ChildStartRow]
    steps_children_done: Query[ChildDoneRow]
    steps_orphaned_children: Query[ParentRow]
    # graph.sql
    graph_advance: Query[GraphRow]
    graph_expand_fan_outs: Query[GraphRow]
    graph_restore: Query[GraphRow]
    graph_resolve_discard: Query[DiscardRow]
    # runs.sql
    runs_lock: Query[IdRow]
    runs_submit: Query[IdRow]
    runs_find_submit_key: Query[RunVersionRow]
    runs_fail_deadline: Query[RunCancelledRow]
    runs_pause: Query[PausedRow]
    runs_resume: Query[ResumedRow]
    runs_retry: Query[RetryRow]
    runs_read_committed: Query[None]
    runs_cancel: Query[RunCancelledRow]
    runs_cancel_children: Query[GraphRow]
    runs_get: Query[Run]
    runs_list: Query[Run]
    runs_state: Query[StateRow]
    # purge.sql
    runs_purge_plan: Query[None]
    runs_purge: Query[IdRow]
    runs_purge_older: Query[IdRow]
    # signals.sql
    signals_run_lock: Query[RunStateRow]
    signals_waits: Query[WaitRow]
    signals_unconsumed: Query[SignalRow]
    signals_insert: Query[IdRow]
    signals_consume: Query[IdRow]
    signals_ready_runs: Query[IdRow]
    # schedules.sql
    schedules_now: Query[NowRow]
    schedules_insert: Query[KeyIdRow]
    schedules_lock: Query[ScheduleRow]
    schedules_replace: Query[KeyIdRow]
    schedules_set_enabled: Query[KeyIdRow]
    schedules_delete: Query[KeyIdRow]
    schedules_list: Query[Schedule]
    schedules_claim: Query[ScheduleRow]
    schedules_fired: Query[FiredRow]
    schedules_pass_over: Query[KeyIdRow]
    schedules_failed: Query[FailedFireRow]
    # notify.sql
    notify_publish: Query[None]
    notify_available: Query[None]
    notify_listen: Query[None]
    notify_listen_done: Query[None]
    notify_unlisten_done: Query[None]
    # migrate.sql
    migrate_lock: Query[None]
    migrate_version_table: Query[None]
    migrate_applied: Query[VersionRow]
    migrate_current: Query[VersionRow]
    migrate_record: Query[None]
    # monitor.sql
    monitor_queues: Query[QueueStats]
    monitor_kinds: Query[KindStats]
    monitor_steps: Query[StepInfo]
    monitor_run_deps: Query[DepRow]
    monitor_schedules_overdue: Query[CountRow]
    # dashboard.sql
    dashboard_queue_stats: Query[QueueStats]
    dashboard_active_runs: Query[ActiveRunsRow]
    dashboard_throughput: Query[MinuteRow]
    dashboard_statement_timeout: Query[None]
    dashboard_now: Query[NowRow]
    dashboard_unserved_kinds: Query[UnservedRow]
    dashboard_recent_failures: Query[FailureRow]
    dashboard_runs: Query[RunLineRow]
    dashboard_runs_between: Query[RunLineRow]
    dashboard_run_created: Query[CreatedRow]
    dashboard_run: Query[RunPageRow]
    dashboard_run_steps: Query[StepLineRow]
    dashboard_run_items: Query[ItemCountRow]
    dashboard_run_deps: Query[EdgeRow]
    dashboard_run_children: Query[ChildRunRow]
    dashboard_run_signals: Query[MailboxRow]
    dashboard_run_states: Query[LiveStatesRow]
    dashboard_step: Query[StepValuesRow]
    dashboard_step_value: Query[ValueRow]
    dashboard_run_items_page: Query[ItemLineRow]
    dashboard_kinds: Query[KindLineRow]
    dashboard_kinds_finished: Query[KindFinishedRow]
    dashboard_workers: Query[WorkerRow]
    dashboard_schedules: Query[ScheduleLineRow]
    # queues.sql
    queues_pause: Query[QueueRow]
    queues_resume: Query[QueueRow]
    # testing.sql
    testing_shift_steps: Query[CountRow]
    testing_shift_runs: Query[CountRow]
    testing_shift_buckets: Query[CountRow]
    testing_available_steps: Query[Step]

    def __init__(self) -> None:
        declared = set(self.__class__.__annotations__)
        texts = [
            resources.files(__package__).joinpath(filename).read_text("utf-8")
            for filename in _FILES
        ]
        fragments: dict[str, str] = {}
        for text in texts:
            fragments = load_fragments(text, fragments)
        found: dict[str, str] = {}
        for text in texts:
            found.update(load_blocks(text, fragments))
        if set(found) != declared:
            missing = sorted(declared - set(found))
            extra = sorted(set(found) - declared)
            raise RuntimeError(f"SQL blocks out of step: missing {missing}, undeclared {extra}")
        hints = get_type_hints(type(self))
        for name, statement in found.items():
            (row,) = get_args(hints[name])
            setattr(self, name, Query(name, statement, row))


Q = Queries()
"""The loaded statements; ``Q.steps_claim`` and so on."""

CLAIM_LIMITS = (
    *(1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 160),
    *(200, 256, 320, 400, 500, 640, 800, 1000),
)
"""The ``LIMIT`` values a claim statement is written with (at most 1.25x apart)."""


def _with_limits(query: Query[R]) -> dict[int, Query[R]]:
    """``query`` with its ``%(limit)s`` written as each constant of CLAIM_LIMITS."""
    return {n: query.with_sql(query.sql.replace("%(limit)s", str(n))) for n in CLAIM_LIMITS}


_CLAIMS = {False: _with_limits(Q.steps_claim), True: _with_limits(Q.steps_claim_fair)}
_LIMITED_CLAIMS = {
    False: _with_limits(Q.steps_claim_limited),
    True: _with_limits(Q.steps_claim_limited_fair),
}


def claim_limit(wanted: int) -> int:
    """The largest of :data:`CLAIM_LIMITS` not above ``wanted`` (``wanted`` >= 1)."""
    return max(n for n in CLAIM_LIMITS if n <= max(1, wanted))


def claim_sql(limit: int, fair: bool = False) -> Query[ClaimRow]:
    """``steps_claim`` (``steps_claim_fair`` when ``fair``) with its ``LIMIT`` written as
    the constant ``limit``, one of :data:`CLAIM_LIMITS`.

    A prepared claim settles on its generic plan, and a generic plan of ``LIMIT $n`` is
    priced for a tenth of the rows the claim index may return (dearer than any custom
    plan, so PostgreSQL would plan every claim afresh; and with a large backlog, hash
    joins over whole tables); a constant limit keeps it planned for the rows it takes.
    The texts are made here, once, from the statement of ``steps.sql`` and the
    integers above: nothing from outside reaches them.

    Raises:
        KeyError: ``limit`` is not one of :data:`CLAIM_LIMITS`.
    """
    return _CLAIMS[fair][limit]


def claim_limited_sql(limit: int, fair: bool = False) -> Query[LimitedRow]:
    """``steps_claim_limited`` (``steps_claim_limited_fair`` when ``fair``) with its
    ``LIMIT`` written as the constant ``limit``, as :func:`claim_sql` writes
    ``steps_claim``.

    Raises:
        KeyError: ``limit`` is not one of :data:`CLAIM_LIMITS`.
    """
    return _LIMITED_CLAIMS[fair][limit]
