"""The dashboard's actions on runs, schedules and queues, through the client calls the
CLI uses.

Each action is a :class:`cyclone.Client` call (``cancel``, ``pause``, ``resume``,
``retry``, ``signal``, ``purge``, ``enable_schedule``, ``disable_schedule``,
``pause_queue``, ``resume_queue``), so it
raises what the CLI's command raises: :class:`cyclone.NotFoundError` for an unknown
run, :class:`cyclone.StateError` when the run's state forbids it,
:class:`cyclone.ValidationError` for a bad value. :func:`status_of` maps them to HTTP
statuses (404, 409, 422). Bodies are checked here first: a bad body writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cyclone.client import Client
from cyclone.errors import (
    CycloneError,
    DatabaseUnavailable,
    NotFoundError,
    StateError,
    ValidationError,
)
from cyclone.options import check_text

__all__ = [
    "RUN_ACTIONS",
    "parse_payload",
    "perform",
    "purge",
    "set_queue_paused",
    "set_schedule",
    "status_of",
]

RUN_ACTIONS = ("cancel", "pause", "resume", "retry", "signal")
"""The actions on one run, each at ``POST /api/runs/{id}/<action>``."""
_FIELDS: dict[str, frozenset[str]] = {
    "cancel": frozenset(),
    "pause": frozenset(),
    "resume": frozenset(),
    "retry": frozenset({"node"}),
    "signal": frozenset({"name", "payload"}),
}
_DONE = {"cancel": "cancelled", "pause": "paused", "resume": "resumed"}


def status_of(exc: CycloneError) -> int:
    """The HTTP status of an action's error: 404 not found, 409 state, 422 bad value,
    503 the database out of reach, 400 anything else Cyclone raised."""
    if isinstance(exc, DatabaseUnavailable):
        return 503
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, StateError):
        return 409
    if isinstance(exc, ValidationError):
        return 422
    return 400


def parse_payload(text: str) -> Any:
    """A signal payload typed into a form: JSON text; empty means ``null``.

    Raises:
        ValidationError: not JSON (the message quotes it and says where it breaks).
    """
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"payload {text[:200]!r} is not JSON: {exc.msg} at character {exc.pos + 1}"
            ' (a JSON string needs its quotes, as in "yes")'
        ) from None
    except RecursionError:
        raise ValidationError(f"payload {text[:200]!r} is JSON nested too deep") from None


def _check_body(action: str, body: Any) -> Mapping[str, Any]:
    if action not in _FIELDS:
        raise NotFoundError(f"no action {action!r}; the actions are {list(RUN_ACTIONS)}")
    if not isinstance(body, dict):
        raise ValidationError(f"the body must be a JSON object, got {body!r}"[:300])
    extra = sorted(set(body) - _FIELDS[action])
    if extra:
        raise ValidationError(
            f"{action} takes {sorted(_FIELDS[action]) or 'no fields'}, got {extra}"
        )
    return body


async def perform(client: Client, run_id: int, action: str, body: Any) -> str:
    """Run ``action`` on run ``run_id`` with ``body`` (the API's JSON object: ``{}``;
    ``{"node": ...}`` for a retry below a node; ``{"name": ..., "payload": ...}`` for a
    signal); a sentence saying what happened.

    Raises:
        NotFoundError: no such run (or no such action).
        StateError: the run's state forbids the action, or a signal was not stored
            (the run is finished, or its wait is complete or full).
        ValidationError: a bad body, node, signal name or payload.
    """
    fields = _check_body(action, body)
    if action == "retry":
        node = fields.get("node")
        if node is not None and not isinstance(node, str):
            raise ValidationError(f"node must be a string, got {node!r}")
        reset = await client.retry(run_id, node or None)
        below = f" (node {node!r} and below)" if node else ""
        return f"run {run_id} reopened: {reset} step(s) reset{below}"
    if action == "signal":
        name = fields.get("name")
        if not isinstance(name, str):
            raise ValidationError(f"name must be a signal name (a string), got {name!r}")
        check_text(name, "signal name")
        stored = await client.signal(run_id, name, fields.get("payload"))
        if not stored:
            raise StateError(
                f"signal {name!r} not stored: run {run_id} is finished, or its wait for "
                f"{name!r} is complete or has all the signals it takes"
            )
        return f"signal {name!r} stored in the mailbox of run {run_id}"
    await getattr(client, action)(run_id)
    return f"run {run_id} {_DONE[action]}"


async def purge(client: Client, older_than: str) -> str:
    """Purge terminal runs (past their retention, or finished ``older_than`` seconds
    ago when given); a sentence with the count.

    Raises:
        ValidationError: ``older_than`` is not a number of seconds >= 0.
    """
    limit: float | None = None
    if older_than.strip():
        try:
            limit = float(older_than)
        except ValueError:
            raise ValidationError(
                f"older than must be a number of seconds, got {older_than!r}"
            ) from None
    deleted = await client.purge(older_than=limit)
    return f"purged {deleted} run(s)"


async def set_queue_paused(client: Client, name: str, paused: bool) -> str:
    """Pause or resume queue ``name`` (``Client.pause_queue`` / ``resume_queue``); a
    sentence saying what happened (nothing changes for a queue already in that state).

    Raises:
        ValidationError: a bad queue name (empty, NUL, over 256 bytes); nothing written.
    """
    if paused:
        changed = await client.pause_queue(name)
        return f"queue {name!r} paused" if changed else f"queue {name!r} was already paused"
    changed = await client.resume_queue(name)
    return f"queue {name!r} resumed" if changed else f"queue {name!r} was not paused"


async def set_schedule(client: Client, schedule_id: str, enabled: bool) -> str:
    """Enable or disable a schedule; a sentence saying which.

    Raises:
        NotFoundError: no schedule has that id.
    """
    if enabled:
        await client.enable_schedule(schedule_id)
    else:
        await client.disable_schedule(schedule_id)
    return f"schedule {schedule_id!r} {'enabled' if enabled else 'disabled'}"
