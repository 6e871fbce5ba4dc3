"""Every SQL statement the engine runs, one named block per statement.

The statements live in ``cyclone/sql/<resource>.sql`` as blocks that start with
``-- name: <resource>_<verb>``; they are parsed once at import. Each one is an attribute
of :data:`Q` typed as ``LiteralString``, so a statement glued together from runtime
strings fails type checking, and a misspelt name fails ``mypy``. ``tests/unit`` checks
that the declared names and the files agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from typing import LiteralString

__all__ = [
    "CLAIM_LIMITS",
    "Q",
    "Queries",
    "claim_limit",
    "claim_sql",
    "load_blocks",
    "load_fragments",
]

_MARK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_EXTENDS = re.compile(r"^-- extends: (\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"^([ \t]*)-- use: (\w+)[ \t]*$", re.MULTILINE)
_FILES = (
    "fragments.sql",
    "steps.sql",
    "graph.sql",
    "runs.sql",
    "signals.sql",
    "schedules.sql",
    "notify.sql",
    "migrate.sql",
    "monitor.sql",
    "dashboard.sql",
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


class Queries:
    """The named statements, loaded from the package's ``.sql`` files."""

    # steps.sql
    steps_enqueue: LiteralString
    steps_enqueue_woken: LiteralString
    steps_find_unique: LiteralString
    steps_enqueue_many: LiteralString
    steps_enqueue_keyed: LiteralString
    steps_find_submit_keys: LiteralString
    steps_claim: LiteralString
    steps_sequence_lock: LiteralString
    steps_sequence_release: LiteralString
    steps_heartbeat: LiteralString
    steps_complete: LiteralString
    steps_outputs: LiteralString
    steps_release_mismatch: LiteralString
    steps_retry: LiteralString
    steps_discard: LiteralString
    steps_release: LiteralString
    steps_sweep_candidates: LiteralString
    steps_reclaim: LiteralString
    steps_reclaim_discard: LiteralString
    steps_list: LiteralString
    steps_timers_due: LiteralString
    steps_signal_timeouts_due: LiteralString
    steps_discard_wait: LiteralString
    steps_fan_outs_lock: LiteralString
    steps_fan_outs_state: LiteralString
    steps_release_items: LiteralString
    steps_fan_out_collect: LiteralString
    steps_discard_fan_out: LiteralString
    steps_children_to_start: LiteralString
    steps_children_done: LiteralString
    steps_discard_child: LiteralString
    steps_orphaned_children: LiteralString
    steps_tx_backend: LiteralString
    steps_end_tx_backend: LiteralString
    # graph.sql
    graph_advance: LiteralString
    graph_expand_fan_outs: LiteralString
    graph_restore: LiteralString
    graph_resolve_discard: LiteralString
    # runs.sql
    runs_lock: LiteralString
    runs_submit: LiteralString
    runs_find_submit_key: LiteralString
    runs_fail_deadline: LiteralString
    runs_pause: LiteralString
    runs_resume: LiteralString
    runs_retry: LiteralString
    runs_read_committed: LiteralString
    runs_cancel: LiteralString
    runs_cancel_children: LiteralString
    runs_get: LiteralString
    runs_list: LiteralString
    runs_purge_plan: LiteralString
    runs_purge: LiteralString
    runs_purge_older: LiteralString
    runs_state: LiteralString
    # signals.sql
    signals_run_lock: LiteralString
    signals_waits: LiteralString
    signals_unconsumed: LiteralString
    signals_insert: LiteralString
    signals_consume: LiteralString
    signals_ready_runs: LiteralString
    # schedules.sql
    schedules_now: LiteralString
    schedules_insert: LiteralString
    schedules_lock: LiteralString
    schedules_replace: LiteralString
    schedules_set_enabled: LiteralString
    schedules_delete: LiteralString
    schedules_list: LiteralString
    schedules_claim: LiteralString
    schedules_fired: LiteralString
    schedules_pass_over: LiteralString
    schedules_failed: LiteralString
    # notify.sql
    notify_publish: LiteralString
    notify_available: LiteralString
    notify_listen: LiteralString
    notify_listen_done: LiteralString
    notify_unlisten_done: LiteralString
    # migrate.sql
    migrate_lock: LiteralString
    migrate_version_table: LiteralString
    migrate_applied: LiteralString
    migrate_current: LiteralString
    migrate_record: LiteralString
    # monitor.sql
    monitor_queues: LiteralString
    monitor_kinds: LiteralString
    monitor_steps: LiteralString
    monitor_run_deps: LiteralString
    # dashboard.sql
    dashboard_queue_stats: LiteralString
    dashboard_active_runs: LiteralString
    dashboard_throughput: LiteralString
    dashboard_statement_timeout: LiteralString
    dashboard_now: LiteralString
    dashboard_unserved_kinds: LiteralString
    dashboard_recent_failures: LiteralString
    dashboard_runs: LiteralString
    dashboard_runs_between: LiteralString
    dashboard_run_created: LiteralString
    dashboard_run: LiteralString
    dashboard_run_steps: LiteralString
    dashboard_run_items: LiteralString
    dashboard_run_deps: LiteralString
    dashboard_run_children: LiteralString
    dashboard_run_signals: LiteralString
    dashboard_run_states: LiteralString
    dashboard_step: LiteralString
    dashboard_step_value: LiteralString
    dashboard_run_items_page: LiteralString
    dashboard_kinds: LiteralString
    dashboard_kinds_finished: LiteralString
    dashboard_workers: LiteralString
    dashboard_schedules: LiteralString

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
        for name, statement in found.items():
            setattr(self, name, statement)


Q = Queries()
"""The loaded statements; ``Q.steps_claim`` and so on."""

CLAIM_LIMITS = (
    *(1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 25, 32, 40, 50, 64, 80, 100, 128, 160),
    *(200, 256, 320, 400, 500, 640, 800, 1000),
)
"""The ``LIMIT`` values a claim statement is written with (at most 1.25x apart)."""

_CLAIMS: dict[int, LiteralString] = {
    n: Q.steps_claim.replace("%(limit)s", str(n)) for n in CLAIM_LIMITS
}


def claim_limit(wanted: int) -> int:
    """The largest of :data:`CLAIM_LIMITS` not above ``wanted`` (``wanted`` >= 1)."""
    return max(n for n in CLAIM_LIMITS if n <= max(1, wanted))


def claim_sql(limit: int) -> LiteralString:
    """``steps_claim`` with its ``LIMIT`` written as the constant ``limit``, one of
    :data:`CLAIM_LIMITS`.

    A prepared claim settles on its generic plan, and a generic plan of ``LIMIT $n`` is
    priced for a tenth of the rows the claim index may return (dearer than any custom
    plan, so PostgreSQL would plan every claim afresh; and with a large backlog, hash
    joins over whole tables); a constant limit keeps it planned for the rows it takes.
    The texts are made here, once, from the statement of ``steps.sql`` and the
    integers above: nothing from outside reaches them.

    Raises:
        KeyError: ``limit`` is not one of :data:`CLAIM_LIMITS`.
    """
    return _CLAIMS[limit]
