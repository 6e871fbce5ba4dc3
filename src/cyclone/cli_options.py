"""The options the ``cyclone`` commands share: how a command reaches Cyclone's tables
(``--dsn``, ``--schema``, ``--pooler``) and how it prints (``--json``, ``--limit``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from cyclone.connections import POOLER_ENV, POOLERS

__all__ = ["connection_options", "json_option", "limit_option", "pooler_option"]

F = TypeVar("F", bound=Callable[..., Any])

dsn_option = click.option(
    "--dsn",
    envvar="CYCLONE_DSN",
    required=True,
    help="PostgreSQL connection string or URL (default: $CYCLONE_DSN).",
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
