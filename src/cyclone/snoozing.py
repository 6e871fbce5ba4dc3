"""A handler's ``Snooze``: its step given back for later, without using an attempt.

``raise cyclone.Snooze(delay)`` comes to a :class:`Snoozed` (decided in pure code here,
from the exception and the kind's ``max_snoozes``), which the completer writes
(:meth:`cyclone.completer.Completer.snooze`) in one or two steps:

1. :func:`snooze_stmt` (``steps_snooze``), one CAS on the held step: back to
   ``available`` at ``now() + delay`` on the database clock (``paused`` in a paused
   run), ``snoozes + 1``, the lease cleared; ``attempt``, ``error``, ``error_kind`` and
   ``panic_stack`` untouched. It changes the step only while ``snoozes <
   max_snoozes``; most snoozes end here.
2. When it changed nothing (the step is at its limit, or the lease is gone),
   :func:`snooze_limit_stmts`: the discard transaction of a failure (``runs_lock``,
   ``steps_snooze_discard``, ``graph_resolve_discard``, and ``runs_cancel_children``
   for a definition with child nodes), the step discarded with ``error_kind =
   'snooze_limit'`` (its execution a failed attempt, as a ``Discard``'s is), its run
   resolved as for any discard. That changes nothing either when the lease is gone: a
   stale snooze.

Only the worker holding the step changes ``snoozes``, so nothing moves it between the
two steps. A snooze is not a failure: observers and spans see the execution as
``released`` (a ``snooze_limit`` as ``discarded``).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from cyclone.dbio import Results, Stmt, int_array
from cyclone.errors import Snooze
from cyclone.graph import cancel_children_stmt
from cyclone.options import micros
from cyclone.payloads import clean_text
from cyclone.sql import Q
from cyclone.sql.rows import SnoozeRow
from cyclone.transitions import Claimed

__all__ = [
    "Snoozed",
    "snooze_limit_applied",
    "snooze_limit_stmts",
    "snooze_stmt",
    "snoozed_of",
]

_MAX_STACK_CHARS = 32_000


@dataclass(frozen=True, slots=True)
class Snoozed:
    """How a handler's ``Snooze`` is recorded.

    ``delay``: seconds until the step is due again; ``max_snoozes``: the kind's limit
    (a step that already snoozed that many times is discarded instead);
    ``panic_stack``: where the handler raised it, kept only if the step is discarded.
    """

    delay: float
    max_snoozes: int
    panic_stack: str | None = None


def snoozed_of(exc: Snooze, max_snoozes: int) -> Snoozed:
    """The :class:`Snoozed` that ``exc``, raised by a handler of a kind that allows
    ``max_snoozes`` snoozes per step, comes to."""
    stack = clean_text("".join(traceback.format_exception(exc)))
    return Snoozed(exc.delay, max_snoozes, stack[-_MAX_STACK_CHARS:])


def _params(step: Claimed, snoozed: Snoozed) -> dict[str, Any]:
    return {
        "id": step.id,
        "owner": step.owner,
        "generation": step.generation,
        "max_snoozes": snoozed.max_snoozes,
    }


def snooze_stmt(step: Claimed, snoozed: Snoozed) -> Stmt[SnoozeRow]:
    """Give the held ``step`` back until ``now() + snoozed.delay`` (``steps_snooze``);
    no row back: the step is at its limit (then :func:`snooze_limit_stmts`), or stale."""
    return Stmt(Q.steps_snooze, {**_params(step, snoozed), "delay_us": micros(snoozed.delay)})


def snooze_limit_stmts(step: Claimed, snoozed: Snoozed) -> list[Stmt[Any]]:
    """The one transaction that discards the held ``step`` past its ``max_snoozes``
    (``error_kind = 'snooze_limit'``) and resolves its run as any discard does; read
    its results with :func:`snooze_limit_applied` and ``parse_advanced``."""
    stmts: list[Stmt[Any]] = [
        Stmt(Q.runs_lock, {"run_ids": int_array([step.run_id])}),
        Stmt(
            Q.steps_snooze_discard, {**_params(step, snoozed), "panic_stack": snoozed.panic_stack}
        ),
        Stmt(Q.graph_resolve_discard, {"run_id": step.run_id, "step_id": step.id}),
    ]
    if step.has_children:
        stmts.append(cancel_children_stmt([step.run_id]))
    return stmts


def snooze_limit_applied(results: Results) -> bool:
    """Whether :func:`snooze_limit_stmts` discarded the step (``False``: a stale
    snooze, the lease was lost before it)."""
    return bool(results.of(Q.steps_snooze_discard))
