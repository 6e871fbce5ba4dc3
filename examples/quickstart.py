"""Quickstart: kinds, a worker, enqueueing, exactly-once writes, retries, waiting.

Run it with ``python examples/quickstart.py``. It works in the database of
``$CYCLONE_DSN`` when that is set; otherwise in a database of its own
(``cyclone_quickstart``, created when it can be) on the local PostgreSQL at
127.0.0.1:5432, else on an embedded one (``pip install -e '.[embedded]'``). It prints
what happened to each run.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import cyclone
from cyclone.devserver import find_server


@cyclone.step("greet")
async def greet(ctx: cyclone.Context, inp: dict[str, str]) -> str:
    """A step: its return value is stored as the run's result."""
    return f"hello, {inp['name']}"


@cyclone.action("charge")
async def charge(ctx: cyclone.Context, inp: dict[str, Any]) -> None:
    """An action whose business write commits with the step's completion, or not at all."""
    tx = await ctx.completion_tx()
    await tx.execute(
        "INSERT INTO payments (run_id, amount) VALUES (%s, %s) ON CONFLICT (run_id) DO NOTHING",
        (ctx.run_id, inp["amount"]),
    )


@cyclone.step("flaky", max_attempts=3, retry=cyclone.RetryPolicy(base=0.2))
def flaky(ctx: cyclone.Context, inp: None) -> str:
    """A plain ``def`` handler (run in a thread) that fails twice, then succeeds."""
    if ctx.attempt < 2:
        raise RuntimeError(f"transient failure on attempt {ctx.attempt}")
    return f"succeeded after {ctx.attempt} failed attempts"


def own_database(dsn: str, name: str) -> str:
    """``dsn`` itself when ``$CYCLONE_DSN`` is set (the database the user chose);
    otherwise ``dsn`` pointed at database ``name``, created if possible, else ``dsn``."""
    if os.environ.get("CYCLONE_DSN"):
        return dsn
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error:
        return dsn
    return make_conninfo("", **{**conninfo_to_dict(dsn), "dbname": name})


async def main() -> None:
    server = find_server()
    if server.embedded:
        print(f"started an embedded PostgreSQL in {server.data_dir}")
    try:
        dsn = own_database(server.dsn, "cyclone_quickstart")
        where = conninfo_to_dict(dsn)
        print(f"using database {where.get('dbname')!r} on {where.get('host', 'localhost')}")
        cyclone.migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS payments (run_id bigint PRIMARY KEY, amount int)"
            )
        async with cyclone.Client(dsn, handlers=[greet, charge, flaky]) as client:
            jobs = {
                "greet": await client.enqueue(greet, {"name": "Cyclone"}),
                "charge": await client.enqueue(charge, {"amount": 42}),
                "flaky": await client.enqueue(flaky, None),
            }
            for name, job in jobs.items():
                run = await client.wait(job, timeout=60)
                (step,) = await client.list_steps(run)
                print(
                    f"run {run.id} ({name}): {run.state.value}, result={run.result!r}, "
                    f"attempts failed={step.attempt}"
                )
        with psycopg.connect(dsn) as conn:
            charge_run = jobs["charge"].run_id
            rows = conn.execute(
                "SELECT count(*) FROM payments WHERE run_id = %s", (charge_run,)
            ).fetchone()
            print(f"payments recorded by run {charge_run}: {rows[0] if rows else 0} (exactly one)")
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
