"""The ``cyclone`` command (also ``python -m cyclone``).

python-api.md, Command line. Commands read the database from ``--dsn`` or the
``CYCLONE_DSN`` environment variable. Errors print one line and exit non-zero.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from typing import Any

import click
import psycopg

from cyclone.client import Client
from cyclone.errors import CycloneError
from cyclone.handlers import Handler
from cyclone.migrate import migrate as run_migrate

__all__ = ["load_client", "main"]

log = logging.getLogger("cyclone.cli")


class _Group(click.Group):
    """Turns Cyclone and connection errors into one line and exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (CycloneError, psycopg.Error) as exc:
            raise click.ClickException(str(exc).strip().splitlines()[0]) from exc


dsn_option = click.option(
    "--dsn",
    envvar="CYCLONE_DSN",
    required=True,
    help="PostgreSQL connection string or URL (default: $CYCLONE_DSN).",
)
schema_option = click.option(
    "--schema", default="public", show_default=True, help="Postgres schema of Cyclone's tables."
)


@click.group(cls=_Group)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
def main(log_level: str) -> None:
    """Cyclone: durable jobs and workflows on PostgreSQL."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@main.command()
@dsn_option
@schema_option
def migrate(dsn: str, schema: str) -> None:
    """Create or upgrade Cyclone's tables (safe to run at every start)."""
    applied = run_migrate(dsn, schema=schema)
    if applied:
        click.echo(f"applied migrations {', '.join(str(v) for v in applied)}")
    else:
        click.echo("schema is up to date")


def load_client(app: str) -> Client:
    """Import ``module:attribute`` and return the :class:`Client` it names.

    The attribute may be a ``Client`` or a function of no arguments returning one.

    Raises:
        click.BadParameter: the path is malformed, the import fails, or the attribute
            is not a client.
    """
    module_name, _, attribute = app.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected module:attribute, got {app!r}", param_hint="APP")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="APP") from exc
    target = getattr(module, attribute, None)
    if callable(target) and not isinstance(target, Client | Handler):
        try:
            target = target()
        except TypeError as exc:  # a function that needs arguments is not a factory
            raise click.BadParameter(
                f"{app!r} is not a cyclone.Client nor a function of no arguments returning "
                f"one: {exc}",
                param_hint="APP",
            ) from exc
    if not isinstance(target, Client):
        raise click.BadParameter(f"{app!r} is not a cyclone.Client", param_hint="APP")
    return target


async def _serve(client: Client) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            log.info("second signal: releasing running steps now")
            client.hurry()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal)
    try:
        async with client:
            log.info("worker running; SIGTERM or Ctrl-C stops it gracefully")
            await stop.wait()
            log.info(
                "stopping: draining running steps (up to %.0f s; signal again to release them now)",
                client.shutdown_grace,
            )
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


@main.command()
@click.argument("app")
def worker(app: str) -> None:
    """Run the workers of APP (module:client) until SIGTERM, then drain gracefully."""
    sys.path.insert(0, "")
    client = load_client(app)
    if not client.handlers:
        raise click.UsageError(f"{app} registers no handlers; a worker would have nothing to run")
    asyncio.run(_serve(client))
    if client.threads_running:
        # Their steps were given back and their late completion will be refused;
        # waiting for the threads would only stretch the shutdown past its grace.
        log.warning("exiting with %d sync handler thread(s) still running", client.threads_running)
        logging.shutdown()
        os._exit(0)
