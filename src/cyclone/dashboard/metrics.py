"""``GET /metrics``: the database gauges in Prometheus's exposition format.

The gauges of :func:`cyclone.observability.metrics.register_database_metrics` (queues,
expired leases, overdue schedules, whether the database answered), and nothing of a
worker: a worker serves its own with ``cyclone worker --metrics-port``. The route sits
behind the dashboard's guard like every page (the token when one is set: a scrape
sends ``Authorization: Bearer <token>``, and is answered 401 without it). The
database is read at most once per :data:`MAX_AGE` seconds, on a short connection of
its own, in a thread (never on the event loop).

Without the ``prometheus`` extra the route answers 501 and says which extra to install.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from cyclone.errors import ConfigurationError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from starlette.applications import Starlette

__all__ = ["MAX_AGE", "routes"]

MAX_AGE = 5.0
"""Seconds one read of the database serves scrapes for."""


def _registry(app: Starlette) -> CollectorRegistry:
    """The application's registry of database gauges, made on the first scrape.

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed.
    """
    registry: CollectorRegistry | None = getattr(app.state, "metrics_registry", None)
    if registry is None:
        from cyclone.observability.metrics import prometheus, register_database_metrics

        settings = app.state.backend.settings
        registry = register_database_metrics(
            settings.conninfo,
            prometheus().CollectorRegistry(auto_describe=True),
            schema=settings.schema,
            pooler=settings.pooler,
            max_age=MAX_AGE,
        )
        app.state.metrics_registry = registry
    return registry


async def metrics(request: Request) -> Response:
    """``GET /metrics``."""
    try:
        registry = _registry(request.app)
    except ConfigurationError as exc:
        return PlainTextResponse(f"{exc}\n", status_code=501)
    from prometheus_client.exposition import choose_encoder

    encoder: Any
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await asyncio.to_thread(encoder, registry)
    return Response(body, headers={"content-type": content_type})


def routes() -> list[BaseRoute]:
    """The ``/metrics`` route."""
    return [Route("/metrics", metrics)]
