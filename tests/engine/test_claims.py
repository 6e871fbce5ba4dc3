"""How many steps one claim takes (``claim_batch``), and ``Client.set_queues``.

Each claim writes its own lease owner, ``<client id>/<serial>``: the distinct owners
of the running steps are the claims that took them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.worker import MAX_CLAIM_BATCH
from tests.helpers import apoll_until, scalar


@cyclone.action("hold")
async def hold(ctx: cyclone.Context, inp: Any) -> None:
    await asyncio.Event().wait()  # holds its slot until the stop gives the step back


def claims(db: psycopg.Connection[Any]) -> list[int]:
    """Running steps per claim (per lease owner), largest first."""
    owners = db.execute("SELECT lease_owner FROM cyclone_steps WHERE state = 'running'")
    return sorted(Counter(row[0] for row in owners).values(), reverse=True)


async def claimed_by_a_worker(
    dsn: str, db: psycopg.Connection[Any], *, jobs: int, slots: int, **options: Any
) -> tuple[list[int], int, int]:
    """Enqueue ``jobs`` steps, then start a worker with ``slots`` slots until its slots
    are full: the steps each claim took, the claim statements it ran, and the steps
    left available."""
    async with cyclone.Client(dsn) as producer:
        await producer.enqueue_many(hold, [None] * jobs)
    worker = cyclone.Client(
        dsn, handlers=[hold], queues={"default": slots}, shutdown_grace=0, **options
    )
    async with worker:
        # The slots fill up, then the loop waits for one to free: no claim after that.
        await apoll_until(
            lambda: asyncio.to_thread(lambda: sum(claims(db)) == slots), what="full slots"
        )
        assert worker.worker is not None
        left = scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'available'")
        return claims(db), worker.worker.claims, left


async def test_by_default_one_claim_fills_every_free_slot(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    """20 free slots and 25 available steps: one claim statement takes 20."""
    assert await claimed_by_a_worker(dsn, db, jobs=25, slots=20) == ([20], 1, 5)


async def test_claim_batch_caps_each_claim(dsn: str, db: psycopg.Connection[Any]) -> None:
    taken = await claimed_by_a_worker(dsn, db, jobs=25, slots=20, claim_batch=5)
    assert taken == ([5, 5, 5, 5], 4, 5)


async def test_no_claim_takes_more_than_the_cap(dsn: str, db: psycopg.Connection[Any]) -> None:
    """More free slots than ``MAX_CLAIM_BATCH``: the first claim takes the cap, the
    next one the rest."""
    slots = MAX_CLAIM_BATCH + 3
    taken = await claimed_by_a_worker(dsn, db, jobs=slots, slots=slots)
    assert taken == ([MAX_CLAIM_BATCH, 3], 2, 0)


def test_claim_batch_is_none_or_1_to_1000(dsn: str) -> None:
    assert cyclone.Client(dsn).claim_batch is None
    assert cyclone.Client(dsn, claim_batch=1000).claim_batch == 1000
    refused: list[tuple[Any, str]] = [
        (0, "claim_batch must be between 1 and 1000, got 0"),
        (1001, "claim_batch must be between 1 and 1000, got 1001"),
        ("10", "claim_batch must be an integer, got '10'"),
        (True, "claim_batch must be an integer, got True"),
    ]
    for bad, message in refused:
        with pytest.raises(cyclone.ValidationError, match=message):
            cyclone.Client(dsn, claim_batch=bad)


def test_set_queues_resizes_what_follows_the_slots(dsn: str) -> None:
    """``tx_slots`` and ``max_connections`` follow the new total unless given; a value
    refused changes nothing."""
    client = cyclone.Client(dsn, handlers=[hold], queues={"a": 4})
    assert (client.tx_slots, client.max_connections) == (4, 10)
    client.set_queues({"a": 8, "b": 2})
    assert client.queues == {"a": 8, "b": 2}
    assert (client.tx_slots, client.max_connections) == (10, 16)

    given = cyclone.Client(dsn, handlers=[hold], queues={"a": 4}, tx_slots=2)
    given.set_queues({"a": 40})
    assert (given.tx_slots, given.max_connections) == (2, 8)

    capped = cyclone.Client(dsn, handlers=[hold], queues={"a": 4}, max_connections=12)
    with pytest.raises(
        cyclone.PoolTooSmallError, match="max_connections=12 is below tx_slots \\+ 6 = 14"
    ):
        capped.set_queues({"a": 8})
    bad_queues: list[tuple[Any, str]] = [
        ({"a": 0}, "slots of queue 'a' must be between 1 and 10000, got 0"),
        ({"a": "2"}, "slots of queue 'a' must be an integer, got '2'"),
        ({"": 2}, "queue must not be empty"),
        ([("a", 2)], "queues must map queue names to slots, got \\[\\('a', 2\\)\\]"),
    ]
    for bad, message in bad_queues:
        with pytest.raises(cyclone.ValidationError, match=message):
            capped.set_queues(bad)
    assert capped.queues == {"a": 4}
    assert (capped.tx_slots, capped.max_connections) == (4, 12)


async def test_set_queues_applies_at_the_next_start(dsn: str, db: psycopg.Connection[Any]) -> None:
    """Refused while started (StateError); after the stop, the next start serves the new
    queues with their slots."""
    async with cyclone.Client(dsn) as producer:
        await producer.enqueue_many(hold, [None] * 3, queue="other")
    client = cyclone.Client(dsn, handlers=[hold], queues={"default": 1}, shutdown_grace=0)
    async with client:
        with pytest.raises(cyclone.StateError, match="stop it first"):
            client.set_queues({"other": 3})
        assert client.queues == {"default": 1}
    client.set_queues({"other": 3})
    async with client:
        await apoll_until(lambda: asyncio.to_thread(lambda: sum(claims(db)) == 3))
