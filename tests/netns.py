"""Hosts of a test's own: network namespaces joined by veth pairs on loopback addresses.

One "database host" namespace and N worker host namespaces, each worker linked to the
database host by its own veth pair with a ``127.42.<i>.1/30`` address on the database
end and ``127.42.<i>.2/30`` on the worker end (loopback-range addresses only), both with
``route_localnet=1`` so the kernel routes them on a non-loopback link. ``lo`` is up in
each namespace with ``127.0.0.1/32`` instead of the usual ``/8``: with the ``/8`` the
kernel's local route for 127.0.0.0/8 would capture every reply to another 127.x
address and no packet would ever reach the veth peer. The root namespace's routing is
never touched: the test process talks to a server on the database host through a Unix
socket. Namespace and link names carry the test process's id and a counter, so that
tests running at once never collide; :meth:`Hosts.close` deletes everything it made,
also when setting up failed half way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Hosts", "Link", "available", "hosts"]

_serial = itertools.count()


def available() -> bool:
    """Whether network namespaces can be made here (root, ``ip`` and ``sysctl``)."""
    return os.geteuid() == 0 and all(shutil.which(tool) for tool in ("ip", "sysctl"))


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass(frozen=True, slots=True)
class Link:
    """The veth pair between worker host ``index`` and the database host."""

    index: int
    netns: str
    """The worker host's namespace."""
    worker_if: str
    db_if: str
    worker_addr: str
    db_addr: str


class Hosts:
    """A database host and ``workers`` worker hosts; see the module docstring."""

    def __init__(self, workers: int) -> None:
        prefix = f"cyc{os.getpid()}{next(_serial)}"
        self.db_netns = f"{prefix}db"
        self.links = [
            Link(
                index=i,
                netns=f"{prefix}w{i}",
                worker_if=f"{prefix}w{i}",
                db_if=f"{prefix}d{i}",
                worker_addr=f"127.42.{i}.2",
                db_addr=f"127.42.{i}.1",
            )
            for i in range(workers)
        ]
        self._made: list[str] = []

    @property
    def db_addrs(self) -> list[str]:
        """The database host's addresses, one per worker link."""
        return [link.db_addr for link in self.links]

    def create(self) -> None:
        """Make the namespaces and links (on failure, call :meth:`close`)."""
        for netns in [self.db_netns, *(link.netns for link in self.links)]:
            _ip("netns", "add", netns)
            self._made.append(netns)
            _ip("-n", netns, "link", "set", "lo", "up")
            _ip("-n", netns, "addr", "del", "127.0.0.1/8", "dev", "lo")
            _ip("-n", netns, "addr", "add", "127.0.0.1/32", "dev", "lo")
        for link in self.links:
            _ip(
                *f"link add {link.db_if} netns {self.db_netns} type veth"
                f" peer name {link.worker_if} netns {link.netns}".split()
            )
            for netns, ifname, addr in (
                (self.db_netns, link.db_if, link.db_addr),
                (link.netns, link.worker_if, link.worker_addr),
            ):
                _ip("-n", netns, "addr", "add", f"{addr}/30", "dev", ifname)
                localnet = f"net.ipv4.conf.{ifname}.route_localnet=1"
                _ip("netns", "exec", netns, "sysctl", "-qw", localnet)
                _ip("-n", netns, "link", "set", ifname, "up")

    def cut(self, link: Link) -> None:
        """Take the worker end of ``link`` down: nothing passes until :meth:`restore`."""
        _ip("-n", link.netns, "link", "set", link.worker_if, "down")

    def restore(self, link: Link) -> None:
        """Bring the worker end of ``link`` up again."""
        _ip("-n", link.netns, "link", "set", link.worker_if, "up")

    def unresolved(self, netns: str, addr: str) -> bool:
        """Whether packets to ``addr`` wait in ``netns`` for its neighbour entry to
        resolve (state INCOMPLETE): after a cut they would still reach it once the link
        is back, until the entry fails (a few seconds) and drops them."""
        out = subprocess.run(
            ["ip", "-n", netns, "neigh", "show", addr],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return "INCOMPLETE" in out

    def tcp_peers(self, netns: str) -> list[str]:
        """The remote addresses of every TCP socket in ``netns`` that is not listening
        (established, or closing: a socket the kernel still retransmits on)."""
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "cat", "/proc/net/tcp"],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        peers = []
        for line in out.splitlines()[1:]:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if state != "0A":  # TCP_LISTEN
                packed = bytes.fromhex(remote.split(":")[0])[::-1]
                peers.append(".".join(str(b) for b in packed))
        return peers

    def close(self) -> None:
        """Delete every namespace made (their links go with them). Processes still
        inside keep a namespace alive until they exit: stop them first."""
        while self._made:
            netns = self._made.pop()
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", netns)


@contextlib.contextmanager
def hosts(workers: int) -> Iterator[Hosts]:
    """:class:`Hosts` created on entry and always deleted on exit."""
    made = Hosts(workers)
    try:
        made.create()
        yield made
    finally:
        made.close()
