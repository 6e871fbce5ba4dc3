"""``cyclone dashboard``: serve the web dashboard (:mod:`cyclone.dashboard`).

Its own module so that the ``cyclone`` command stays importable, and quick to start,
without the ``dashboard`` extra: Starlette, Jinja2 and uvicorn are imported only when
the command runs.
"""

from __future__ import annotations

import click

from cyclone.cli_options import connection_options
from cyclone.migrate import check_schema

__all__ = ["dashboard"]


@click.command()
@connection_options
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8484, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--token",
    envvar="CYCLONE_DASHBOARD_TOKEN",
    default=None,
    help="Token every request must carry (Authorization: Bearer, or the login page); "
    "required to bind anything but a loopback address (default: $CYCLONE_DASHBOARD_TOKEN).",
)
@click.option("--read-only", is_flag=True, help="Refuse every action (cancel, retry, ...).")
@click.option(
    "--allow-host",
    "allow_hosts",
    multiple=True,
    help="A host name the dashboard is reached by, besides loopback and --host (repeatable).",
)
def dashboard(
    *,
    dsn: str,
    schema: str,
    host: str,
    port: int,
    token: str | None,
    read_only: bool,
    allow_hosts: tuple[str, ...],
) -> None:
    """Serve the web dashboard (runs, DAGs, steps, queues, schedules, workers)."""
    try:
        import uvicorn

        from cyclone.dashboard import create_app
        from cyclone.dashboard.security import is_loopback
    except ImportError as exc:
        raise click.ClickException(
            "the dashboard needs its extra: pip install -e '.[dashboard]' in a checkout of "
            f"Cyclone ({exc})"
        ) from None
    if not is_loopback(host) and not token:
        raise click.UsageError(
            f"binding {host!r} exposes the dashboard beyond this machine: give --token "
            "(or $CYCLONE_DASHBOARD_TOKEN)"
        )
    check_schema(dsn, schema=schema)  # unreachable, or no schema: one line saying why
    wildcard = host in ("0.0.0.0", "::")
    # Bound to every address (behind the token), any Host name reaches it, unless
    # --allow-host names the ones to accept.
    hosts = [*allow_hosts] or (["*"] if wildcard else [])
    if not wildcard:
        hosts.append(host)
    app = create_app(dsn, token=token, read_only=read_only, schema=schema, allowed_hosts=hosts)
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"Cyclone dashboard on http://{shown}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)
