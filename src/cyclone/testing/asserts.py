"""Assertions on what is enqueued: :func:`assert_enqueued`."""

from __future__ import annotations

import json
from typing import Any

from cyclone.client import Client
from cyclone.dbio import Stmt, fetch_async
from cyclone.handlers import Handler
from cyclone.options import check_queue, check_text
from cyclone.payloads import PLAIN, encode_json
from cyclone.records import Step
from cyclone.sql import Q
from cyclone.testing.inline import check_client

__all__ = ["ANY", "assert_enqueued"]

MAX_MATCHED = 10_000
"""Available steps of the kind one assertion reads at most (and matches against)."""

SHOWN = 20
"""Available steps a failed assertion lists at most."""


class _Any:
    """Matches any input (the default of ``input=``)."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
"""The default of ``input=``: any input matches."""


def _expected_input(value: Any) -> Any:
    """``value`` as the stored JSON reads back (dataclasses and pydantic models as
    their JSON, tuples as lists)."""
    return json.loads(encode_json(PLAIN.encode(value), "input of assert_enqueued"))


def _describe(step: Step) -> str:
    text = json.dumps(step.input, sort_keys=True, default=str)
    if len(text) > 200:
        text = text[:197] + "..."
    when = step.scheduled_at.isoformat(timespec="seconds")
    return (
        f"  kind {step.kind!r} queue {step.queue!r} input {text} "
        f"(run {step.run_id}, step {step.id}, attempt {step.attempt}, due {when})"
    )


async def assert_enqueued(
    client: Client, kind: Handler | str, *, input: Any = ANY, queue: str | None = None
) -> Step:
    """Assert that a step of ``kind`` is enqueued: ``available``, due now or later
    (a job, a workflow step whose upstream completed, a retry waiting for its backoff),
    with ``input`` and in ``queue`` when given.

    Args:
        client: the :class:`cyclone.Client` whose database to read.
        kind: the kind (a handler or its name).
        input: the step's input, compared with the stored JSON value (default: any).
        queue: the step's queue (default: any).

    Returns:
        The first such step (the oldest), as ``list_steps`` shows it.

    Raises:
        AssertionError: no available step matches; the message lists what is
            available (at most 20 steps).
        ValidationError: ``client`` is not a ``cyclone.Client``, ``kind`` is not a
            handler or a kind name, ``queue`` is not a queue name, or ``input`` is not
            a JSON value.
    """
    checked = check_client(client, "assert_enqueued")
    name = kind.kind if isinstance(kind, Handler) else check_text(kind, "kind")
    if queue is not None:
        check_queue(queue)
    wanted = input if input is ANY else _expected_input(input)
    async with checked._connection() as conn:
        of_kind = await _available(conn, name, MAX_MATCHED)
        for step in of_kind:
            if (queue is None or step.queue == queue) and (wanted is ANY or step.input == wanted):
                return step
        shown = of_kind[:SHOWN] if of_kind else await _available(conn, None, SHOWN)
    what = f"kind {name!r}"
    if wanted is not ANY:
        what += f" with input {json.dumps(wanted, sort_keys=True)}"
    if queue is not None:
        what += f" in queue {queue!r}"
    if not shown:
        raise AssertionError(f"no step of {what} is enqueued: no step is available")
    which = f"of kind {name!r}" if of_kind else "(none of that kind)"
    listed = "\n".join(_describe(step) for step in shown)
    note = f", the oldest {SHOWN} shown" if len(shown) >= SHOWN else ""
    raise AssertionError(f"no step of {what} is enqueued; available steps {which}{note}:\n{listed}")


async def _available(conn: Any, kind: str | None, limit: int) -> list[Step]:
    """The available steps of ``kind`` (``None``: of every kind), oldest first."""
    return await fetch_async(conn, Stmt(Q.testing_available_steps, {"kind": kind, "limit": limit}))
