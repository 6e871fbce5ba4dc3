"""Observability: OpenTelemetry traces, Prometheus metrics and logs that name steps.

* Traces (extra ``otel``): :mod:`cyclone.observability.tracing`. Spans go to the
  application's global ``TracerProvider``; nothing is imported while
  ``opentelemetry-api`` is absent.
* Metrics (extra ``prometheus``): :func:`register_metrics` adds a client's counters,
  histograms and gauges to a ``prometheus_client`` registry.
* Logs: every engine line about a step names its run and step, in the message and as
  record attributes (:mod:`cyclone.observability.logs`).

The engine reports what it does to :class:`Observer` objects added to a client's
``observers``; metrics are one such observer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cyclone.observability.hooks import OUTCOMES, Observer, Observers, Outcome

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from cyclone.client import Client

__all__ = ["OUTCOMES", "Observer", "Observers", "Outcome", "register_metrics"]


def register_metrics(
    client: Client, registry: CollectorRegistry | None = None
) -> CollectorRegistry:
    """Add ``client``'s step counters and histograms and its worker gauges to
    ``registry`` (``None``: ``prometheus_client.REGISTRY``); the registry.

    See :func:`cyclone.observability.metrics.register_metrics` (imported on the first
    call, with ``prometheus_client``).

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed (the ``prometheus``
            extra).
        ValueError: the registry already holds metrics of these names that
            ``register_metrics`` did not add.
    """
    from cyclone.observability import metrics

    return metrics.register_metrics(client, registry)
