"""Which addresses to bind keep a server on this machine.

Pure, with no third-party import: the dashboard (:mod:`cyclone.dashboard.security`)
and the metrics endpoint (:mod:`cyclone.observability.serve`) both refuse to bind
anything else without a token.
"""

from __future__ import annotations

import ipaddress

__all__ = ["host_name", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address to bind) is a loopback one: ``localhost``, or
    an address of 127.0.0.0/8 or ``::1`` (a name that merely starts with ``127.`` is
    not: it may resolve anywhere)."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a ``Host`` header without its port, lower case (``[::1]:8484`` ->
    ``::1``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header
