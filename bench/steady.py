"""The steady phase of the bloat benchmark: a paced load, a held horizon, the samples.

:class:`SteadyLoad` starts the no-op worker processes of :mod:`bench.workers` (with a
short ``purge_interval``), meets them at a barrier, takes second 0 from the database's
clock and then runs, side by side until ``duration_s``:

* the **producer**: one client without handlers (its ``retention`` is stored on every
  step) that every ``tick`` seconds enqueues, with one ``enqueue_many``, the jobs due by
  then at ``rate`` jobs/s, so that a slow enqueue is caught up at the next tick; it
  counts the jobs enqueued per second (the driver's clock, started with second 0);
* the **collector**: every second, the finished steps above a watermark of
  ``cyclone_steps.id`` (by its primary key): each job's start and completion times and
  its pickup latency ``started_at - created_at``, on the database clock, into a
  :class:`bench.recovery.Series`; it runs well within the retention, so the purge
  deletes nothing unread;
* the **sampler**: every ``sample_interval`` seconds, ``pg_stat_user_tables`` of
  ``cyclone_steps`` and ``cyclone_runs`` (``n_live_tup``, ``n_dead_tup``, vacuum counts,
  ``pg_table_size``), the size of ``idx_steps_claim``, the oldest horizon holder of
  the database in ``pg_stat_activity`` (``age(backend_xmin)`` or ``age(backend_xid)``,
  and its transaction's age),
  ``cyclone_v_queues``' oldest available age, the load average, the machine's busy
  CPU ticks and the share of the load monitor's samples that saw other databases busy;
* the **holder**: at ``hold_start_s`` a separate connection to the same database turns
  off ``idle_in_transaction_session_timeout`` for itself, runs ``BEGIN ISOLATION LEVEL
  REPEATABLE READ`` and ``SELECT pg_current_xact_id()`` (a snapshot and an xid, as a
  session left idle in a transaction after a write holds), and commits ``hold_s`` later.
  Until then no vacuum of this database can remove a row version that died after it
  began.

* the **vacuum**, only when ``vacuum_interval`` is given (the server runs without
  autovacuum): ``VACUUM cyclone_steps, cyclone_runs`` every ``vacuum_interval``
  seconds, standing in for autovacuum; it too removes nothing the horizon protects.

A connection of the driver that the server drops (another session terminating
backends, say) is noted in :attr:`SteadyResult.errors` and opened again; the worker
processes recover on their own, as any Cyclone client does.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import psycopg

import cyclone
from bench.db import log
from bench.fleet import Fleet, started_together
from bench.monitor import LoadMonitor, machine_cpu
from bench.recovery import Series
from bench.workers import NOOP_KIND, throughput_worker

__all__ = ["Sample", "SteadyLoad", "SteadyResult"]

TABLES = ("cyclone_steps", "cyclone_runs")
_COLLECT_LIMIT = 20_000  # steps one collector pass reads at most
_ENQUEUE_CHUNK = 1_000  # most inputs of one enqueue_many call

_COLLECT = """
SELECT id,
       state,
       extract(epoch FROM started_at - %(t0)s)::float8,
       extract(epoch FROM completed_at - %(t0)s)::float8,
       extract(epoch FROM started_at - created_at)::float8 * 1000
FROM cyclone_steps
WHERE id > %(after)s
ORDER BY id
LIMIT %(limit)s
"""

_TABLE_STATS = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, vacuum_count,
       extract(epoch FROM last_autovacuum - %(t0)s)::float8, pg_table_size(relid)
FROM pg_stat_user_tables
WHERE relname = ANY(%(tables)s)
"""

_HORIZON = """
SELECT extract(epoch FROM clock_timestamp() - %(t0)s)::float8,
       (SELECT max(greatest(age(backend_xmin), age(backend_xid))) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()),
       (SELECT extract(epoch FROM max(clock_timestamp() - xact_start))::float8
        FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)),
       (SELECT extract(epoch FROM max(oldest_available_age))::float8 FROM cyclone_v_queues),
       pg_relation_size('idx_steps_claim')
"""

T = TypeVar("T")

_TERMINAL = frozenset({"completed", "discarded", "cancelled"})


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of the sampler; ``at_s`` is seconds since second 0 (database clock).

    ``tables``: per table, ``n_live_tup``, ``n_dead_tup``, ``autovacuum_count``,
    ``vacuum_count``, ``last_autovacuum_s`` (seconds since second 0, or ``None``) and
    ``bytes`` (``pg_table_size``). ``xmin_age``: the largest ``age(backend_xmin)`` or
    ``age(backend_xid)`` of the database's other sessions (a READ COMMITTED transaction
    between statements has no xmin, but its xid, once it wrote, holds the horizon too);
    ``oldest_xact_s``: the age of the oldest of their transactions that holds either;
    ``oldest_available_s``: ``cyclone_v_queues``' largest oldest available age;
    ``claim_index_bytes``: the size of ``idx_steps_claim``; ``loadavg``: the 1, 5 and 15
    minute load averages; ``cpu``: :func:`bench.monitor.machine_cpu`;
    ``foreign_share``: the share of the load monitor's samples since the previous sample
    that saw another database active.
    """

    at_s: float
    tables: dict[str, dict[str, Any]]
    xmin_age: int | None
    oldest_xact_s: float | None
    oldest_available_s: float | None
    claim_index_bytes: int
    loadavg: tuple[float, float, float]
    cpu: tuple[int, int] | None
    foreign_share: float | None

    def to_json(self) -> dict[str, Any]:
        """As a JSON object (the CPU ticks left out)."""
        return {
            "at_s": round(self.at_s, 3),
            "tables": self.tables,
            "xmin_age": self.xmin_age,
            "oldest_xact_s": self.oldest_xact_s,
            "oldest_available_s": self.oldest_available_s,
            "claim_index_bytes": self.claim_index_bytes,
            "loadavg": list(self.loadavg),
            "foreign_share": self.foreign_share,
        }


@dataclass(slots=True)
class SteadyResult:
    """What the steady phase recorded (times in seconds since second 0)."""

    series: Series
    samples: list[Sample]
    held_at_s: float | None = None
    released_at_s: float | None = None
    holder_xid: str | None = None
    enqueued: int = 0
    collected: int = 0
    not_completed: int = 0
    backlog_at_end: int = 0
    worker_cpu_s: tuple[float, ...] = ()
    vacuums: list[tuple[float, float]] = field(default_factory=list)
    """The bench's own VACUUMs: (start, seconds taken), when it ran any."""
    errors: list[str] = field(default_factory=list)
    """Connections of the driver the server dropped (each was opened again)."""


def _lost(errors: list[str], who: str, exc: psycopg.Error) -> None:
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    errors.append(f"{who}: {first_line}")
    log(f"  {who} lost its connection ({first_line}); carrying on")


async def _backlog(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM cyclone_steps WHERE state = 'available'")
    row = await cur.fetchone()
    return int(row[0]) if row else 0


class _Link:
    """A connection of the driver, opened again after the server drops it."""

    def __init__(self, dsn: str, name: str, errors: list[str]) -> None:
        self._dsn = dsn
        self._name = name
        self._errors = errors
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def run(self, call: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T | None:
        """``call(conn)``; ``None`` (the error noted) when the connection failed."""
        try:
            if self._conn is None:
                self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
            return await call(self._conn)
        except psycopg.OperationalError as exc:
            _lost(self._errors, self._name, exc)
            await self.close()
            return None

    async def close(self) -> None:
        """Close the connection, if open."""
        if self._conn is not None:
            await self._conn.close()
            self._conn = None


class SteadyLoad:
    """One steady phase against ``dsn`` (a migrated, emptied Cyclone database)."""

    def __init__(
        self,
        dsn: str,
        monitor: LoadMonitor,
        *,
        rate: float,
        duration_s: int,
        hold_start_s: float,
        hold_s: float,
        worker_options: dict[str, Any],
        processes: int,
        retention_s: float,
        sample_interval: float,
        tick: float,
        vacuum_interval: float | None = None,
    ) -> None:
        self.dsn = dsn
        self.monitor = monitor
        self.rate = rate
        self.duration_s = duration_s
        self.hold_start_s = hold_start_s
        self.hold_s = hold_s
        self.worker_options = worker_options
        self.processes = processes
        self.retention_s = retention_s
        self.sample_interval = sample_interval
        self.tick = tick
        self.vacuum_interval = vacuum_interval
        self.result = SteadyResult(series=Series(duration_s), samples=[])
        self._began = 0.0
        self._t0: datetime | None = None
        self._seen: set[int] = set()
        self._watermark = 0

    def _at(self, seconds: float) -> float:
        """The loop time of ``seconds`` after second 0."""
        return self._began + seconds

    async def _sleep_until(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, self._at(seconds) - asyncio.get_running_loop().time()))

    async def run(self) -> SteadyResult:
        """Start the workers, run the load for ``duration_s``, stop them; the result."""
        async with started_together(
            throughput_worker, [(self.dsn,)] * self.processes, self.worker_options
        ) as fleet:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                cur = await conn.execute("SELECT clock_timestamp()")
                row = await cur.fetchone()
                assert row is not None
                self._t0 = row[0]
            self._began = asyncio.get_running_loop().time()
            collector = _Link(self.dsn, "collector", self.result.errors)
            sampler = _Link(self.dsn, "sampler", self.result.errors)
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._produce())
                    group.create_task(self._collect(collector))
                    group.create_task(self._sample(sampler))
                    group.create_task(self._hold())
                    group.create_task(self._watch(fleet))
                    if self.vacuum_interval:
                        group.create_task(self._vacuum(self.vacuum_interval))
                await collector.run(self._collect_once)
                self.result.backlog_at_end = await collector.run(_backlog) or 0
            finally:
                await collector.close()
                await sampler.close()
        self.result.worker_cpu_s = tuple(fleet.cpu_s)
        return self.result

    async def _watch(self, fleet: Fleet) -> None:
        while asyncio.get_running_loop().time() < self._at(self.duration_s):
            if not fleet.alive():
                raise RuntimeError("a worker process died; see its output above")
            await asyncio.sleep(1.0)

    # -- the producer ----------------------------------------------------------------

    async def _produce(self) -> None:
        loop = asyncio.get_running_loop()
        sent = 0
        async with cyclone.Client(self.dsn, retention=self.retention_s) as client:
            while (now := loop.time()) < self._at(self.duration_s):
                due = int(self.rate * (now - self._began)) - sent
                while due > 0:
                    chunk = min(due, _ENQUEUE_CHUNK)
                    try:
                        await client.enqueue_many(NOOP_KIND, [{}] * chunk)
                    except psycopg.OperationalError as exc:  # caught up at the next tick
                        _lost(self.result.errors, "producer", exc)
                        break
                    sent += chunk
                    due -= chunk
                    self.result.series.enqueue(loop.time() - self._began, chunk)
                await asyncio.sleep(self.tick)
        self.result.enqueued = sent

    # -- the collector ---------------------------------------------------------------

    async def _collect(self, link: _Link) -> None:
        while asyncio.get_running_loop().time() < self._at(self.duration_s):
            await asyncio.sleep(1.0)
            await link.run(self._collect_once)

    async def _collect_once(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Record the finished steps above the watermark not seen yet; move it up."""
        cur = await conn.execute(
            _COLLECT, {"t0": self._t0, "after": self._watermark, "limit": _COLLECT_LIMIT}
        )
        contiguous = True
        for step_id, state, started, completed, pickup_ms in await cur.fetchall():
            done = state in _TERMINAL
            if done and step_id not in self._seen:
                self._seen.add(step_id)
                self.result.collected += 1
                if state == "completed":
                    self.result.series.add(started, completed, pickup_ms)
                else:
                    self.result.not_completed += 1
            contiguous = contiguous and done
            if contiguous:
                self._watermark = step_id
        self._seen = {step_id for step_id in self._seen if step_id > self._watermark}

    # -- the sampler -----------------------------------------------------------------

    async def _sample(self, link: _Link) -> None:
        every = max(1, round(15 / self.sample_interval))
        n = 0
        while asyncio.get_running_loop().time() < self._at(self.duration_s):
            sample = await link.run(self._sample_once)
            if sample is not None:
                self.result.samples.append(sample)
                if n % every == 0:
                    self._progress(sample)
            n += 1
            await self._sleep_until(n * self.sample_interval)
        if (sample := await link.run(self._sample_once)) is not None:
            self.result.samples.append(sample)

    async def _sample_once(self, conn: psycopg.AsyncConnection[Any]) -> Sample:
        params = {"t0": self._t0, "tables": list(TABLES)}
        cur = await conn.execute(_TABLE_STATS, params)
        tables = {
            str(name): {
                "n_live_tup": int(live),
                "n_dead_tup": int(dead),
                "autovacuum_count": int(autovacuums),
                "vacuum_count": int(vacuums),
                "last_autovacuum_s": last,
                "bytes": int(size),
            }
            for name, live, dead, autovacuums, vacuums, last, size in await cur.fetchall()
        }
        cur = await conn.execute(_HORIZON, params)
        row = await cur.fetchone()
        assert row is not None
        at, xmin_age, oldest_xact, oldest_available, claim_index = row
        share = self.monitor.take()["busy_share"]
        return Sample(
            at_s=float(at),
            tables=tables,
            xmin_age=None if xmin_age is None else int(xmin_age),
            oldest_xact_s=oldest_xact,
            oldest_available_s=oldest_available,
            claim_index_bytes=int(claim_index),
            loadavg=os.getloadavg(),
            cpu=machine_cpu(),
            foreign_share=share,
        )

    def _progress(self, sample: Sample) -> None:
        series = self.result.series
        now = min(int(sample.at_s), series.seconds)
        recent = sum(series.completed[max(0, now - 10) : now]) / 10
        dead = "  ".join(
            f"{name.removeprefix('cyclone_')} dead {stats['n_dead_tup']:>9,}"
            for name, stats in sample.tables.items()
        )
        held = (
            "  HELD" if self.result.held_at_s is not None and not self.result.released_at_s else ""
        )
        log(
            f"  {sample.at_s:6.0f} s  completed {recent:>7,.0f}/s (last 10 s)  {dead}  "
            f"load {sample.loadavg[0]:.2f}{held}"
        )

    # -- the vacuum ------------------------------------------------------------------

    async def _vacuum(self, interval: float) -> None:
        link = _Link(self.dsn, "vacuum", self.result.errors)

        async def vacuum(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute("VACUUM cyclone_steps, cyclone_runs")

        try:
            n = 1
            while n * interval < self.duration_s:
                await self._sleep_until(n * interval)
                began = asyncio.get_running_loop().time()
                await link.run(vacuum)
                took = asyncio.get_running_loop().time() - began
                self.result.vacuums.append((round(began - self._began, 3), round(took, 3)))
                n += 1
        finally:
            await link.close()

    # -- the holder ------------------------------------------------------------------

    async def _hold(self) -> None:
        if self.hold_s <= 0:
            return
        await self._sleep_until(self.hold_start_s)
        async with await psycopg.AsyncConnection.connect(
            self.dsn, autocommit=True, application_name="bench-horizon-holder"
        ) as conn:
            await conn.execute("SET idle_in_transaction_session_timeout = 0")
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            cur = await conn.execute(
                "SELECT pg_current_xact_id()::text, extract(epoch FROM now() - %(t0)s)::float8",
                {"t0": self._t0},
            )
            row = await cur.fetchone()
            assert row is not None
            self.result.holder_xid, self.result.held_at_s = str(row[0]), float(row[1])
            log(f"  horizon held at {self.result.held_at_s:.1f} s (xid {row[0]})")
            began = time.monotonic()
            await self._sleep_until(self.hold_start_s + self.hold_s)
            try:
                cur = await conn.execute(
                    "SELECT extract(epoch FROM clock_timestamp() - %(t0)s)::float8",
                    {"t0": self._t0},
                )
                row = await cur.fetchone()
                assert row is not None
                await conn.execute("COMMIT")
            except psycopg.OperationalError as exc:  # the hold may have ended earlier
                _lost(self.result.errors, "holder", exc)
                row = (asyncio.get_running_loop().time() - self._began,)
            self.result.released_at_s = float(row[0])
            log(
                f"  horizon released at {self.result.released_at_s:.1f} s "
                f"(held {time.monotonic() - began:.0f} s)"
            )
