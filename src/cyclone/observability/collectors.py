"""The collectors read at scrape time: a worker's gauges, and the database's.

This module imports ``prometheus_client``: reach it through
:mod:`cyclone.observability.metrics`, whose functions check first that the
``prometheus`` extra is installed.

Scrapes run in the threads of the HTTP server, concurrently with the client's event
loop: the worker gauges read a few integers the loop keeps (never awaiting anything,
never taking a lock the loop holds); the database gauges read the database at most once
per ``max_age`` seconds, under a lock, and every scrape in between answers from that
read.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cyclone.connections import ConnectionSettings
from cyclone.dbio import Stmt, batch_sync
from cyclone.errors import ValidationError
from cyclone.observability.metrics import DATABASE_GAUGES, WORKER_GAUGES
from cyclone.records import QueueStats
from cyclone.sql import Q

if TYPE_CHECKING:
    from cyclone.client import Client

__all__ = ["CONNECT_TIMEOUT", "STATEMENT_TIMEOUT_MS", "DatabaseCollector", "WorkerCollector"]

log = logging.getLogger("cyclone.observability")

CONNECT_TIMEOUT = 3.0
"""Seconds a database read waits for its connection (a scrape must answer in time)."""
STATEMENT_TIMEOUT_MS = 5_000
"""A database read's statements are cancelled after this many milliseconds (not behind
a transaction pooler, where no session setting is made)."""


def _gauge(name: str, help_text: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=labels)


class WorkerCollector(Collector):
    """The ``cyclone_worker_*`` gauges of the clients registered (summed), read from
    each client's running worker at every scrape. Made by
    :func:`cyclone.observability.metrics.register_metrics`.

    A client is held by a weak reference: one dropped leaves the registry's gauges.
    """

    def __init__(self) -> None:
        self._clients: weakref.WeakSet[Client] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, client: Client) -> bool:
        """Read ``client`` too; False when it was already read."""
        with self._lock:
            if client in self._clients:
                return False
            self._clients.add(client)
            return True

    def describe(self) -> Iterator[Metric]:
        """The gauges' names, without values (the registry checks them for clashes)."""
        yield from self._families()

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            _gauge(name, text, ["queue"] if name.endswith(("slots", "busy")) else None)
            for name, text in WORKER_GAUGES.items()
        ]

    def collect(self) -> Iterator[Metric]:
        """The gauges now: slots and busy slots per queue, leases held, completion
        transactions open (each summed over the started clients; per-queue series only
        for queues a started client serves), and whether every client listens."""
        with self._lock:
            clients = list(self._clients)
        slots: dict[str, int] = {}
        busy: dict[str, int] = {}
        held = tx_open = 0
        listening = bool(clients)
        for client in clients:
            listening = listening and client.listening
            worker = client.worker
            if worker is None:
                continue  # not started (or no handlers): nothing held, no slots
            for queue, (size, running) in worker.load.items():
                slots[queue] = slots.get(queue, 0) + size
                busy[queue] = busy.get(queue, 0) + running
            held += worker.held
            tx_open += worker.completion_tx_open
        slots_f, busy_f, held_f, tx_f, listen_f = self._families()
        for queue in sorted(slots):
            slots_f.add_metric([queue], slots[queue])
            busy_f.add_metric([queue], busy[queue])
        held_f.add_metric([], held)
        tx_f.add_metric([], tx_open)
        listen_f.add_metric([], 1 if listening else 0)
        yield from (slots_f, busy_f, held_f, tx_f, listen_f)


@dataclass(frozen=True, slots=True)
class DatabaseSnapshot:
    """One read of the database: ``up`` (the read succeeded), ``queues`` (every queue
    with unfinished steps) and ``overdue`` (schedules more than a minute late)."""

    up: bool
    queues: tuple[QueueStats, ...] = ()
    overdue: int = 0


class DatabaseCollector(Collector):
    """The database gauges (:data:`cyclone.observability.metrics.DATABASE_GAUGES`),
    read at most once per ``max_age`` seconds and shared by every scrape.

    Args:
        conninfo: a libpq connection string or URL.
        schema: the Postgres schema of Cyclone's tables.
        pooler: ``"transaction"`` behind a transaction-mode pooler.
        max_age: seconds a read serves scrapes for, 0 to 3600 (0: every scrape reads).

    Attributes:
        reads: reads of the database so far (each one connection and one round trip of
            statements; a failed read counts).

    Raises:
        ValidationError: a bad connection string, schema, pooler or ``max_age``.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "public",
        pooler: str | None = None,
        max_age: float = 5.0,
    ) -> None:
        if isinstance(max_age, bool) or not isinstance(max_age, int | float):
            raise ValidationError(f"max_age must be seconds, got {max_age!r}")
        if not 0 <= max_age <= 3600:
            raise ValidationError(f"max_age must be 0 to 3600 seconds, got {max_age!r}")
        # A scrape must answer in seconds: the DSN's own connect_timeout (a worker's may
        # be generous) gives way to CONNECT_TIMEOUT here (per host of a multi-host DSN).
        params = conninfo_to_dict(conninfo)
        params.pop("connect_timeout", None)
        self.settings = ConnectionSettings.build(
            make_conninfo("", **params),
            schema=schema,
            pooler=pooler,
            connect_timeout=CONNECT_TIMEOUT,
            tcp_user_timeout=10.0,
        )
        self.max_age = float(max_age)
        self.reads = 0
        self._lock = threading.Lock()
        self._last: DatabaseSnapshot | None = None
        self._read_at = -math.inf
        self._failing = False

    def describe(self) -> Iterator[Metric]:
        """The gauges' names, without values (registering reads nothing)."""
        yield from self._families()

    def snapshot(self) -> DatabaseSnapshot:
        """The last read, or a new one when it is ``max_age`` seconds old or more;
        never raises (a failed read is a snapshot with ``up`` False, logged once until
        a read succeeds again)."""
        with self._lock:
            if self._last is None or time.monotonic() - self._read_at >= self.max_age:
                self._last = self._read()
                self._read_at = time.monotonic()
            return self._last

    def _read(self) -> DatabaseSnapshot:
        self.reads += 1
        settings = self.settings
        stmts: list[Stmt[Any]] = []
        if not settings.per_transaction:
            stmts.append(Stmt(Q.dashboard_statement_timeout, {"ms": str(STATEMENT_TIMEOUT_MS)}))
        stmts += [Stmt(Q.dashboard_queue_stats), Stmt(Q.monitor_schedules_overdue)]
        try:
            with psycopg.connect(
                settings.conninfo_for("cyclone-metrics"), **settings.kwargs(autocommit=True)
            ) as conn:
                settings.configure_sync()(conn)
                results = batch_sync(conn, stmts, transaction=True)
        except Exception as exc:  # a scrape never fails: the gauge says the database is down
            if not self._failing:
                log.warning("metrics: the database cannot be read (reported once): %s", exc)
            self._failing = True
            return DatabaseSnapshot(up=False)
        if self._failing:
            log.info("metrics: the database can be read again")
        self._failing = False
        (overdue,) = results.of(Q.monitor_schedules_overdue)
        return DatabaseSnapshot(
            up=True, queues=tuple(results.of(Q.dashboard_queue_stats)), overdue=overdue.total
        )

    def _families(self) -> list[GaugeMetricFamily]:
        return [
            _gauge(name, text, ["queue"] if name.startswith("cyclone_queue_") else None)
            for name, text in DATABASE_GAUGES.items()
        ]

    def collect(self) -> Iterator[Metric]:
        """``cyclone_database_up``, and when the database was read, the queue gauges
        (one series per queue with unfinished steps) and the overdue schedules."""
        snap = self.snapshot()
        up, available, running, waiting, oldest, expired, overdue = self._families()
        up.add_metric([], 1 if snap.up else 0)
        yield up
        if not snap.up:
            return
        for q in snap.queues:
            available.add_metric([q.queue], q.available)
            running.add_metric([q.queue], q.running)
            waiting.add_metric([q.queue], q.waiting)
            oldest.add_metric([q.queue], q.oldest_available_age or 0.0)
            expired.add_metric([q.queue], q.expired_leases)
        overdue.add_metric([], snap.overdue)
        yield from (available, running, waiting, oldest, expired, overdue)
