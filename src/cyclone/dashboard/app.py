"""The dashboard's ASGI application: :func:`create_app`.

One :class:`Backend` per application holds what the routes use: the :class:`Reader`
(a small pool of its own, or the pool passed in), the :class:`cyclone.Client` whose
calls carry out the actions, the templates and the :class:`SecurityConfig`. Both are
opened on the first request that needs them, so the application works mounted inside
another one (whose lifespan never reaches it); a lifespan of its own closes them when
it is served alone, and :meth:`Backend.aclose` does when mounted.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from importlib import resources
from typing import Any

from psycopg_pool import AsyncConnectionPool
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from cyclone.client import Client
from cyclone.connections import ConnectionSettings, client_connections
from cyclone.dashboard import api, metrics, pages
from cyclone.dashboard.filters import install_filters
from cyclone.dashboard.queries import Reader
from cyclone.dashboard.security import Guard, SecurityConfig
from cyclone.dbio import Stmt, fetch_async
from cyclone.sql import Q

__all__ = ["POOL_SIZE", "Backend", "create_app"]

POOL_SIZE = 4
"""Connections of the dashboard's own read pool at most (one is kept open)."""
STATEMENT_TIMEOUT_MS = 15_000
"""A dashboard read that runs longer is cancelled by the server."""


class Backend:
    """The database side of one dashboard application.

    Args:
        target: a connection string or an ``AsyncConnectionPool`` (used for reads as
            it is; the actions' client opens its own few connections from its
            conninfo).
        schema: the Postgres schema of Cyclone's tables.
        pooler: ``"transaction"`` behind a transaction-mode pooler (default:
            ``$CYCLONE_POOLER``, else ``"session"``).

    Raises:
        ValidationError: a bad target, schema or pooler.
    """

    def __init__(
        self, target: str | AsyncConnectionPool[Any], *, schema: str, pooler: str | None
    ) -> None:
        given, conninfo, settings = client_connections(
            target,
            AsyncConnectionPool,
            "the dashboard",
            schema=schema,
            pooler=pooler,
            connect_timeout=5.0,
            tcp_user_timeout=10.0,
        )
        self.settings: ConnectionSettings = settings
        self._own_pool = given is None
        self.pool: AsyncConnectionPool[Any] = given or self._new_pool()
        self.reader = Reader(self.pool, settings)
        self.client = Client(conninfo, schema=schema, pooler=settings.pooler)
        self._lock = asyncio.Lock()
        self._opened = False

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        kwargs = self.settings.kwargs(autocommit=True)
        # Unnamed statements only: each read is planned with its values, so that an
        # optional filter left out costs nothing (dashboard.sql's header).
        kwargs["prepare_threshold"] = None
        settings = self.settings

        async def configure(conn: Any) -> None:
            await settings.configure_async()(conn)
            if not settings.per_transaction:
                await fetch_async(
                    conn, Stmt(Q.dashboard_statement_timeout, {"ms": str(STATEMENT_TIMEOUT_MS)})
                )

        return AsyncConnectionPool(
            settings.conninfo_for("cyclone-dashboard"),
            min_size=1,
            max_size=POOL_SIZE,
            kwargs=kwargs,
            open=False,
            name="cyclone-dashboard",
            configure=configure,
        )

    async def open(self) -> None:
        """Open the read pool (once; the client opens on its first call)."""
        if self._opened:
            return
        async with self._lock:
            if not self._opened and self._own_pool:
                await self.pool.open(wait=False)
            self._opened = True

    async def aclose(self) -> None:
        """Close the read pool (if it is the dashboard's own) and the client."""
        await self.client.stop()
        if self._own_pool and self._opened:
            await self.pool.close()
        self._opened = False


def _templates() -> Jinja2Templates:
    folder = resources.files("cyclone.dashboard") / "templates"
    templates = Jinja2Templates(directory=str(folder))
    env = templates.env
    env.autoescape = True  # every value escaped, in HTML and in the inline SVG alike
    install_filters(env)
    return templates


def create_app(
    dsn_or_pool: str | AsyncConnectionPool[Any],
    *,
    token: str | None = None,
    read_only: bool = False,
    schema: str = "public",
    allowed_hosts: Iterable[str] | None = None,
    pooler: str | None = None,
) -> Starlette:
    """The dashboard as an ASGI application, to serve alone or mount under a prefix.

    Args:
        dsn_or_pool: a libpq connection string or URL, or a
            ``psycopg_pool.AsyncConnectionPool`` to read through.
        token: the bearer token every request must carry (``Authorization: Bearer``,
            or the login cookie); ``None``: no token, for loopback use.
        read_only: refuse every action (403).
        schema: the Postgres schema of Cyclone's tables.
        allowed_hosts: host names the ``Host`` header may carry besides the loopback
            ones (the name the dashboard is reached by when mounted or exposed).
        pooler: ``"transaction"`` behind a transaction-mode pooler.

    Returns:
        A Starlette application; ``app.state.backend`` is its :class:`Backend`
        (``await app.state.backend.aclose()`` when mounted in another application).

    Raises:
        ValidationError: a bad connection string, pool, schema or pooler.
    """
    backend = Backend(dsn_or_pool, schema=schema, pooler=pooler)
    security = SecurityConfig.build(token, read_only, allowed_hosts)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await backend.aclose()

    static = StaticFiles(directory=str(resources.files("cyclone.dashboard") / "static"))
    routes = [
        *pages.routes(),
        *api.routes(),
        *metrics.routes(),
        Mount("/static", app=static, name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, config=security)],
        lifespan=lifespan,
        exception_handlers=pages.exception_handlers(),
    )
    app.state.backend = backend
    app.state.security = security
    app.state.templates = _templates()
    return app
