"""Where the demo keeps its embedded PostgreSQL, and how ``cyclone demo --clean``
removes it.

Without a reachable server the demo starts an embedded one (``pgserver``) whose data
folder it keeps between demos (the data set is loaded once). PostgreSQL refuses to run
as root: run as root, ``pgserver`` runs the server as a system user ``pgserver``,
which it adds (``useradd``) the first time, gives it the data folder, and opens every
parent folder of the data folder to other users (read and traverse). So that this
touches no private folder, root's data folder is under ``/var/tmp``; any other user's
is under ``~/.cache/cyclone``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["clean_embedded", "embedded_dir"]


def embedded_dir() -> Path:
    """The demo's embedded data folder: ``/var/tmp/cyclone-demo-postgres`` for root,
    ``~/.cache/cyclone/demo-postgres`` for any other user."""
    if os.geteuid() == 0:
        return Path("/var/tmp/cyclone-demo-postgres")
    return Path.home() / ".cache" / "cyclone" / "demo-postgres"


def clean_embedded(folder: Path | None = None) -> list[str]:
    """Delete the embedded server's data folder (the server is not running: the demo
    stops it at its end); lines saying what was removed and what is left to do.

    Raises:
        OSError: the folder could not be removed (the message names it).
    """
    folder = folder or embedded_dir()
    lines = []
    if folder.exists():
        shutil.rmtree(folder)
        lines.append(f"removed the demo's embedded PostgreSQL data folder {folder}")
    else:
        lines.append(f"no embedded data folder at {folder}: nothing to remove")
    if os.geteuid() == 0 and shutil.which("userdel"):
        lines.append(
            "the embedded server ran as the system user 'pgserver'; remove it with "
            "`userdel pgserver` if nothing else uses it"
        )
    return lines
