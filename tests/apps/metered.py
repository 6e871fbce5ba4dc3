"""A worker app that serves its own Prometheus metrics, for the metrics crash test.

``CYCLONE_TEST_APP_DSN``: the database. ``CYCLONE_TEST_TTL``: lease TTL in seconds.
``CYCLONE_TEST_WORK``: seconds each handler works. ``CYCLONE_TEST_SLOTS``: slots of the
default queue. ``CYCLONE_TEST_METRICS_FILE``: where the app writes, once its metrics
server listens, ``{"port": ..., "owner": ..., "pid": ...}`` (JSON, written whole).

Kind ``metered_write``: works, then inserts ``(step_id, owner)`` into ``done_by`` in
its completion transaction, so that the table says durably which client completed each
step (a completed step keeps no lease owner).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

import cyclone
from cyclone.observability import register_metrics
from cyclone.observability.serve import start_metrics_server

DSN = os.environ["CYCLONE_TEST_APP_DSN"]
TTL = float(os.environ.get("CYCLONE_TEST_TTL", "2"))
WORK = float(os.environ.get("CYCLONE_TEST_WORK", "0.1"))
SLOTS = int(os.environ.get("CYCLONE_TEST_SLOTS", "5"))
OUT = Path(os.environ["CYCLONE_TEST_METRICS_FILE"])


@cyclone.action("metered_write")
async def metered_write(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.sleep(WORK)  # the handler's own work
    tx = await ctx.completion_tx()
    await tx.execute(
        "INSERT INTO done_by (step_id, owner) VALUES (%s, %s)", (ctx.step_id, client.owner)
    )


client = cyclone.Client(
    DSN,
    handlers=[metered_write],
    queues={"default": SLOTS},
    lease_ttl=TTL,
    max_reclaims=10_000,
    poll_interval=0.2,
    sweep_interval=max(0.2, TTL / 4),
    shutdown_grace=5,
)
server = start_metrics_server(register_metrics(client, CollectorRegistry()), port=0)
_partial = OUT.with_suffix(".partial")
_partial.write_text(json.dumps({"port": server.port, "owner": client.owner, "pid": os.getpid()}))
_partial.replace(OUT)
