"""``manage.py cyclone COMMAND ...``: the ``cyclone`` command, configured by Django.

Every command of ``cyclone`` (``runs``, ``run``, ``steps``, ``worker``, ``cancel``,
``queues``, ``migrate``, ``dashboard``, ...) with its own arguments and options, as
``cyclone --help`` lists them. The database is ``settings.CYCLONE["DSN"]``, else the
``default`` database of ``settings.DATABASES`` (unless ``--dsn`` is given); ``worker``
runs ``settings.CYCLONE["APP"]`` when no APP is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from django.core.management.base import BaseCommand, CommandError

from cyclone.contrib.django import config

__all__ = ["Command", "cli_arguments", "run_cli"]

_DJANGO_OPTIONS = ("--settings", "--pythonpath")
"""Options of every management command that ``manage.py`` has already applied."""


class Command(BaseCommand):
    help = (
        "Run a command of the cyclone CLI (worker, runs, run, steps, cancel, ...) on the "
        "database of settings.CYCLONE['DSN'], else of the default database; "
        "worker runs settings.CYCLONE['APP'] when given no APP. "
        "`manage.py cyclone --help` lists the commands."
    )
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "args", nargs=argparse.REMAINDER, metavar="COMMAND", help="cyclone's command"
        )

    def run_from_argv(self, argv: list[str]) -> None:
        """Hand everything after ``manage.py cyclone`` to the ``cyclone`` command (its
        own options included, ``--help`` too), leaving out ``--settings`` and
        ``--pythonpath``, which ``manage.py`` has applied already; exits with its
        status when it fails. A malformed ``settings.CYCLONE`` is one line on stderr
        (``CommandError: ...``, status 1), as Django's own commands report errors."""
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        try:
            code = run_cli(_without_django_options(argv[2:]), prog_name=prog)
        except CommandError as exc:
            print(f"CommandError: {exc}", file=sys.stderr)
            sys.exit(exc.returncode)
        if code:
            sys.exit(code)

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("cyclone", "runs", "--json")``.

        Raises:
            CommandError: the command failed (its message is on stderr already);
                ``returncode`` is its exit status.
        """
        code = run_cli(list(args), prog_name="manage.py cyclone")
        if code:
            raise CommandError(
                f"cyclone {' '.join(args)} exited with status {code}", returncode=code
            )


def cli_arguments(args: Sequence[str]) -> list[str]:
    """``args`` with ``settings.CYCLONE["APP"]`` added to a ``worker`` command given no
    APP (unchanged otherwise).

    Raises:
        ConfigurationError: ``settings.CYCLONE`` is malformed.
    """
    from cyclone.cli import main

    args = list(args)
    at = _command_index(main, args)
    if at is None or args[at] != "worker":
        return args
    app = config.app()
    if app is None:
        return args
    rest = args[at + 1 :]
    try:
        parsed = main.commands["worker"].make_context("worker", rest, resilient_parsing=True)
    except click.ClickException:  # a bad option: the command itself reports it
        return args
    return args if parsed.params.get("app") else [*args, app]


def _command_index(group: click.Group, args: list[str]) -> int | None:
    """Where the command's name is in ``args`` (after the group's own options, such as
    ``--log-level debug``); ``None`` when there is none."""
    valued = {
        name
        for param in group.params
        if isinstance(param, click.Option) and not param.is_flag
        for name in param.opts
    }
    skip = False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif not arg.startswith("-"):
            return index
    return None


@contextmanager
def _dsn_in_environment(dsn: str | None) -> Iterator[None]:
    """``$CYCLONE_DSN`` (which the commands read when given no ``--dsn``) set to ``dsn``
    (when not ``None``) for the duration of the block, then as it was."""
    if dsn is None:
        yield
        return
    before = os.environ.get("CYCLONE_DSN")
    os.environ["CYCLONE_DSN"] = dsn
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CYCLONE_DSN", None)
        else:
            os.environ["CYCLONE_DSN"] = before


def run_cli(args: Sequence[str], *, prog_name: str = "manage.py cyclone") -> int:
    """Run the ``cyclone`` command with ``args`` on the project's Cyclone database;
    its exit status (0: success).

    Raises:
        CommandError: ``settings.CYCLONE`` is malformed, or (without ``--dsn``) names no
            database Cyclone can use.
    """
    from cyclone.cli import main
    from cyclone.errors import ConfigurationError

    given = any(arg == "--dsn" or arg.startswith("--dsn=") for arg in args)
    try:
        dsn = None if given else config.dsn()
        full = cli_arguments(args)
    except ConfigurationError as exc:
        raise CommandError(str(exc)) from exc
    with _dsn_in_environment(dsn):
        try:
            main.main(args=full, prog_name=prog_name, standalone_mode=True)
        except SystemExit as stop:
            return _status(stop.code)
    return 0


def _status(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _without_django_options(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _DJANGO_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{option}=" for option in _DJANGO_OPTIONS)):
            out.append(arg)
    return out
