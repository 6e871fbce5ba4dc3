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

from cyclone.observability.hooks import OUTCOMES, Observer, Observers, Outcome

__all__ = ["OUTCOMES", "Observer", "Observers", "Outcome"]
