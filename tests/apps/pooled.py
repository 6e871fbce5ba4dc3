"""The worker app of the pooler tests: every step writes one ledger row in its
completion transaction.

``CYCLONE_TEST_APP_DSN``: the database (through PgBouncer); ``CYCLONE_POOLER`` says
``transaction``. Kinds: ``pooled_job`` (a job), and the workflow ``pooled``: ``start``
(returns a list) -> ``items`` (a fan-out over it) -> ``approve`` (a signal wait) ->
``end`` (a fan-in of the items' outputs and the signal's payload).
"""

from __future__ import annotations

import os
from typing import Any

import cyclone

DSN = os.environ.get("CYCLONE_TEST_APP_DSN", "")
ITEMS = 4


async def _record(ctx: cyclone.Context) -> None:
    tx = await ctx.completion_tx()
    await tx.execute("INSERT INTO ledger (run_id, node) VALUES (%s, %s)", (ctx.run_id, ctx.node))


@cyclone.action("pooled_job")
async def pooled_job(ctx: cyclone.Context, inp: Any) -> None:
    await _record(ctx)


@cyclone.step("pooled_start")
async def start(ctx: cyclone.Context, inp: Any) -> list[int]:
    await _record(ctx)
    return list(range(ITEMS))


@cyclone.step("pooled_item")
async def item(ctx: cyclone.Context, value: int) -> int:
    await _record(ctx)
    return value * 10


@cyclone.step("pooled_end")
async def end(ctx: cyclone.Context, inp: list[Any]) -> list[Any]:
    await _record(ctx)
    return inp


def workflow() -> cyclone.Workflow:
    wf = cyclone.Workflow("pooled")
    first = wf.node("start", start)
    items = wf.fan_out("items", item, over=first, max_parallel=2)
    approve = wf.wait_signal("approve", after=[items])
    wf.result(wf.node("end", end, inputs=[items, approve]))
    return wf


WORKFLOW = workflow()

client = cyclone.Client(
    DSN,
    handlers=[pooled_job],
    workflows=[WORKFLOW],
    queues={"default": 4},
    poll_interval=0.2,
    lease_ttl=5,
    purge_interval=None,
)
