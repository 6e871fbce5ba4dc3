"""``cyclone worker APP``: run the handlers of an application's client until SIGTERM.

Its own module so that :mod:`cyclone.cli` stays one screen of inspection commands. The
worker's logs go to stderr as text lines or JSON objects (``--log-format``, at the
level of ``cyclone --log-level``); with ``--metrics-port`` it also serves Prometheus
metrics (the ``prometheus`` extra, imported only then).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import click

from cyclone.cli_options import pooler_option, slot_options
from cyclone.client import Client
from cyclone.errors import ConfigurationError
from cyclone.handlers import Handler
from cyclone.hosts import is_loopback
from cyclone.observability.logs import LOG_FORMATS, configure_logging
from cyclone.sizing import DEFAULT_SLOTS, DEFAULT_TX_SLOTS

if TYPE_CHECKING:
    from cyclone.observability.serve import MetricsServer

__all__ = ["DEFAULT_ATTRIBUTE", "load_client", "worker"]

log = logging.getLogger("cyclone.cli")


DEFAULT_ATTRIBUTE = "client"
"""The attribute ``cyclone worker APP`` takes when APP names a module only."""


def _split_app(app: str) -> tuple[str, str]:
    """``(module or file, attribute)`` of an APP argument; a bare module or file means
    its :data:`DEFAULT_ATTRIBUTE`.

    Raises:
        click.BadParameter: APP is empty, or its attribute is not a Python identifier.
    """
    where, colon, attribute = app.rpartition(":")
    if not colon or "/" in attribute or "\\" in attribute:  # a bare module, or C:\app.py
        where, attribute = app, DEFAULT_ATTRIBUTE
    if not where or not attribute.isidentifier():
        raise click.BadParameter(
            f"expected module:attribute, file.py:attribute or a bare module, got {app!r}",
            param_hint="APP",
        )
    return where, attribute


def _is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or os.sep in where


def _import_file(where: str) -> ModuleType:
    """Import the Python file ``where`` under its dotted name: its folder, or the first
    folder above it that is not a package (has no ``__init__.py``), goes first on
    ``sys.path``, so that its own imports (relative ones too) work as in the app.

    Raises:
        click.BadParameter: no such file, or its import fails.
    """
    path = Path(where).resolve()
    if path.suffix != ".py" or not path.is_file():
        raise click.BadParameter(f"no Python file {where!r}", param_hint="APP")
    parts = [path.stem] if path.stem != "__init__" else []
    folder = path.parent
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        parts.insert(0, folder.name)
        folder = folder.parent
    if not parts:
        raise click.BadParameter(f"{where!r} names no module", param_hint="APP")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return _import_module(".".join(parts), shown=where)


def _import_module(name: str, *, shown: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {shown!r}: {exc}", param_hint="APP") from exc


def _needs_arguments(factory: Callable[..., Any]) -> bool:
    """Whether calling ``factory()`` with no arguments is bound to fail."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have none: try the call
        return False
    try:
        signature.bind()
    except TypeError:
        return True
    return False


def load_client(app: str) -> Client:
    """The :class:`Client` that ``app`` names.

    ``app`` is ``package.module:attribute``, ``path/to/file.py:attribute``, or a bare
    module or file, which means its attribute ``client``. The attribute is a ``Client``,
    or a plain function of no arguments returning one (called once). A coroutine
    function is refused without being called.

    Raises:
        click.BadParameter: APP is malformed, the module or file cannot be imported, it
            has no such attribute, or the attribute is not a client (a coroutine function,
            a function needing arguments, anything else); one line naming APP.
    """
    where, attribute = _split_app(app)
    module = _import_file(where) if _is_file(where) else _import_module(where, shown=where)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        hint = f" (a bare {where!r} means {where}:{DEFAULT_ATTRIBUTE})" if ":" not in app else ""
        raise click.BadParameter(
            f"{where!r} has no attribute {attribute!r}{hint}", param_hint="APP"
        ) from None
    named = f"{where}:{attribute}"
    if isinstance(target, Client):
        return target
    if isinstance(target, Handler) or not callable(target):
        raise click.BadParameter(
            f"{named!r} is not a cyclone.Client (it is {_kind_of(target)})", param_hint="APP"
        )
    if _is_async(target):
        raise click.BadParameter(
            f"{named!r} is not a cyclone.Client but {_is_async(target)} (not called): "
            "name the client, or a plain function of no arguments that returns one",
            param_hint="APP",
        )
    if _needs_arguments(target):
        raise click.BadParameter(
            f"{named!r} is not a cyclone.Client nor a function of no arguments returning "
            "one: it takes arguments",
            param_hint="APP",
        )
    made = target()
    if inspect.isawaitable(made):
        if inspect.iscoroutine(made):
            made.close()  # never run: no "was never awaited" warning
        raise click.BadParameter(
            f"{named}() returned an awaitable, not a cyclone.Client (a factory must be a "
            "plain function)",
            param_hint="APP",
        )
    if not isinstance(made, Client):
        raise click.BadParameter(
            f"{named}() returned {_kind_of(made)}, not a cyclone.Client", param_hint="APP"
        )
    return made


def _is_async(target: Any) -> str:
    """What async function ``target`` is (``"a coroutine function"``, ``"an async
    generator function"``), a partial of one or an object whose ``__call__`` is one
    included; ``""`` for anything else. ``target`` is callable."""
    found = [target]
    if not inspect.isroutine(target) and not inspect.isclass(target):
        found.append(type(target).__call__)
    if any(inspect.isasyncgenfunction(f) for f in found):
        return "an async generator function"
    return "a coroutine function" if any(inspect.iscoroutinefunction(f) for f in found) else ""


def _kind_of(value: object) -> str:
    """``value`` for an error line: ``the handler of kind 'k'``, ``None``, ``an int``."""
    if value is None:
        return "None"
    if isinstance(value, Handler):
        return f"the handler of kind {value.kind!r}"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


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


_WORKER_HELP = f"""Run the handlers of APP's client until SIGTERM, then drain gracefully.

APP names the application's cyclone.Client: package.module:attribute,
path/to/file.py:attribute, or a bare package.module (or file), which means its
attribute `{DEFAULT_ATTRIBUTE}`. The attribute may also be a plain function of no
arguments that returns the client.

Database: the one the client was built with (its conninfo or pool, with its schema);
this command has no --dsn. --pooler (else $CYCLONE_POOLER) applies unless the
client was given pooler=.

Queues and slots: the client's queues= (by default every queue of its kinds and
workflows, {DEFAULT_SLOTS} slots each); --slots N gives each of those N slots, then
each --queue NAME=SLOTS sets one queue, served even if the client does not serve it.
Completion transactions open at once: the client's tx_slots (by default the total of
slots, at most {DEFAULT_TX_SLOTS})."""


@click.command(help=_WORKER_HELP, short_help="Run the handlers of APP's client until SIGTERM.")
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
    """``cyclone worker APP`` (its help is :data:`_WORKER_HELP`)."""
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
