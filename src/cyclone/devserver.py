"""Finding a PostgreSQL server for examples and the demo, embedded if need be.

In order: the ``CYCLONE_DSN`` environment variable; a local server at 127.0.0.1:5432
(users ``postgres`` then ``root``, databases ``test`` then ``postgres``); an embedded
server from the ``pgserver`` package (``pip install -e '.[embedded]'``) in a data
folder that :class:`DevServer` reports. Not for production: there, pass your DSN.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from cyclone.errors import ConfigurationError

__all__ = ["DevServer", "find_server"]

_LOCAL = [
    f"host=127.0.0.1 port=5432 user={user} dbname={db} connect_timeout=3"
    for user in ("postgres", "root")
    for db in ("test", "postgres")
]


@dataclass
class DevServer:
    """A reachable server: its ``dsn``, and for an embedded one its ``data_dir``."""

    dsn: str
    data_dir: str | None = None
    _handle: Any = None
    keep_data: bool = False

    @property
    def embedded(self) -> bool:
        """True when this process started the server (``pgserver``)."""
        return self._handle is not None

    def stop(self) -> None:
        """Stop an embedded server and delete its data folder, unless it was asked to
        keep it (no-op for a server this process did not start)."""
        if self._handle is not None:
            self._handle.cleanup()
            self._handle = None
            if self.data_dir is not None and not self.keep_data:
                shutil.rmtree(self.data_dir, ignore_errors=True)


def _reachable(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def find_server(
    *, env_var: str = "CYCLONE_DSN", allow_embedded: bool = True, data_dir: str | None = None
) -> DevServer:
    """A server to use: the DSN in ``env_var``, the local one, or an embedded one.

    Args:
        env_var: the environment variable that may hold a DSN.
        allow_embedded: start an embedded server when nothing else is reachable.
        data_dir: the embedded server's data folder, kept at :meth:`DevServer.stop`
            (its parent must exist); default a new temporary folder, deleted at stop.

    Raises:
        ConfigurationError: nothing reachable and ``pgserver`` is not installed.
    """
    given = os.environ.get(env_var)
    if given:
        return DevServer(given)
    for dsn in _LOCAL:
        if _reachable(dsn):
            return DevServer(dsn)
    if not allow_embedded:
        raise ConfigurationError("no PostgreSQL reachable; set CYCLONE_DSN")
    try:
        with _no_runtime_dir_warning():
            pgserver: Any = importlib.import_module("pgserver")
    except ImportError as exc:
        raise ConfigurationError(
            f"no PostgreSQL reachable at 127.0.0.1:5432 and {env_var} is not set; "
            "install the embedded server with: pip install -e '.[embedded]' "
            "(it needs Python 3.11 or 3.12)"
        ) from exc
    keep = data_dir is not None
    folder = data_dir or tempfile.mkdtemp(prefix="cyclone-pg-")
    with _no_runtime_dir_warning():
        handle = pgserver.get_server(folder, cleanup_mode="stop")
    return DevServer(handle.get_uri(), folder, handle, keep_data=keep)


@contextlib.contextmanager
def _no_runtime_dir_warning() -> Iterator[None]:
    """Silence the warning ``pgserver``'s lock-file folder gives without
    ``XDG_RUNTIME_DIR`` (containers, CI runners and root shells have none): the folder
    it falls back to serves, and a warning turned into an error must not stop a test
    run or the demo. Other warnings pass."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        yield
