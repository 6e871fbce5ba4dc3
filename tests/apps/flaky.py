"""A worker app whose one job kind fails its first attempt (``CYCLONE_TEST_APP_DSN``).

Kind ``flaky_once``: raises on its first attempt, returns its input on the next one
(retried after a backoff of 50 ms, no jitter).
"""

from __future__ import annotations

import os
from typing import Any

import cyclone


@cyclone.step("flaky_once", max_attempts=3, retry=cyclone.RetryPolicy(base=0.05, jitter=0))
async def flaky_once(ctx: cyclone.Context, inp: Any) -> Any:
    if ctx.attempt == 0:
        raise RuntimeError("first attempt fails")
    return inp


client = cyclone.Client(
    os.environ["CYCLONE_TEST_APP_DSN"],
    handlers=[flaky_once],
    queues={"default": 2},
    lease_ttl=10,
    poll_interval=0.05,
    shutdown_grace=5,
)
