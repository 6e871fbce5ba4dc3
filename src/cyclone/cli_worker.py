"""``cyclone worker APP``: run the handlers of an application's client until SIGTERM.

Its own module so that :mod:`cyclone.cli` stays one screen of inspection commands. The
worker's logs go to stderr as text lines or JSON objects (``--log-format``, at the
level of ``cyclone --log-level``); with ``--metrics-port`` it also serves Prometheus
metrics (the ``prometheus`` extra, imported only then).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

import click

from cyclone.cli_options import pooler_option, slot_options
from cyclone.client import Client
from cyclone.errors import ConfigurationError
from cyclone.handlers import Handler
from cyclone.hosts import is_loopback
from cyclone.observability.logs import LOG_FORMATS, configure_logging

if TYPE_CHECKING:
    from cyclone.observability.serve import MetricsServer

__all__ = ["load_client", "worker"]

log = logging.getLogger("cyclone.cli")


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
    """Run ``client``'s engine until SIGTERM or SIGINT, then drain it; a second signal
    gives the running steps back at once."""
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


def _check_metrics_flags(port: int | None, host: str, token: str | None, with_db: bool) -> None:
    """Refuse metrics flags that do not go together, or that this installation cannot
    serve, before anything starts.

    Raises:
        click.UsageError: ``--metrics-db`` without ``--metrics-port``, or a host that is
            not a loopback one without a token (the message names the host).
        click.ClickException: ``--metrics-port`` without prometheus_client installed.
    """
    if port is None:
        if with_db:
            raise click.UsageError("--metrics-db needs --metrics-port")
        return
    if not is_loopback(host) and not token:
        raise click.UsageError(
            f"--metrics-host {host!r} exposes the metrics beyond this machine: give "
            "--metrics-token (or $CYCLONE_METRICS_TOKEN)"
        )
    from cyclone.observability.metrics import prometheus

    try:
        prometheus()  # imports prometheus_client, or names the extra to install
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None


def _start_metrics(
    client: Client, *, host: str, port: int, token: str | None, with_db: bool
) -> MetricsServer:
    """Serve ``client``'s metrics (and with ``with_db`` the database gauges read on its
    DSN) from a fresh registry at ``http://host:port/metrics``; print where.

    Raises:
        click.ClickException: the address cannot be bound (the port is taken, the
            address is not this machine's).
        ConfigurationError: the server refuses the host without a token.
    """
    # imported here: prometheus_client is an extra (_check_metrics_flags found it)
    from prometheus_client import CollectorRegistry

    from cyclone.observability.metrics import register_database_metrics, register_metrics
    from cyclone.observability.serve import start_metrics_server

    registry = register_metrics(client, CollectorRegistry())
    if with_db:
        settings = client.settings
        register_database_metrics(
            settings.conninfo, registry, schema=settings.schema, pooler=settings.pooler
        )
    try:
        server = start_metrics_server(registry, host=host, port=port, token=token)
    except OSError as exc:  # the port is taken, the address is not this machine's
        raise click.ClickException(
            f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
        ) from None
    click.echo(f"metrics on {server.url}")  # for a person at the terminal
    log.info("metrics on %s", server.url, extra={"metrics_url": server.url})  # for a log pipeline
    return server


@click.command()
@click.argument("app")
@slot_options
@pooler_option
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="Log lines on stderr as text, or as one JSON object each (time, level, logger, "
    "message, and run_id, step_id, node, kind, queue, attempt for a line about a step); "
    "the level is cyclone --log-level.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port at /metrics (0: any free port, printed); "
    "needs the prometheus extra (default: no metrics server).",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    help="Address the metrics server binds.",
)
@click.option(
    "--metrics-token",
    envvar="CYCLONE_METRICS_TOKEN",
    default=None,
    help="Bearer token every scrape must carry; required to bind anything but a loopback "
    "address (default: $CYCLONE_METRICS_TOKEN).",
)
@click.option(
    "--metrics-db",
    is_flag=True,
    help="Also export the database gauges (queue depths and ages, expired leases, overdue "
    "schedules), read on the worker's DSN.",
)
@click.pass_context
def worker(
    ctx: click.Context,
    *,
    app: str,
    slots: int | None,
    queue_slots: dict[str, int],
    log_format: str,
    metrics_port: int | None,
    metrics_host: str,
    metrics_token: str | None,
    metrics_db: bool,
) -> None:
    """Run the workers of APP (module:client) until SIGTERM, then drain gracefully."""
    _check_metrics_flags(metrics_port, metrics_host, metrics_token, metrics_db)
    configure_logging(ctx.find_root().params.get("log_level") or "info", log_format)
    sys.path.insert(0, "")
    client = load_client(app)
    if not client.handlers:
        raise click.UsageError(f"{app} registers no handlers; a worker would have nothing to run")
    if slots is not None or queue_slots:
        queues = dict.fromkeys(client.queues, slots) if slots is not None else dict(client.queues)
        client.set_queues({**queues, **queue_slots})
    server = None
    if metrics_port is not None:
        server = _start_metrics(
            client, host=metrics_host, port=metrics_port, token=metrics_token, with_db=metrics_db
        )
    try:
        asyncio.run(_serve(client))
    finally:
        if server is not None:
            server.close()
    if client.threads_running:
        # Their steps were given back and their late completion will be refused;
        # waiting for the threads would only stretch the shutdown past its grace.
        log.warning("exiting with %d sync handler thread(s) still running", client.threads_running)
        logging.shutdown()
        os._exit(0)
