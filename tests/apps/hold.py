"""A worker app whose steps hold their slot until the test lets them go
(``CYCLONE_TEST_APP_DSN``).

Kind ``hold``: waits for a shared advisory lock on ``inp["key"]`` on a connection of
its own, so a step runs until the test that holds that lock exclusively releases it
(advisory locks are per database: each test's database has its own). The client
serves ``default`` and ``c`` with 2 slots each, and not ``b``.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

import cyclone

DSN = os.environ["CYCLONE_TEST_APP_DSN"]


@cyclone.action("hold")
async def hold(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute("SELECT pg_advisory_lock_shared(%s)", (inp["key"],))


client = cyclone.Client(
    DSN,
    handlers=[hold],
    queues={"default": 2, "c": 2},
    lease_ttl=10,
    poll_interval=0.05,
    shutdown_grace=5,
)
