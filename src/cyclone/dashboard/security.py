"""What every request to the dashboard goes through before a page or the API sees it.

:class:`Guard` is an ASGI middleware:

1. **Host.** The ``Host`` header must name one of the allowed hosts (by default the
   loopback names ``127.0.0.1``, ``localhost`` and ``[::1]``, any port): a page of
   another site whose name was rebound to this machine's address (DNS rebinding)
   sends its own name and is refused with 400.
2. **Origin.** A request that carries ``Origin`` must come from the dashboard's own
   origin (scheme, host and port of the request); a POST without ``Origin`` is refused
   when the browser says it is cross-site (``Sec-Fetch-Site``). So no other site can
   make a browser POST here, token or not (403).
3. **Token.** With a token, every request but the login page and the static files
   needs ``Authorization: Bearer <token>`` or the login cookie (401 for the API,
   ``/metrics`` and POSTs; a redirect to the login page for a page).
4. **Headers.** Every response gets a strict Content-Security-Policy (no inline
   script or style, nothing from another origin, no framing), ``nosniff``,
   ``same-origin`` referrers (with ``no-referrer`` a browser sends ``Origin: null``
   on the dashboard's own forms) and ``no-store``.

CSRF: each browser gets a random ``cyclone_csrf`` cookie; every form carries
:func:`csrf_token` of it (an HMAC under a per-process key) and :func:`check_csrf` is
asked before an action runs. API POSTs need a JSON content type instead (a form of
another site cannot send one without a CORS preflight, which is never answered).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import cookie_parser
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cyclone.hosts import host_name, is_loopback

__all__ = [
    "CSP",
    "CSRF_COOKIE",
    "LOOPBACK_HOSTS",
    "SESSION_COOKIE",
    "Guard",
    "SecurityConfig",
    "check_csrf",
    "csrf_token",
    "host_name",
    "is_loopback",
    "safe_next",
]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
"""Host names accepted when no other host is allowed."""
CSRF_COOKIE = "cyclone_csrf"
SESSION_COOKIE = "cyclone_session"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""The Content-Security-Policy of every response."""
_PUBLIC = ("/login", "/static/")
"""Paths (under the app's root) served without the token."""


@dataclass(frozen=True, slots=True)
class SecurityConfig:
    """How the dashboard guards itself.

    Attributes:
        token: the bearer token, or ``None`` (loopback use only).
        read_only: refuse every action.
        allowed_hosts: host names (no port) the ``Host`` header may name; ``"*"``
            allows any (only sensible behind a token and a proxy that checks it).
        key: the per-process HMAC key of CSRF tokens and of the login cookie.
    """

    token: str | None = None
    read_only: bool = False
    allowed_hosts: frozenset[str] = LOOPBACK_HOSTS
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @classmethod
    def build(
        cls, token: str | None, read_only: bool, hosts: Iterable[str] | None
    ) -> SecurityConfig:
        """The config for these options; ``hosts`` adds to the loopback names."""
        allowed = set(LOOPBACK_HOSTS)
        for host in hosts or ():
            allowed.add(host.strip("[]").lower())
        return cls(token=token or None, read_only=read_only, allowed_hosts=frozenset(allowed))

    def session_value(self) -> str:
        """The login cookie's value: an HMAC of the token (the token never leaves in a
        cookie). Stable for one token, so a restart keeps users logged in."""
        assert self.token is not None
        return hmac.new(self.token.encode(), b"cyclone-dashboard-session", "sha256").hexdigest()


def csrf_token(config: SecurityConfig, cookie: str) -> str:
    """The form token that goes with a browser's CSRF cookie value."""
    return hmac.new(config.key, cookie.encode(), hashlib.sha256).hexdigest()


def check_csrf(config: SecurityConfig, cookie: str | None, sent: str | None) -> bool:
    """Whether a form's token ``sent`` matches the browser's CSRF ``cookie``."""
    if not cookie or not sent:
        return False
    return hmac.compare_digest(csrf_token(config, cookie), sent)


def safe_next(value: str | None, root: str) -> str:
    """Where to go after a login: a path of this site (``/...``, not ``//...``),
    else the dashboard's root."""
    if value and value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return root + "/"


def _cookies(headers: dict[bytes, bytes]) -> dict[str, str]:
    """The request's cookies, read leniently (as Starlette reads them for the routes):
    a malformed cookie another site on this host set does not hide the others."""
    return cookie_parser(headers.get(b"cookie", b"").decode("latin-1"))


class Guard:
    """The ASGI middleware of the module docstring, around the dashboard's routes."""

    def __init__(self, app: ASGIApp, config: SecurityConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        method = scope["method"]
        host = headers.get(b"host", b"").decode("latin-1")
        if not self._host_ok(host):
            await _plain(send, 400, f"host {host!r} is not allowed here")
            return
        refusal = self._origin_refusal(scope, headers, host, method)
        if refusal:
            await _plain(send, 403, refusal)
            return
        cookies = _cookies(headers)
        scope.setdefault("state", {})
        path = scope["path"][len(scope.get("root_path", "")) :] or "/"
        public = path.startswith(_PUBLIC)
        if self.config.token and not public and not self._authorised(headers, cookies):
            await self._unauthorised(scope, send, path, method)
            return
        csrf = cookies.get(CSRF_COOKIE) or ""
        fresh = not csrf or len(csrf) > 64
        if fresh:
            csrf = secrets.token_urlsafe(24)
        scope["state"]["csrf_cookie"] = csrf
        secure = scope.get("scheme") == "https"
        root = scope.get("root_path", "") or "/"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out.setdefault("content-security-policy", CSP)
                out["x-content-type-options"] = "nosniff"
                out["referrer-policy"] = "same-origin"
                out["x-frame-options"] = "DENY"
                out.setdefault("cache-control", "no-store")
                if fresh:
                    out.append(
                        "set-cookie",
                        f"{CSRF_COOKIE}={csrf}; Path={root}; HttpOnly; SameSite=Strict"
                        + ("; Secure" if secure else ""),
                    )
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _host_ok(self, host: str) -> bool:
        if "*" in self.config.allowed_hosts:
            return bool(host)
        return bool(host) and host_name(host) in self.config.allowed_hosts

    def _origin_refusal(
        self, scope: Scope, headers: dict[bytes, bytes], host: str, method: str
    ) -> str | None:
        origin = headers.get(b"origin", b"").decode("latin-1")
        unsafe = method not in ("GET", "HEAD", "OPTIONS")
        if origin:
            parts = urlsplit(origin)
            own = f"{scope.get('scheme', 'http')}://{host.lower()}"
            if origin.lower() == "null" or f"{parts.scheme}://{parts.netloc}".lower() != own:
                return f"cross-origin request from {origin!r} refused"
        elif unsafe:
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1")
            if site and site not in ("same-origin", "none"):
                return f"cross-site {method} refused (Sec-Fetch-Site: {site})"
        return None

    def _authorised(self, headers: dict[bytes, bytes], cookies: dict[str, str]) -> bool:
        token = self.config.token
        assert token is not None
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(
            auth[7:].strip(),
            token.encode(),  # the header's bytes, the token in UTF-8
        ):
            return True
        session = cookies.get(SESSION_COOKIE, "")
        return bool(session) and hmac.compare_digest(
            session.encode(), self.config.session_value().encode()
        )

    async def _unauthorised(self, scope: Scope, send: Send, path: str, method: str) -> None:
        root = scope.get("root_path", "")
        if method == "GET" and not path.startswith("/api/") and path != "/metrics":
            query = scope.get("query_string", b"").decode("latin-1")
            target = root + path + (f"?{query}" if query else "")
            location = f"{root}/login?next={quote(target, safe='')}"
            await _respond(send, 303, b"", [(b"location", location.encode("latin-1"))])
            return
        body = b'{"error": "a token is required: Authorization: Bearer <token>"}'
        await _respond(
            send,
            401,
            body,
            [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
        )


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    base: list[Any] = [
        (b"content-length", str(len(body)).encode()),
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"x-frame-options", b"DENY"),
        (b"referrer-policy", b"same-origin"),
        (b"cache-control", b"no-store"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": base + headers})
    await send({"type": "http.response.body", "body": body})


async def _plain(send: Send, status: int, text: str) -> None:
    await _respond(send, status, text.encode(), [(b"content-type", b"text/plain; charset=utf-8")])
