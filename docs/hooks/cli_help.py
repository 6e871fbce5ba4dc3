"""MkDocs hook: fills docs/reference/cli.md with the help of every ``cyclone`` command.

The page holds the marker ``<!-- cyclone-cli-help -->``; this hook replaces it with
the text ``cyclone --help`` and ``cyclone COMMAND --help`` print, read from the click
group itself, so the page always matches the installed command line.
"""

from __future__ import annotations

from typing import Any

import click

MARKER = "<!-- cyclone-cli-help -->"


def _sections(command: click.Command, name: str, parent: click.Context | None) -> list[str]:
    """One section per command under ``command`` (itself first), depth first."""
    ctx = click.Context(command, info_name=name, parent=parent, max_content_width=88)
    ctx.terminal_width = 88
    level = "#" * min(ctx.command_path.count(" ") + 2, 4)
    out = [f"{level} `{ctx.command_path}`\n\n```text\n{command.get_help(ctx)}\n```\n"]
    if isinstance(command, click.Group):
        for sub_name in sorted(command.list_commands(ctx)):
            sub = command.get_command(ctx, sub_name)
            if sub is not None and not sub.hidden:
                out.extend(_sections(sub, sub_name, ctx))
    return out


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace the marker of the command-line page with every command's help."""
    if MARKER not in markdown:
        return markdown
    from cyclone.cli import main

    return markdown.replace(MARKER, "\n".join(_sections(main, "cyclone", None)))
