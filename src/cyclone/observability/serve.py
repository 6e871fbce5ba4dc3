"""Serve a registry's metrics over HTTP: ``GET /metrics``, in a background thread.

:func:`start_metrics_server` runs ``prometheus_client``'s WSGI application on the
standard library's ``wsgiref`` server (a thread per request, daemon threads, as
``prometheus_client.start_http_server`` does), behind a check of
``Authorization: Bearer <token>`` when a token is given. ``cyclone worker
--metrics-port`` calls it; an application that runs its own client may too:

.. code-block:: python

    from prometheus_client import CollectorRegistry
    from cyclone.observability.metrics import register_metrics
    from cyclone.observability.serve import start_metrics_server

    server = start_metrics_server(register_metrics(client, CollectorRegistry()), port=9464)
    ...
    server.close()

Without a token the server binds only a loopback address: anything else needs one.
"""

from __future__ import annotations

import hmac
import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Self
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from cyclone.errors import ConfigurationError, ValidationError
from cyclone.hosts import host_name, is_loopback
from cyclone.observability.metrics import prometheus

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["DEFAULT_PORT", "PATH", "MetricsServer", "bearer_guard", "start_metrics_server"]

DEFAULT_PORT = 9464
"""The port of ``cyclone worker --metrics-port`` examples (Prometheus's registry of
default ports gives 9464 to OpenTelemetry's Prometheus exporter)."""
PATH = "/metrics"
"""The one path served."""

READ_TIMEOUT = 10.0
"""Seconds a connection may stay silent (a request not sent, or sent byte by byte)
before it is closed, so that idle connections cannot pile up threads and sockets."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds the process at exit


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT  # a connection that sends nothing gives its thread back

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request (scrapes come every few seconds)."""


def _plain(
    start_response: StartResponse, status: str, text: str, extra: Iterable[tuple[str, str]] = ()
) -> list[bytes]:
    body = text.encode()
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    start_response(status, [*headers, *extra])
    return [body]


def bearer_guard(app: WSGIApplication, token: str | None) -> WSGIApplication:
    """``app`` served at :data:`PATH` only (404 elsewhere), and, with a ``token``, only
    to requests carrying ``Authorization: Bearer <token>`` (401 otherwise; compared in
    constant time, the token as UTF-8). Without a token (a loopback endpoint), only to
    requests whose ``Host`` is a loopback name or address (421 otherwise): a web page
    whose name was made to resolve to 127.0.0.1 cannot read it from a browser."""
    expected = token.encode() if token else None

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if expected is None:
            host = str(environ.get("HTTP_HOST", ""))
            if host and not is_loopback(host_name(host)):
                return _plain(
                    start_response,
                    "421 Misdirected Request",
                    f"host {host_name(host)!r} is not allowed: without a token this "
                    "endpoint answers loopback names only\n",
                )
        else:
            # WSGI gives header values as latin-1 text: back to the bytes sent.
            sent = str(environ.get("HTTP_AUTHORIZATION", "")).encode("latin-1", "replace")
            if not (
                sent[:7].lower() == b"bearer " and hmac.compare_digest(sent[7:].strip(), expected)
            ):
                return _plain(
                    start_response,
                    "401 Unauthorized",
                    "a token is required: Authorization: Bearer <token>\n",
                    [("WWW-Authenticate", "Bearer")],
                )
        if environ.get("PATH_INFO", "") != PATH:
            return _plain(start_response, "404 Not Found", f"not found: metrics are at {PATH}\n")
        return app(environ, start_response)

    return guarded


class MetricsServer:
    """A running metrics endpoint (see :func:`start_metrics_server`); a context manager
    that closes it on exit.

    Attributes:
        host: the address bound.
        port: the port bound (the one picked when 0 was asked).
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread, host: str) -> None:
        self._server = server
        self._thread = thread
        self.host = host
        self.port: int = server.server_address[1]

    @property
    def url(self) -> str:
        """The endpoint's URL, ``http://HOST:PORT/metrics``."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}{PATH}"

    def close(self) -> None:
        """Stop serving and free the port (waits for the serving loop, not for
        scrapes in flight). Closing twice does nothing."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics_server(
    registry: CollectorRegistry,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    token: str | None = None,
) -> MetricsServer:
    """Serve ``registry`` at ``http://HOST:PORT/metrics`` from a daemon thread.

    The text exposition format (OpenMetrics when the scraper asks for it), gzip when
    accepted; every other path is 404. With ``token``, a request without
    ``Authorization: Bearer <token>`` is 401.

    Args:
        registry: a ``prometheus_client.CollectorRegistry`` (as
            :func:`cyclone.observability.metrics.register_metrics` returns).
        host: the address to bind (a name or an IPv4 or IPv6 address).
        port: the port, 0 to 65535 (0: a free one, see :attr:`MetricsServer.port`).
        token: the bearer token every request must carry; ``None`` or empty: none,
            allowed on a loopback ``host`` only.

    Returns:
        The running :class:`MetricsServer`; ``close()`` stops it.

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed, or ``host`` is not
            a loopback address and no token is given (the message names the host).
        ValidationError: ``port`` is not an integer from 0 to 65535.
        OSError: the address cannot be bound (in use, not this machine's).
    """
    prom = prometheus()
    token = token.strip() if token else None  # a secret file's newline is not the token
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]  # [::1]: the URL form of an IPv6 address
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValidationError(f"port must be an integer from 0 to 65535, got {port!r}")
    if not token and not is_loopback(host):
        raise ConfigurationError(
            f"binding {host!r} exposes the metrics beyond this machine: give a token "
            "(cyclone worker --metrics-token, or $CYCLONE_METRICS_TOKEN)"
        )
    family, address = _best_family(host, port)
    server_class: type[WSGIServer] = type("_Bound", (_Server,), {"address_family": family})
    app = bearer_guard(prom.make_wsgi_app(registry), token or None)
    server = make_server(address, port, app, server_class, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True
    )
    thread.name = f"cyclone-metrics-{server.server_address[1]}"
    thread.start()
    return MetricsServer(server, thread, address)


def _best_family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family and address to bind ``host`` with (IPv6 for ``::1``)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])
