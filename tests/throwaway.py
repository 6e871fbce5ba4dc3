"""A PostgreSQL server of a test's own, which it may restart or crash at will.

``initdb`` + ``pg_ctl`` from the PATH, else the binaries bundled with ``pgserver``; run
as the ``postgres`` user when the tests run as root (initdb refuses root). A free port
on 127.0.0.1, a socket folder and the data folder in a temporary directory; fsync off
(a process crash loses nothing the OS holds; only a machine crash would).

For the network tests the server can run inside a network namespace (``netns``),
listening on other addresses (``listen``) with more ``pg_hba.conf`` lines (``hba``) and
server settings (``settings``); its :attr:`ThrowawayServer.dsn` is then the Unix socket,
which the test process reaches from any namespace.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
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


def free_port() -> int:
    """A TCP port of 127.0.0.1 free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThrowawayServer:
    """Start with :meth:`start`; :meth:`crash_restart` kills and restarts it.

    Args:
        netns: the network namespace to run in (``None``: the caller's).
        listen: the addresses to listen on (default 127.0.0.1).
        hba: lines added to ``pg_hba.conf`` (``"host all all 127.0.0.0/8 trust"``).
        settings: more server settings (name -> value).
    """

    def __init__(
        self,
        *,
        netns: str | None = None,
        listen: Sequence[str] = ("127.0.0.1",),
        hba: Sequence[str] = (),
        settings: Mapping[str, str] | None = None,
    ) -> None:
        bins = _bin_dir()
        assert bins is not None, "no initdb"
        self._bins = bins
        self.root = Path(tempfile.mkdtemp(prefix="cyclone-throwaway-"))
        self.data = self.root / "data"
        self.port = free_port()
        self._netns = netns
        self._listen = ",".join(listen)
        self._hba = list(hba)
        self._settings = dict(settings or {})
        host = self.root if netns is not None else "127.0.0.1"
        self.dsn = f"host={host} port={self.port} user=postgres dbname=postgres"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        command = [str(self._bins / args[0]), *args[1:]]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        if self._netns is not None:
            command = ["ip", "netns", "exec", self._netns, *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """initdb (the first time) and start; returns once it accepts connections."""
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
            if self._hba:
                with (self.data / "pg_hba.conf").open("a") as hba:
                    hba.write("".join(f"{line}\n" for line in self._hba))
        settings = {"max_connections": "100", **self._settings}
        options = (
            f"-p {self.port} -c listen_addresses={self._listen}"
            f" -c unix_socket_directories={self.root} -c fsync=off"
            + "".join(f" -c {name}={value}" for name, value in settings.items())
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
