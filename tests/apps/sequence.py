"""A worker app for the sequence_key tests (``CYCLONE_TEST_APP_DSN``).

Kind ``seq_record``: marks its key active in ``seq_active`` (primary key on the key, so
two steps of one key running at once is recorded in ``seq_overlaps``), works a little,
appends ``(key, position)`` to ``seq_log`` and clears the mark.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

import cyclone

DSN = os.environ["CYCLONE_TEST_APP_DSN"]


@cyclone.action("seq_record")
async def seq_record(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    key, position = inp["key"], inp["position"]
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        try:
            await conn.execute(
                "INSERT INTO seq_active (key, step_id) VALUES (%s, %s)", (key, ctx.step_id)
            )
        except psycopg.errors.UniqueViolation:
            await conn.execute(
                "INSERT INTO seq_overlaps (key, step_id) VALUES (%s, %s)", (key, ctx.step_id)
            )
        await asyncio.sleep(0.01)  # the handler's work
        await conn.execute("INSERT INTO seq_log (key, position) VALUES (%s, %s)", (key, position))
        await conn.execute(
            "DELETE FROM seq_active WHERE key = %s AND step_id = %s", (key, ctx.step_id)
        )


client = cyclone.Client(
    DSN,
    handlers=[seq_record],
    queues={"default": 8},
    lease_ttl=10,
    poll_interval=0.05,
    claim_batch=8,
)
