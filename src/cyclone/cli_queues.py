"""``cyclone queues``: unfinished work per queue; ``pause NAME`` and ``resume NAME``.

Its own module so that :mod:`cyclone.cli` stays one screen of inspection commands.
The bare command lists the queues as it always did, with a ``paused`` column (and the
``paused`` field in ``--json``); the two subcommands call ``SyncClient.pause_queue`` and
``resume_queue``. Connection options go before or after the subcommand:
``cyclone queues --dsn D pause NAME`` and ``cyclone queues pause NAME --dsn D`` both work.
"""

from __future__ import annotations

import click

from cyclone import monitor, render
from cyclone.cli_options import connection_options, json_option, pooler_option, schema_option

__all__ = ["queues"]

_SUBCOMMANDS = ("pause", "resume")


@click.group(invoke_without_command=True)
@click.option(
    "--dsn",
    envvar="CYCLONE_DSN",
    show_envvar=True,  # also in the missing-option error
    default=None,
    help="PostgreSQL connection string or URL.",
)
@schema_option
@pooler_option
@json_option
@click.pass_context
def queues(ctx: click.Context, dsn: str | None, schema: str, as_json: bool) -> None:
    """Unfinished work per queue: available, running, waiting, oldest age, expired leases,
    paused. `cyclone queues pause NAME` stops claims in a queue; `resume NAME` restarts them."""
    if ctx.invoked_subcommand is not None:
        # options given before the subcommand are its defaults
        if dsn is not None:
            ctx.default_map = {name: {"dsn": dsn, "schema": schema} for name in _SUBCOMMANDS}
        return
    if dsn is None:
        param = next(p for p in ctx.command.params if p.name == "dsn")
        raise click.MissingParameter(ctx=ctx, param=param)
    from cyclone.cli import _database, _listing  # cyclone.cli imports this module

    with _database(dsn, schema) as db:
        stats = db.read(monitor.queue_stats_sync)
    _listing(stats, as_json, render.queues_table, "no unfinished steps in any queue")


@queues.command()
@connection_options
@click.argument("name")
def pause(dsn: str, schema: str, name: str) -> None:
    """Pause queue NAME: no claim that starts after this command returns takes one of its
    steps, on any worker, until `resume`. Running steps finish; new work waits."""
    from cyclone.cli import _database

    with _database(dsn, schema) as db:
        changed = db.client.pause_queue(name)
    click.echo(f"queue {name!r} paused" if changed else f"queue {name!r} was already paused")


@queues.command()
@connection_options
@click.argument("name")
def resume(dsn: str, schema: str, name: str) -> None:
    """Resume paused queue NAME: workers serving it claim its steps again at once."""
    from cyclone.cli import _database

    with _database(dsn, schema) as db:
        changed = db.client.resume_queue(name)
    click.echo(f"queue {name!r} resumed" if changed else f"queue {name!r} was not paused")
