"""Pause and resume send the same wakeups from both clients: a pause sends none (the
run is not finished, and nothing became claimable); a resume wakes the queues whose
steps became claimable again, and sends no run-done wakeup either."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import psycopg
import pytest

import cyclone

MARK = "test-mark"


@pytest.fixture
def heard(dsn: str) -> Iterator[Callable[[], list[tuple[str, str]]]]:
    """A listener on both wakeup channels; calling it returns what it heard so far
    (read up to a marker notification sent after the call: everything committed before
    the call has been delivered by then)."""
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as marker,
    ):
        listener.execute("LISTEN cyclone_run_done")
        listener.execute("LISTEN cyclone_available")

        def read() -> list[tuple[str, str]]:
            marker.execute("SELECT pg_notify('cyclone_run_done', %s)", [MARK])
            got: list[tuple[str, str]] = []
            for note in listener.notifies(timeout=30):
                if note.payload == MARK:
                    return got
                got.append((note.channel, note.payload))
            raise AssertionError(f"the marker did not arrive; heard {got}")

        yield read


def _queues(notes: list[tuple[str, str]]) -> set[str]:
    return {json.loads(p)["queue"] for c, p in notes if c == "cyclone_available"}


def test_sync_pause_sends_nothing_and_resume_wakes_the_queue(
    dsn: str, heard: Callable[[], list[tuple[str, str]]]
) -> None:
    with cyclone.SyncClient(dsn) as client:
        run = client.enqueue("control_job", {}, queue="ctl")
        heard()
        client.pause(run)
        assert heard() == []
        client.resume(run)
        notes = heard()
    assert [c for c, _ in notes] == ["cyclone_available"]
    assert _queues(notes) == {"ctl"}


async def test_async_pause_sends_nothing_and_resume_wakes_the_queue(
    dsn: str, heard: Callable[[], list[tuple[str, str]]]
) -> None:
    async with cyclone.Client(dsn) as client:
        run = await client.enqueue("control_job", {}, queue="ctl")
        await client.stop()  # flushes the enqueue's wakeup
        heard()
        await client.pause(run)
        await client.stop()
        assert heard() == []
        await client.resume(run)
        await client.stop()
        notes = heard()
    assert [c for c, _ in notes] == ["cyclone_available"]
    assert _queues(notes) == {"ctl"}
