"""A sync handler that overruns its timeout: its thread cannot be stopped, but its
completion transaction is ended at once from the engine side, so the retry is not
blocked behind its row locks, and the thread's later writes fail."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

import cyclone
from tests.helpers import apoll_until, scalar


async def test_a_timed_out_sync_handler_loses_its_transaction(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """See :func:`timed_out_sync_handler_loses_its_transaction`."""
    await timed_out_sync_handler_loses_its_transaction(dsn, db)


async def timed_out_sync_handler_loses_its_transaction(
    dsn: str, db: psycopg.Connection[Any], pooler: str | None = None
) -> None:
    """The first execution locks the account row in its completion transaction and then
    hangs past the timeout; the next one (a retry, or a reclaim if the sweep saw the
    timeout first) updates the same row. It completes (it would wait for the first
    one's lock, time out in turn and so on, if that transaction stayed open), the hung
    transaction's write is rolled back, and when the thread wakes its next write fails:
    the balance holds exactly one increment."""
    db.execute("CREATE TABLE account (id int PRIMARY KEY, balance int NOT NULL)")
    db.execute("INSERT INTO account VALUES (1, 0)")
    wake = threading.Event()
    late_write: list[BaseException] = []
    executions = iter(range(1000))

    @cyclone.action(
        "credit",
        timeout=1.5,
        max_attempts=3,
        retry=cyclone.RetryPolicy(base=0.05, cap=0.05, jitter=0),
    )
    def credit(ctx: cyclone.Context, inp: Any) -> None:
        first = next(executions) == 0
        tx = ctx.completion_tx()
        tx.execute("UPDATE account SET balance = balance + 1 WHERE id = 1")
        if first:
            wake.wait(60)  # hangs far past the timeout
            try:
                tx.execute("UPDATE account SET balance = balance + 100 WHERE id = 1")
            except BaseException as exc:
                late_write.append(exc)
                raise

    client = cyclone.Client(
        dsn, handlers=[credit], queues={"default": 3}, sweep_interval=0.1, pooler=pooler
    )
    try:
        async with client:
            job = await client.enqueue(credit, {})
            run = await client.wait(job, timeout=60)
            assert run.state == cyclone.RunState.COMPLETED
            step = (await client.list_steps(job))[0]
            assert (step.attempt, step.reclaims) in ((1, 0), (0, 1))  # retried or reclaimed
            assert scalar(db, "SELECT balance FROM account") == 1
            # nothing of attempt 0 is left holding a transaction
            assert (
                scalar(
                    db,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state LIKE 'idle in transaction%'",
                )
                == 0
            )
            wake.set()

            async def thread_returned() -> bool:
                return client.threads_running == 0

            await apoll_until(thread_returned, what="the hung thread to return")
    finally:
        wake.set()
    assert late_write, "the late write of the timed-out attempt did not fail"
    assert scalar(db, "SELECT balance FROM account") == 1


def test_the_end_names_the_transaction_not_only_the_process(dsn: str) -> None:
    """A server process that has moved on to another transaction (a pooler lent it on,
    or the pool handed the connection to the next step) is not terminated: the end
    names the process and the transaction's start."""
    from cyclone.dbio import Stmt, fetch_sync
    from cyclone.sql import Q

    held = psycopg.connect(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as engine:
            pid, started = fetch_sync(held, Stmt(Q.steps_tx_backend))[0]
            held.rollback()  # that transaction ends; the process goes on
            fetch_sync(held, Stmt(Q.steps_tx_backend))  # ... in a new transaction
            ended = fetch_sync(
                engine, Stmt(Q.steps_end_tx_backend, {"pid": pid, "xact_start": started})
            )
            assert ended == []
            assert held.execute("SELECT 1").fetchone() == (1,)  # still alive
            _, current = fetch_sync(held, Stmt(Q.steps_tx_backend))[0]
            ended = fetch_sync(
                engine, Stmt(Q.steps_end_tx_backend, {"pid": pid, "xact_start": current})
            )
            assert ended == [(True,)]
    finally:
        held.close()
