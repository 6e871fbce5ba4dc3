"""A worker app that exports its spans to a file, for the tracing tests.

``CYCLONE_TEST_APP_DSN``: the database; ``CYCLONE_TEST_SPANS``: the JSON-lines file each
finished span is appended to (:class:`tests.observability.spans.FileExporter`). Kinds
``tr_add`` (input + 1) and ``tr_flaky`` (fails on its first attempt); the workflow
``traced_chain`` runs three ``tr_add`` nodes in a row.
"""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import cyclone
from tests.observability.spans import FileExporter


@cyclone.step("tr_add")
async def add(ctx: cyclone.Context, value: int) -> int:
    return value + 1


@cyclone.step("tr_flaky", max_attempts=3)
def flaky(ctx: cyclone.Context, value: int) -> int:
    if ctx.attempt == 0:
        raise RuntimeError("first attempt fails")
    return value


def chain() -> cyclone.Workflow:
    """Three nodes in a row: a -> b -> c."""
    wf = cyclone.Workflow("traced_chain")
    a = wf.node("a", add)
    b = wf.node("b", add, input_from=a)
    wf.result(wf.node("c", add, input_from=b))
    return wf


if "CYCLONE_TEST_SPANS" in os.environ:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["CYCLONE_TEST_SPANS"])))
    trace.set_tracer_provider(provider)
    client = cyclone.Client(
        os.environ["CYCLONE_TEST_APP_DSN"],
        workflows=[chain()],
        handlers=[add, flaky],
        queues={"default": 4},
        poll_interval=0.05,
        lease_ttl=10,
    )
