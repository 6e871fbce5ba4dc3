"""Running a :class:`cyclone.Client` inside an ASGI application (FastAPI, Starlette).

``lifespan(client)`` gives what FastAPI and Starlette take as their ``lifespan``
argument: the client starts with the application (its workers too, when it has
handlers) and stops with it, after the server stopped taking requests, so that
request handlers can call ``client.enqueue_tx(...)`` and friends on a started client.
With ``dashboard="/path"`` the dashboard is mounted at that path for the application's
lifetime, reading through the client's database and schema.

Only the ``dashboard`` option needs an extra (``dashboard``: Starlette and Jinja2);
the rest imports nothing beyond Cyclone.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from cyclone.client import Client
from cyclone.errors import ValidationError

__all__ = ["lifespan"]

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]
"""An ASGI application's lifespan: given the application, an async context manager
entered at startup and left at shutdown."""


def lifespan(
    client: Client,
    *,
    dashboard: str | None = None,
    dashboard_token: str | None = None,
    dashboard_read_only: bool = False,
    dashboard_allowed_hosts: Iterable[str] | None = None,
) -> Lifespan:
    """The lifespan that starts ``client`` with the application and stops it after.

    Pass it as ``FastAPI(lifespan=lifespan(client))`` or
    ``Starlette(..., lifespan=lifespan(client))``. To combine it with a lifespan of
    your own, enter it in yours: ``async with lifespan(client)(app): yield``.

    Args:
        client: the client to start (``await client.start()``) at startup and to stop
            (``await client.stop()``, which lets its workers finish their steps within
            its ``shutdown_grace``) at shutdown.
        dashboard: a path prefix (``"/cyclone"``) to mount the dashboard at, or
            ``None`` for no dashboard. Mounting needs the ``dashboard`` extra and an
            application with a ``mount(path, app)`` method (FastAPI, Starlette).
        dashboard_token: the token the dashboard asks for (see
            :func:`cyclone.dashboard.create_app`); ``None``: none, which suits a
            service reachable on loopback only.
        dashboard_read_only: the dashboard refuses every action.
        dashboard_allowed_hosts: host names the application is reached by, for the
            dashboard's ``Host`` check (besides the loopback names).

    Returns:
        A function of the application returning an async context manager.

    Raises:
        ValidationError: ``dashboard`` is not a path starting with ``/`` (other than
            ``/`` itself), raised here, before the application starts.
    """
    if dashboard is not None and (
        not isinstance(dashboard, str)
        or not dashboard.startswith("/")
        or dashboard.rstrip("/") == ""
    ):
        raise ValidationError(
            f"dashboard must be a path prefix such as '/cyclone', got {dashboard!r}"
        )

    @contextlib.asynccontextmanager
    async def run(app: Any) -> AsyncIterator[None]:
        closers: list[Callable[[], Any]] = []
        await client.start()
        try:
            if dashboard is not None:
                from cyclone.dashboard import create_app

                ui = create_app(
                    client._conninfo,
                    token=dashboard_token,
                    read_only=dashboard_read_only,
                    schema=client.config.schema,
                    allowed_hosts=dashboard_allowed_hosts,
                    pooler=client.settings.pooler,
                )
                closers.append(ui.state.backend.aclose)
                app.mount(dashboard.rstrip("/"), ui)
                mounted = app.router.routes[-1]
                # unmounted at shutdown, so that a restart in the same process (tests,
                # reloads) mounts one dashboard again, not a second one beside it
                closers.append(lambda: _unmount(app, mounted))
            yield
        finally:
            try:
                for close in reversed(closers):
                    await close()
            finally:
                await client.stop()

    return run


async def _unmount(app: Any, route: Any) -> None:
    """Take ``route`` (the dashboard's mount) out of ``app``'s routes."""
    with contextlib.suppress(ValueError):
        app.router.routes.remove(route)
