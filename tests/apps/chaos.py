"""The chaos test's worker app: a 20-node workflow with a fan-out, every step writing
one ledger row in its completion transaction.

``CYCLONE_TEST_APP_DSN``: the database; ``CYCLONE_TEST_WORK``: mean seconds of work
per step (uniform between 0 and twice that). Graph: ``start`` -> ``split`` (fan-out over 5
items) -> ``sum`` -> three lanes of five nodes each (``lane{i}_{j}``) -> ``end`` (fan-in
of the lanes' last nodes and of ``audit``, which runs beside the fan-out): 20 nodes,
25 steps with the items.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import cyclone

WORK = float(os.environ.get("CYCLONE_TEST_WORK", "0.025"))
LANES = 3
LANE_LENGTH = 5
ITEMS = 5


async def _work_and_record(ctx: cyclone.Context, value: Any) -> None:
    await asyncio.sleep(random.uniform(0.0, 2 * WORK))  # the handler's own work
    tx = await ctx.completion_tx()
    await tx.execute(
        "INSERT INTO ledger (run_id, node, attempt) VALUES (%s, %s, %s)",
        (ctx.run_id, ctx.node, ctx.attempt),
    )


@cyclone.step("chaos_start")
async def start(ctx: cyclone.Context, value: Any) -> list[int]:
    await _work_and_record(ctx, value)
    return list(range(ITEMS))


@cyclone.step("chaos_item")
async def item(ctx: cyclone.Context, value: int) -> int:
    await _work_and_record(ctx, value)
    return value * value


@cyclone.step("chaos_node")
async def node(ctx: cyclone.Context, value: Any) -> Any:
    await _work_and_record(ctx, value)
    return value


def workflow() -> cyclone.Workflow:
    wf = cyclone.Workflow("chaos")
    first = wf.node("start", start)
    split = wf.fan_out("split", item, over=first, max_parallel=3)
    total = wf.node("sum", node, input_from=split)
    ends = []
    for lane in range(LANES):
        previous = total
        for j in range(LANE_LENGTH):
            previous = wf.node(f"lane{lane}_{j}", node, input_from=previous)
        ends.append(previous)
    audit = wf.node("audit", node, input_from=first)
    wf.result(wf.node("end", node, inputs=[*ends, audit]))
    return wf


def client() -> cyclone.Client:
    return cyclone.Client(
        os.environ["CYCLONE_TEST_APP_DSN"],
        workflows=[workflow()],
        lease_ttl=2,
        poll_interval=0.2,
        queues={"default": 8},
        shutdown_grace=2,
    )
