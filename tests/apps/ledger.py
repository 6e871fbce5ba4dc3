"""A worker app for crash tests, configured by environment variables.

``CYCLONE_TEST_APP_DSN``: the database. ``CYCLONE_TEST_TTL``: lease TTL in seconds.
``CYCLONE_TEST_WORK``: seconds each handler works before writing. ``CYCLONE_TEST_SLOTS``:
slots of the default queue.

Kinds:
* ``ledger_write``: works, then inserts one ``ledger`` row in its completion transaction
  (the table has no unique constraint, so a duplicate commit would show);
* ``count_exec``: records each execution in ``executions`` outside any transaction of
  the engine (so it counts handler calls, committed or not), then completes;
* ``sync_sleep``: a plain ``def`` handler that sleeps ``inp["seconds"]``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import psycopg

import cyclone

DSN = os.environ["CYCLONE_TEST_APP_DSN"]
TTL = float(os.environ.get("CYCLONE_TEST_TTL", "2"))
WORK = float(os.environ.get("CYCLONE_TEST_WORK", "0.2"))
SLOTS = int(os.environ.get("CYCLONE_TEST_SLOTS", "5"))


@cyclone.action("ledger_write")
async def ledger_write(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    await asyncio.sleep(WORK)  # the handler's own work
    tx = await ctx.completion_tx()
    await tx.execute(
        "INSERT INTO ledger (run_id, step_id, item) VALUES (%s, %s, %s)",
        (ctx.run_id, ctx.step_id, inp["item"]),
    )


@cyclone.step("count_exec")
async def count_exec(ctx: cyclone.Context, inp: dict[str, Any]) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(DSN, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO executions (step_id, pid) VALUES (%s, %s)", (ctx.step_id, os.getpid())
        )
    return {"pid": os.getpid()}


@cyclone.step("sync_sleep")
def sync_sleep(ctx: cyclone.Context, inp: dict[str, Any]) -> str:
    time.sleep(inp["seconds"])  # a plain def handler that cannot be interrupted
    return "slept"


client = cyclone.Client(
    DSN,
    handlers=[ledger_write, count_exec, sync_sleep],
    queues={"default": SLOTS},
    lease_ttl=TTL,
    max_reclaims=10_000,
    poll_interval=0.2,
    sweep_interval=max(0.2, TTL / 4),
    shutdown_grace=5,
)
