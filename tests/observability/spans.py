"""Capturing the spans Cyclone makes, in this process and in worker processes.

In this process: :func:`capture` installs, once, a global ``TracerProvider`` of the
OpenTelemetry SDK whose sampler records only while a test captures (other tests keep
running with spans dropped) and whose spans go to an in-memory exporter. In a worker
process: :class:`FileExporter` appends each finished span to a JSON-lines file, read
back with :func:`read_spans`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult


@dataclass(frozen=True)
class SpanRecord:
    """A finished span, as a test reads it (ids as lowercase hex)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str | None
    attributes: dict[str, Any]
    status: str
    events: list[str]

    @classmethod
    def of(cls, span: ReadableSpan) -> SpanRecord:
        ctx = span.get_span_context()
        assert ctx is not None
        return cls(
            name=span.name,
            kind=span.kind.name,
            trace_id=trace.format_trace_id(ctx.trace_id),
            span_id=trace.format_span_id(ctx.span_id),
            parent_id=trace.format_span_id(span.parent.span_id) if span.parent else None,
            attributes=dict(span.attributes or {}),
            status=span.status.status_code.name,
            events=[event.name for event in span.events],
        )

    @property
    def ids(self) -> str:
        """``trace id-span id``: the part of a W3C traceparent that names this span."""
        return f"{self.trace_id}-{self.span_id}"


class _Switch(Sampler):
    """Records every span while ``on``, drops them otherwise."""

    def __init__(self) -> None:
        self.on = False

    def should_sample(
        self,
        parent_context: Any,
        trace_id: int,
        name: str,
        kind: Any = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if not self.on:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)

    def get_description(self) -> str:
        return "cyclone test switch"


class FileExporter(SpanExporter):
    """Appends each finished span to ``path`` as one JSON object a line."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                record = SpanRecord.of(span)
                out.write(json.dumps(record.__dict__, default=str) + "\n")
        return SpanExportResult.SUCCESS


def read_spans(path: Path) -> list[SpanRecord]:
    """The spans a :class:`FileExporter` wrote to ``path``."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [SpanRecord(**json.loads(line)) for line in lines if line]


_state: tuple[_Switch, InMemorySpanExporter] | None = None


def _install() -> tuple[_Switch, InMemorySpanExporter]:
    global _state
    if _state is None:
        switch, exporter = _Switch(), InMemorySpanExporter()
        provider = TracerProvider(sampler=switch)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _state = switch, exporter
    return _state


class Captured:
    """The spans finished in this process while capturing."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self._exporter = exporter

    def all(self) -> list[SpanRecord]:
        return [SpanRecord.of(span) for span in self._exporter.get_finished_spans()]

    def named(self, name: str) -> list[SpanRecord]:
        return [span for span in self.all() if span.name == name]


@contextmanager
def capture() -> Iterator[Captured]:
    """Record the spans finished in this process in the block."""
    switch, exporter = _install()
    exporter.clear()
    switch.on = True
    try:
        yield Captured(exporter)
    finally:
        switch.on = False


def tracer() -> trace.Tracer:
    """A tracer of the global provider (for a test's own spans)."""
    _install()
    return trace.get_tracer("cyclone-tests")
