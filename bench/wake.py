"""The raw wake probe: the least a LISTEN/NOTIFY wake-up of a job can take on this server.

Beside Cyclone's wake latency (``enqueue()`` return to handler start, one idle listening
worker, one job at a time), the same measure with no engine around it, on the raw
``jobs`` table of ``schema.sql`` in a database of its own:

* the producer (the driver, one connection, autocommit) inserts one row as
  ``insert1.sql`` does and sends the wake-up in the *same statement*, so in the same
  transaction: ``WITH j AS (INSERT ... RETURNING id) SELECT j.id, pg_notify(channel, id)``.
  The server delivers the notification when that transaction commits, and the
  statement returns once it has committed: one round trip, one commit;
* the listener (:func:`raw_listener`, a process of its own, one connection) waits for
  the notification and claims the row with the statement of ``claim1.sql``, ``RETURNING
  jobs.id`` added, on the same connection, then sends the row id and
  CLOCK_MONOTONIC through a pipe, as :func:`bench.workers.probe_worker` does when a
  handler starts.

The latency of one probe is from the producer's statement returning to the claim
having returned in the listener; the producer waits for the report before the next.

:func:`cyclone_wake` is Cyclone's side: one idle worker process
(:func:`bench.workers.probe_worker`, listening once it says ``ready``), a producer
client that enqueues one probe run at a time, waits for the handler's start report and
then for the run's completion, so that the worker is idle again before the next.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

import psycopg

import cyclone
from bench.drain import WorkerConfig
from bench.fleet import START_TIMEOUT, join_all
from bench.workers import PROBE_KIND, monotonic_ns, probe_worker

__all__ = ["CHANNEL", "claim_statement", "cyclone_wake", "raw_listener", "raw_wake"]

CHANNEL = "bench_raw_wake"
"""The notification channel (spelled out in the statements too)."""
_INSERT_NOTIFY = (
    "WITH j AS (INSERT INTO jobs (queue, state, priority, scheduled_at) "
    "VALUES ('default', 'available', 0, now()) RETURNING id) "
    "SELECT j.id, pg_notify('bench_raw_wake', j.id::text) FROM j"
)
_TIMEOUT = 10.0  # seconds for one report of the listener


def claim_statement(scripts: Path) -> bytes:
    """``claim1.sql`` of bench/raw-postgres with ``RETURNING jobs.id`` in place of its
    final semicolon.

    Raises:
        ValueError: the script is not one statement ending with ``;``.
    """
    text = (scripts / "claim1.sql").read_text().strip()
    if not text.endswith(";") or text.count(";") != 1:
        raise ValueError(f"claim1.sql is not one statement ending with ';': {text!r}")
    return f"{text[:-1]} RETURNING jobs.id".encode()


def raw_listener(dsn: str, claim: bytes, report: Connection, stop: Event) -> None:
    """LISTEN, say ``ready``; on each notification claim a row and report it."""
    with psycopg.connect(dsn, autocommit=True, application_name="bench-raw-wake") as conn:
        conn.execute("LISTEN bench_raw_wake")
        report.send(("ready", 0, monotonic_ns()))
        while not stop.is_set():
            # collected first: the generator holds the connection while it runs
            for _ in list(conn.notifies(timeout=0.2, stop_after=1)):
                row = conn.execute(claim).fetchone()
                report.send(("claimed", int(row[0]) if row else 0, monotonic_ns()))


def _receive(conn: Connection, timeout: float = _TIMEOUT) -> tuple[str, int, int]:
    if not conn.poll(timeout):
        raise TimeoutError(f"no report from the listening process within {timeout} s")
    try:
        kind, row_id, stamp = conn.recv()
    except EOFError:
        raise RuntimeError("the listening process exited; see its output above") from None
    return str(kind), int(row_id), int(stamp)


def raw_wake(dsn: str, scripts: Path, *, jobs: int, warmup: int) -> list[float]:
    """``jobs`` raw wake latencies in milliseconds (after ``warmup`` unmeasured ones),
    in ``dsn``, whose ``jobs`` table is empty (``schema.sql`` only).

    Raises:
        RuntimeError: the listener claimed another row than the one inserted.
        TimeoutError: the listener did not report within 10 s.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    listener = ctx.Process(
        target=raw_listener, args=(dsn, claim_statement(scripts), sender, stop), name="raw-wake"
    )
    listener.start()
    sender.close()
    samples: list[float] = []
    try:
        kind, _, _ = _receive(receiver)
        if kind != "ready":
            raise RuntimeError(f"the raw listener said {kind!r} before 'ready'")
        with psycopg.connect(dsn, autocommit=True, application_name="bench-raw-wake") as conn:
            for n in range(warmup + jobs):
                row = conn.execute(_INSERT_NOTIFY).fetchone()
                returned = monotonic_ns()
                kind, row_id, claimed = _receive(receiver)
                if row is None or kind != "claimed" or row_id != int(row[0]):
                    raise RuntimeError(f"inserted {row}, the listener reported {kind} {row_id}")
                if n >= warmup:
                    samples.append((claimed - returned) / 1e6)
    finally:
        stop.set()
        listener.join(10.0)
        if listener.is_alive():
            listener.terminate()
            listener.join()
        receiver.close()
    return samples


async def cyclone_wake(
    dsn: str, config: WorkerConfig, *, client_dsn: str, jobs: int, warmup: int
) -> dict[str, list[float]]:
    """``jobs`` Cyclone wake latencies in milliseconds (after ``warmup`` unmeasured):
    ``python_from_return`` (``enqueue()`` return to handler start), ``python_from_call``
    (``enqueue()`` call to handler start) and ``db`` (the step's ``started_at -
    created_at``). The worker and the producer connect to ``client_dsn``; ``dsn`` reads
    the steps.

    Raises:
        RuntimeError: the worker died, or reported another run than the one enqueued.
        TimeoutError: the worker did not report in time.
    """
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    stop = ctx.Event()
    options = {**config.options(), "report": sender, "stop": stop}
    worker = ctx.Process(target=probe_worker, args=(client_dsn,), kwargs=options, name="probe")
    worker.start()
    sender.close()
    from_return: dict[int, float] = {}
    from_call: dict[int, float] = {}
    wait = 10.0 + 2 * config.poll_interval
    try:
        kind, _, _ = await asyncio.to_thread(_receive, receiver, START_TIMEOUT)
        if kind != "ready":
            raise RuntimeError(f"the probe worker said {kind!r} before 'ready'")
        async with cyclone.Client(client_dsn, poll_interval=0.05, pooler=config.pooler) as client:
            for n in range(warmup + jobs):
                called = monotonic_ns()
                handle = await client.enqueue(PROBE_KIND, {})
                returned = monotonic_ns()
                kind, run_id, started = await asyncio.to_thread(_receive, receiver, wait)
                if kind != "started" or run_id != handle.run_id:
                    raise RuntimeError(f"expected run {handle.run_id}, got {kind} {run_id}")
                await client.wait(handle, timeout=wait)
                if n >= warmup:
                    from_return[run_id] = (started - returned) / 1e6
                    from_call[run_id] = (started - called) / 1e6
    finally:
        stop.set()
        await asyncio.to_thread(join_all, [worker])
        receiver.close()
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM started_at - created_at)::float8 * 1000 "
            "FROM cyclone_steps WHERE run_id = ANY(%s)",
            [list(from_return)],
        )
        db = [float(ms) for (ms,) in await cur.fetchall()]
    return {
        "db": db,
        "python_from_return": list(from_return.values()),
        "python_from_call": list(from_call.values()),
    }
