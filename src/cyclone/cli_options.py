"""The options of the ``cyclone`` commands: how a command reaches Cyclone's tables
(``--dsn``, ``--schema``, ``--pooler``), how it prints (``--json``, ``--limit``), and the
worker's slots (``--slots``, ``--queue``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cyclone.connections import POOLER_ENV, POOLERS
from cyclone.errors import ValidationError
from cyclone.options import check_int, check_queue
from cyclone.sizing import MAX_SLOTS

__all__ = ["connection_options", "json_option", "limit_option", "pooler_option", "slot_options"]

F = TypeVar("F", bound=Callable[..., Any])

dsn_option = click.option(
    "--dsn",
    envvar="CYCLONE_DSN",
    show_envvar=True,  # also in the missing-option error
    required=True,
    help="PostgreSQL connection string or URL.",
)
schema_option = click.option(
    "--schema", default="public", show_default=True, help="Postgres schema of Cyclone's tables."
)


def _set_pooler(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # Through the environment, so that every client of this process (and of the worker
    # processes the demo starts) applies it, the app's own clients included.
    if value:
        os.environ[POOLER_ENV] = value


pooler_option = click.option(
    "--pooler",
    type=click.Choice(POOLERS),
    envvar=POOLER_ENV,
    expose_value=False,
    callback=_set_pooler,
    help="'transaction' when the DSN goes through a transaction-mode pooler such as "
    "PgBouncer (default: $CYCLONE_POOLER, else 'session').",
)


def connection_options(command: F) -> F:
    """``--dsn``, ``--schema`` and ``--pooler``: how a command reaches Cyclone's tables."""
    return dsn_option(schema_option(pooler_option(command)))


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON (for scripts) instead of a table."
)
limit_option = click.option(
    "--limit", default=50, show_default=True, type=int, help="Show at most this many rows."
)


def _queue_slots(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, int]:
    """``--queue NAME=SLOTS`` values as queue -> slots (the last of a name wins).

    Raises:
        click.BadParameter: no ``=``, slots not an integer from 1 to ``MAX_SLOTS``, or
            a bad queue name (empty, NUL, over 256 bytes); it names the value.
    """
    parsed: dict[str, int] = {}
    for value in values:
        name, equals, count = value.rpartition("=")
        try:
            if not equals:
                raise ValidationError("expected NAME=SLOTS")
            try:
                slots = int(count)
            except ValueError:
                raise ValidationError(
                    f"slots of queue {name!r} must be an integer, got {count!r}"
                ) from None
            check_queue(name)
            parsed[name] = check_int(slots, f"slots of queue {name!r}", 1, MAX_SLOTS)
        except ValidationError as exc:
            raise click.BadParameter(f"{value!r}: {exc}", ctx, param) from None
    return parsed


slots_option = click.option(
    "--slots",
    type=click.IntRange(1, MAX_SLOTS),
    help="Worker slots of every queue the client serves (default: its own queues=).",
)
queue_option = click.option(
    "--queue",
    "queue_slots",
    metavar="NAME=SLOTS",
    multiple=True,
    callback=_queue_slots,
    help="Worker slots of queue NAME, which is served even if the client does not "
    "serve it; repeatable, applied after --slots.",
)


def slot_options(command: F) -> F:
    """``--slots N`` and ``--queue NAME=SLOTS`` (``slots``, ``queue_slots``): the
    worker's slots, in place of the client's ``queues=``."""
    return slots_option(queue_option(command))
