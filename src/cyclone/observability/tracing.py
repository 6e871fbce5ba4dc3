"""OpenTelemetry traces of Cyclone's producers, steps and engine work.

Spans go to the global ``TracerProvider`` the application configured (the convention
of instrumentation libraries): Cyclone never configures one. Tracing is off, and costs
one check per call, while ``opentelemetry-api`` is not installed (it is then never
imported) or no provider has been set; it turns on as soon as the application sets
one.

Propagation: the W3C ``traceparent`` of the producer span (``cyclone.enqueue <kind>``,
``cyclone.submit <workflow>``) is stored with the run (``cyclone_runs.traceparent``,
55 characters) and every step span of the run (``cyclone.step <kind>``) is made its
child, on whatever host and however much later the step runs. A child run takes its
parent run's trace context; a schedule fire's run takes the fire span's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from cyclone.producer import EnqueueRequest
    from cyclone.submit import SubmitRequest
    from cyclone.transitions import Claimed

__all__ = [
    "TRACEPARENT",
    "Produced",
    "StepSpan",
    "enabled",
    "engine_span",
    "enqueue_attributes",
    "producer_span",
    "record_span",
    "step_span",
    "submit_attributes",
    "traceparent_of_current",
]

TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
"""A W3C ``traceparent`` of version 00, the only form stored with a run."""

_INSTRUMENTATION = "cyclone"


log = logging.getLogger("cyclone.observability")

_failed: set[str] = set()

F = TypeVar("F", bound=Callable[..., Any])


def _never_raises(fn: F) -> F:
    """Make ``fn`` log (once per function) and return ``None`` instead of raising: a
    span processor or exporter of the application's that fails must never disturb a
    step or a claim."""

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if fn.__name__ not in _failed:
                _failed.add(fn.__name__)
                log.warning("tracing failed in %s (reported once): %r", fn.__name__, exc)
            return None

    return guarded  # type: ignore[return-value]


@functools.cache
def _otel() -> Any:
    """The OpenTelemetry API modules, imported on first use; ``False`` when absent."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return False
    return _Api(trace, context, TraceContextTextMapPropagator())


class _Api:
    __slots__ = ("_provider", "_tracer", "context", "propagator", "trace")

    def __init__(self, trace: Any, context: Any, propagator: Any) -> None:
        self.trace, self.context, self.propagator = trace, context, propagator
        self._provider: Any = None
        self._tracer: Any = None

    def tracer(self) -> Any:
        """Cyclone's tracer, or ``None`` while no provider is set (tracing off); made
        once per provider."""
        provider = self.trace.get_tracer_provider()
        if isinstance(provider, self.trace.ProxyTracerProvider):
            return None
        if provider is not self._provider:
            from cyclone import __version__

            self._tracer = provider.get_tracer(_INSTRUMENTATION, __version__)
            self._provider = provider
        return self._tracer


def enabled() -> bool:
    """True when spans would be recorded: the API is installed and a provider is set."""
    api = _otel()
    return bool(api) and api.tracer() is not None


def traceparent_of_current() -> str | None:
    """The W3C ``traceparent`` of the span current in this context, or ``None`` (no
    tracing, or no valid span)."""
    api = _otel()
    if not api:
        return None
    carrier: dict[str, str] = {}
    api.propagator.inject(carrier)
    value = carrier.get("traceparent")
    return value if value is not None and TRACEPARENT.match(value) else None


def _parent_context(api: Any, traceparent: str | None) -> Any:
    if traceparent is None or not TRACEPARENT.match(traceparent):
        return None
    return api.propagator.extract({"traceparent": traceparent})


def enqueue_attributes(request: EnqueueRequest, count: int | None = None) -> dict[str, Any]:
    """The attributes of an enqueue's producer span (``count``: runs of a batch)."""
    attributes: dict[str, Any] = {"cyclone.kind": request.kind, "cyclone.queue": request.queue}
    if count is not None:
        attributes["cyclone.batch_size"] = count
    return attributes


def submit_attributes(request: SubmitRequest) -> dict[str, Any]:
    """The attributes of a submit's producer span."""
    return {"cyclone.workflow": request.workflow.name}


class Produced:
    """What a producer block sees of its span: the ``traceparent`` to store with the
    run (``None`` when tracing is off) and :meth:`set` for attributes known later."""

    __slots__ = ("_span", "traceparent")

    def __init__(self, span: Any = None, traceparent: str | None = None) -> None:
        self._span, self.traceparent = span, traceparent

    def set(self, key: str, value: Any) -> None:
        """Set attribute ``key`` on the span (nothing when tracing is off)."""
        if self._span is not None:
            self._span.set_attribute(key, value)


_OFF = Produced()


@contextlib.contextmanager
def producer_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Produced]:
    """A PRODUCER span ``name``, current in the block; yields its :class:`Produced`.
    An exception leaving the block is recorded on the span."""
    api = _otel()
    tracer = api.tracer() if api else None
    if tracer is None:
        yield _OFF
        return
    with tracer.start_as_current_span(
        name, kind=api.trace.SpanKind.PRODUCER, attributes=dict(attributes or {})
    ) as span:
        yield Produced(span, traceparent_of_current())


@contextlib.contextmanager
def engine_span(
    name: str, attributes: Mapping[str, Any] | None = None, *, root: bool = True
) -> Iterator[Any]:
    """An INTERNAL span ``name`` of engine work, current in the block: a root span (engine
    work belongs to no caller's trace), or with ``root=False`` a child of the current
    span (a step's own work); yields the span (``None`` when tracing is off) so that the
    block can add attributes."""
    api = _otel()
    tracer = api.tracer() if api else None
    if tracer is None:
        yield None
        return
    parent = api.context.Context() if root else None
    with tracer.start_as_current_span(name, context=parent, attributes=dict(attributes or {})) as s:
        yield s


@_never_raises
def record_span(name: str, started_ns: int, attributes: Mapping[str, Any]) -> None:
    """A finished INTERNAL root span ``name`` from ``started_ns`` (``time.time_ns()``)
    to now: for work known to be worth a span only once done (a sweep that reclaimed)."""
    api = _otel()
    tracer = api.tracer() if api else None
    if tracer is None:
        return
    span = tracer.start_span(
        name, context=api.context.Context(), attributes=dict(attributes), start_time=started_ns
    )
    span.end()


class StepSpan:
    """The CONSUMER span of one step attempt (``cyclone.step <kind>``), a child of the
    run's stored trace context; made at dispatch, current while the handler runs
    (:meth:`active`), ended once with the attempt's outcome (:meth:`end`)."""

    __slots__ = ("_api", "_span")

    def __init__(self, api: Any, span: Any) -> None:
        self._api, self._span = api, span

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make the span current in this block (the handler's task or thread)."""
        with self._api.trace.use_span(self._span, end_on_exit=False):
            yield

    @_never_raises
    def record_error(self, error: BaseException) -> None:
        """Record ``error`` (an exception the handler raised) on the span."""
        self._span.record_exception(error)

    @_never_raises
    def end(self, outcome: str, *, error: str | None = None) -> None:
        """Set ``cyclone.outcome`` and end the span (status ERROR for a failed or
        discarded attempt, with ``error`` as its description)."""
        span = self._span
        span.set_attribute("cyclone.outcome", outcome)
        if outcome in ("failed", "discarded"):
            status = self._api.trace.Status(self._api.trace.StatusCode.ERROR, error)
            span.set_status(status)
        span.end()


@_never_raises
def step_span(step: Claimed) -> StepSpan | None:
    """The span of the attempt of ``step`` about to run, or ``None`` when tracing is
    off."""
    api = _otel()
    tracer = api.tracer() if api else None
    if tracer is None:
        return None
    parent = _parent_context(api, step.traceparent) or api.context.Context()
    attributes = {
        "cyclone.run_id": step.run_id,
        "cyclone.step_id": step.id,
        "cyclone.node": step.node,
        "cyclone.kind": step.kind,
        "cyclone.queue": step.queue,
        "cyclone.attempt": step.attempt + 1,
        "cyclone.reclaims": step.reclaims,
        "cyclone.workflow": step.workflow,
        "cyclone.queue_latency_ms": round(step.queue_latency * 1000.0, 3),
    }
    span = tracer.start_span(
        f"cyclone.step {step.kind}",
        context=parent,
        kind=api.trace.SpanKind.CONSUMER,
        attributes=attributes,
        start_time=time.time_ns(),
    )
    return StepSpan(api, span)
