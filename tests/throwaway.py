"""A PostgreSQL server of a test's own, which it may restart or crash at will.

``initdb`` + ``pg_ctl`` from the PATH, else the binaries bundled with ``pgserver``; run
as the ``postgres`` user when the tests run as root (initdb refuses root). A free port
on 127.0.0.1, a socket folder and the data folder in a temporary directory; fsync off
(a process crash loses nothing the OS holds; only a machine crash would).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["ThrowawayServer", "available"]


def _bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    try:
        import pgserver
    except ImportError:
        return None
    bundled = Path(pgserver.__file__).parent / "pginstall" / "bin"
    return bundled if (bundled / "initdb").exists() else None


def available() -> bool:
    """Whether a throwaway server can be made here."""
    return _bin_dir() is not None and (os.geteuid() != 0 or shutil.which("runuser") is not None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayServer:
    """Start with :meth:`start`; :meth:`crash_restart` kills and restarts it."""

    def __init__(self) -> None:
        bins = _bin_dir()
        assert bins is not None, "no initdb"
        self._bins = bins
        self.root = Path(tempfile.mkdtemp(prefix="cyclone-throwaway-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(self._bins / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """initdb (the first time) and start; returns once it accepts connections."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c max_connections=100"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def crash_restart(self) -> None:
        """Stop at once (like a crash: no checkpoint, every connection cut), then start
        again; recovery replays the WAL."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        self.start()

    def halt(self) -> None:
        """Stop the server (fast shutdown: every connection is cut) and keep its data;
        :meth:`start` brings it back."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def stop(self) -> None:
        """Stop the server and delete its folder."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
