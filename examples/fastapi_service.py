"""A FastAPI service that enqueues work inside each request's own transaction.

Run it from the repository's root with ``CYCLONE_DSN`` set to a database of yours
(``pip install -e '.[fastapi,dashboard]'``)::

    CYCLONE_DSN=postgresql:///app uvicorn examples.fastapi_service:app

``POST /orders`` with ``{"item": "tea", "amount": 3}`` writes the order and enqueues
its confirmation in one transaction: both commit or neither does. The service's own
client runs the confirmation (it has the handler), which marks the order confirmed in
the step's completion transaction. ``GET /orders/{id}`` shows the order; the
dashboard is served at ``/cyclone``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

import cyclone
from cyclone.contrib.asgi import lifespan

DSN = os.environ.get("CYCLONE_DSN", "postgresql:///app")


class Order(BaseModel):
    """The body of ``POST /orders``."""

    item: str
    amount: int


@cyclone.action("confirm_order")
async def confirm_order(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    """Mark the order confirmed, in the step's completion transaction (exactly once)."""
    tx = await ctx.completion_tx()
    await tx.execute("UPDATE orders SET confirmed = true WHERE id = %s", (inp["order_id"],))


client = cyclone.Client(DSN, handlers=[confirm_order])
pool = AsyncConnectionPool(DSN, open=False)


@contextlib.asynccontextmanager
async def service_lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Open the pool, make the schema, then run the client with the service."""
    await pool.open()
    try:
        await client.migrate()
        async with pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, item text,"
                " amount int, confirmed boolean NOT NULL DEFAULT false)"
            )
        async with lifespan(client, dashboard="/cyclone")(app):
            yield
    finally:
        await pool.close()


app = FastAPI(lifespan=service_lifespan)


@app.post("/orders", status_code=201)
async def create_order(order: Order) -> dict[str, int]:
    """Write the order and enqueue its confirmation in one transaction."""
    async with pool.connection() as conn:
        tracker = client.track_wakeups(conn)
        async with conn.transaction():
            cur = await conn.cursor(row_factory=dict_row).execute(
                "INSERT INTO orders (item, amount) VALUES (%s, %s) RETURNING id",
                (order.item, order.amount),
            )
            row = await cur.fetchone()
            assert row is not None
            job = await client.enqueue_tx(conn, confirm_order, {"order_id": row["id"]})
            if order.amount <= 0:
                # raised inside the transaction: the order and its run roll back together
                raise HTTPException(422, f"amount must be positive, got {order.amount}")
        await client.publish_wakeups(tracker)  # after the commit: a worker starts at once
    return {"order_id": row["id"], "run_id": job.run_id}


@app.get("/orders/{order_id}")
async def get_order(order_id: int) -> dict[str, Any]:
    """The order as stored."""
    async with pool.connection() as conn:
        cur = await conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM orders WHERE id = %s", (order_id,)
        )
        row = await cur.fetchone()
    if row is None:
        raise HTTPException(404, f"no order {order_id}")
    return dict(row)
