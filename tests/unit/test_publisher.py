"""The publisher's leading edge: who sends an enqueue's wakeup, and when."""

from __future__ import annotations

from typing import Any, cast

from cyclone.notify import Publisher, available_payload


async def test_the_leading_edge_is_the_callers_and_the_rest_waits_for_the_commit() -> None:
    """The first enqueue of a window carries its own NOTIFY; one inside the window gets
    nothing from ``lead`` and nothing is queued for it, so no wakeup can go out before
    its row commits (the caller asks ``available`` after its commit)."""
    publisher = Publisher(cast(Any, None), coalesce=60.0)  # lead() never touches the pool
    assert publisher.lead("q") == available_payload("q")
    assert publisher.lead("q") is None
    assert not publisher._queues and not publisher._later and publisher._timer is None
    assert publisher.lead("other") == available_payload("other")  # windows are per queue
