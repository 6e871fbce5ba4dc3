"""A real PgBouncer of a test's own, in transaction mode, in front of the test server.

Debian's ``pgbouncer`` binary, run as the ``postgres`` OS user (it refuses to run as
root), on a free port of 127.0.0.1, with ``pool_mode = transaction`` and a small
``default_pool_size``, so that consecutive transactions of one client connection land
on different server connections, as behind any transaction pooler. Every database of
the upstream server is reachable through it under its own name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.throwaway import free_port

__all__ = ["PgBouncer", "available"]

_BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def available() -> bool:
    """Whether a PgBouncer can be started here."""
    if not Path(_BINARY).exists():
        return False
    return os.geteuid() != 0 or shutil.which("runuser") is not None


class PgBouncer:
    """Start with :meth:`start`, connect with :meth:`dsn`, stop with :meth:`stop`.

    Args:
        upstream_dsn: a DSN of the server to pool (its host, port and user are used).
        pool_size: ``default_pool_size``: server connections per database and user.
        mode: ``pool_mode``: ``"transaction"`` or ``"session"``.
        ignore_options: let clients send the ``options`` startup parameter (PgBouncer
            then drops it: the advice some deployments follow for session mode).
    """

    def __init__(
        self,
        upstream_dsn: str,
        *,
        pool_size: int = 3,
        mode: str = "transaction",
        ignore_options: bool = False,
    ) -> None:
        params = conninfo_to_dict(upstream_dsn)
        self.upstream_host = str(params.get("host") or "127.0.0.1")
        self.upstream_port = int(params.get("port") or 5432)
        self.user = str(params.get("user") or "postgres")
        self.pool_size = pool_size
        self.mode = mode
        self.ignore = "extra_float_digits,options" if ignore_options else "extra_float_digits"
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="cyclone-pgbouncer-"))
        self._proc: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str, user: str | None = None) -> str:
        """A DSN of database ``dbname`` through the pooler."""
        return make_conninfo(
            "", host="127.0.0.1", port=str(self.port), dbname=dbname, user=user or self.user
        )

    @property
    def log(self) -> str:
        """What PgBouncer logged so far."""
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, users: tuple[str, ...] = ()) -> None:
        """Write the configuration and start; returns once it accepts connections.

        ``users``: roles allowed besides the upstream DSN's user.
        """
        names = sorted({self.user, "postgres", "root", *users})
        (self.root / "userlist.txt").write_text("".join(f'"{name}" ""\n' for name in names))
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={self.upstream_host} port={self.upstream_port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            f"pool_mode = {self.mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            f"ignore_startup_parameters = {self.ignore}\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
        )
        command = [_BINARY, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            for path in self.root.iterdir():
                shutil.chown(path, "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self._proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            # its own log line, not just something answering on the port (a port picked
            # free may be taken by someone else before PgBouncer binds it)
            if f"listening on 127.0.0.1:{self.port}" in self.log and self._proc.poll() is None:
                return
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not listen in 30 s:\n{self.log}")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop PgBouncer and delete its folder."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
