"""The network tests' worker app: a workflow with a fan-out and two job kinds, every
step but one kind writing a ledger row in its completion transaction.

Environment: ``CYCLONE_TEST_APP_DSN`` (the database), ``CYCLONE_TEST_HOST`` (this
worker host's name, written in each ledger row), ``CYCLONE_TEST_WORK`` (mean seconds
of work per step, uniform between 0 and twice that), ``CYCLONE_TEST_TCP_USER_TIMEOUT``
(the client's ``tcp_user_timeout`` in seconds, or ``none``) and ``CYCLONE_TEST_GATE``
(a file: while it exists, the fan-out items wait after their work, before their
business write; the link-cut test holds the cut-off host's items there).

Graph: ``start`` -> ``split`` (fan-out over ``ITEMS`` items, plain ``def`` handlers) ->
``sum`` -> ``end``. Kinds ``nf_job`` (ledger row) and ``nf_plain`` (no completion
transaction: the batched completer) run as jobs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import cyclone

WORK = float(os.environ.get("CYCLONE_TEST_WORK", "0.2"))
HOST = os.environ.get("CYCLONE_TEST_HOST", "?")
GATE = os.environ.get("CYCLONE_TEST_GATE")
ITEMS = 8
LEDGER = """CREATE TABLE ledger (
    id bigserial PRIMARY KEY,
    run_id bigint NOT NULL,
    node text NOT NULL,
    attempt int NOT NULL,
    host text NOT NULL
)"""
"""The ledger table the tests create; one row per completed step, by design."""
_INSERT = "INSERT INTO ledger (run_id, node, attempt, host) VALUES (%s, %s, %s, %s)"

log = logging.getLogger("tests.apps.netfault")


def _ledger_params(ctx: cyclone.Context) -> tuple[int, str, int, str]:
    return (ctx.run_id, ctx.node, ctx.attempt, HOST)


async def _work_and_record(ctx: cyclone.Context) -> None:
    await asyncio.sleep(random.uniform(0.0, 2 * WORK))
    tx = await ctx.completion_tx()
    await tx.execute(_INSERT, _ledger_params(ctx))


@cyclone.step("nf_start")
async def start(ctx: cyclone.Context, value: Any) -> list[int]:
    await _work_and_record(ctx)
    return list(range(ITEMS))


@cyclone.step("nf_item")
def item(ctx: cyclone.Context, value: int) -> int:
    time.sleep(random.uniform(0.0, 2 * WORK))
    while GATE is not None and Path(GATE).exists():
        time.sleep(0.05)  # held at the gate by the test (a thread cannot be cancelled)
    tx = ctx.completion_tx()
    tx.execute(_INSERT, _ledger_params(ctx))
    log.warning("business write of step %d attempt %d", ctx.step_id, ctx.attempt)
    return value * value


@cyclone.step("nf_node")
async def node(ctx: cyclone.Context, value: Any) -> Any:
    await _work_and_record(ctx)
    return value


@cyclone.action("nf_job")
async def job(ctx: cyclone.Context, value: Any) -> None:
    await _work_and_record(ctx)


@cyclone.action("nf_plain")
async def plain(ctx: cyclone.Context, value: Any) -> Any:
    await asyncio.sleep(random.uniform(0.0, 2 * WORK))
    return value


def workflow() -> cyclone.Workflow:
    wf = cyclone.Workflow("netfault")
    first = wf.node("start", start)
    split = wf.fan_out("split", item, over=first)
    total = wf.node("sum", node, input_from=split)
    wf.result(wf.node("end", node, input_from=total))
    return wf


def _tcp_user_timeout() -> float | None:
    value = os.environ.get("CYCLONE_TEST_TCP_USER_TIMEOUT", "1")
    return None if value == "none" else float(value)


def client() -> cyclone.Client:
    return cyclone.Client(
        os.environ["CYCLONE_TEST_APP_DSN"],
        handlers=[job, plain],
        workflows=[workflow()],
        lease_ttl=2,
        sweep_interval=0.25,
        poll_interval=0.2,
        queues={"default": 4},
        shutdown_grace=1,
        tcp_user_timeout=_tcp_user_timeout(),
    )
