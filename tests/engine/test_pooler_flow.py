"""Flow control behind a real PgBouncer in transaction mode.

The claim of a limited kind is one transaction of two statements (the candidates and
their groups' locks, then the admission) that hands the candidates over in a
transaction-local setting: through a transaction pooler it must still land on one
server connection and count right. A queue pause is a row, so it holds there too.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.worker import Worker
from tests.engine.test_flow_limits import _log_running, _max_overlap
from tests.engine.test_pooler import _dbname, bouncer  # noqa: F401 - the fixture
from tests.helpers import apoll_until
from tests.pgbouncer import PgBouncer, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="no pgbouncer binary (apt pgbouncer)"),
]


@cyclone.step("pooled_limited", max_concurrency=1)
async def pooled_limited(ctx: cyclone.Context, inp: int) -> int:
    await asyncio.sleep(random.uniform(0.001, 0.005))
    return inp


async def test_limits_and_pauses_hold_through_the_pooler(
    bouncer: PgBouncer,  # noqa: F811 - the fixture
    dsn: str,
    db: psycopg.Connection[Any],
) -> None:
    """Two clients through the pooler drain 60 jobs over 3 keys of a
    ``max_concurrency=1`` kind: no key ever runs two at once and every job completes;
    while the queue is paused, two claims of each worker take nothing."""
    _log_running(db)
    pooled = bouncer.dsn(_dbname(dsn))
    options: dict[str, Any] = {"pooler": "transaction", "poll_interval": 0.05}
    async with cyclone.Client(pooled, **options) as producer:
        assert await producer.pause_queue("default")
        jobs = []
        for key in ("a", "b", "c"):
            jobs += await producer.enqueue_many(
                pooled_limited, list(range(20)), concurrency_key=key
            )
        workers = [
            cyclone.Client(pooled, handlers=[pooled_limited], queues={"default": 6}, **options)
            for _ in range(2)
        ]
        for worker in workers:
            await worker.start()
        try:
            for worker in workers:
                engine = worker.worker
                assert engine is not None
                seen = engine.claims

                async def claimed_twice(engine: Worker = engine, seen: int = seen) -> bool:
                    return engine.claims >= seen + 2  # two claims began after the pause

                await apoll_until(claimed_twice, what="two claims")
            running = db.execute(
                "SELECT count(*) FROM cyclone_steps WHERE state <> 'available'"
            ).fetchone()
            assert running == (0,)
            assert await producer.resume_queue("default")
            for job in jobs:
                assert (await producer.wait(job, timeout=60)).result is not None
        finally:
            for worker in workers:
                await worker.stop()
    assert _max_overlap(db, "pooled_limited") == {"a": 1, "b": 1, "c": 1}
