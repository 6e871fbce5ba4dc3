"""The metrics endpoint without a token answers loopback host names only."""

from __future__ import annotations

import http.client

import pytest
from prometheus_client import CollectorRegistry

from cyclone.observability.serve import start_metrics_server


def _status(port: int, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics", headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:{port}", 200),
        ("127.0.0.1:{port}", 200),
        ("[::1]:{port}", 200),
        ("attacker.example:{port}", 421),
        ("127.0.0.1.attacker.example", 421),
    ],
)
def test_a_loopback_endpoint_refuses_foreign_host_names(host: str, status: int) -> None:
    """Without a token, a request naming a host that is not loopback (a page whose name
    was made to resolve to 127.0.0.1, read from a browser) is refused with 421."""
    with start_metrics_server(CollectorRegistry(), port=0) as server:
        assert _status(server.port, host.format(port=server.port)) == status
