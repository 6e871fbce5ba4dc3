"""A worker app for the flow-control tests (``CYCLONE_TEST_APP_DSN``).

``CYCLONE_TEST_TTL``: lease TTL in seconds (default 30: a SIGKILLed worker's lease
outlives the test unless the test expires it). ``CYCLONE_TEST_SLOTS``: slots of the
default queue (default 10). The sweep runs every 0.2 s and the claim loop polls every
0.05 s.

Kinds:
* ``lim_pair``: ``max_concurrency=2``; works 1 to 5 ms;
* ``lim_hold``: ``max_concurrency=1``; waits for a shared advisory lock on
  ``inp["lock"]`` on a connection of its own, so it runs until the test that holds that
  lock exclusively releases it (advisory locks are per database);
* ``lim_rate``: ``rate_limit=RateLimit(50, per=1)``; returns at once;
* ``lim_probe``: no limit; returns the worker's pid.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import psycopg

import cyclone

DSN = os.environ["CYCLONE_TEST_APP_DSN"]
TTL = float(os.environ.get("CYCLONE_TEST_TTL", "30"))
SLOTS = int(os.environ.get("CYCLONE_TEST_SLOTS", "10"))


@cyclone.action("lim_pair", max_concurrency=2)
async def lim_pair(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.sleep(random.uniform(0.001, 0.005))  # the handler's work


@cyclone.action("lim_hold", max_concurrency=1)
async def lim_hold(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock_shared(%s)", (inp["lock"],))


@cyclone.action("lim_rate", rate_limit=cyclone.RateLimit(50, per=1))
async def lim_rate(ctx: cyclone.Context, inp: Any) -> None:
    return None


@cyclone.step("lim_probe")
async def lim_probe(ctx: cyclone.Context, inp: Any) -> int:
    return os.getpid()


client = cyclone.Client(
    DSN,
    handlers=[lim_pair, lim_hold, lim_rate, lim_probe],
    queues={"default": SLOTS},
    lease_ttl=TTL,
    poll_interval=0.05,
    sweep_interval=0.2,
    shutdown_grace=5,
)
