"""Prometheus metrics: a client's steps and worker, and the database's queues.

Needs the ``prometheus`` extra (``prometheus_client``); nothing here imports it until a
function is called, and importing :mod:`cyclone` never does.

* :func:`register_metrics` adds a client's step counters and histograms (fed by an
  :class:`~cyclone.observability.Observer` the engine calls after each event) and the
  gauges of its worker (read from the client at scrape time) to a registry.
* :func:`register_database_metrics` adds gauges of the whole database (queues,
  expired leases, overdue schedules), read at most once per ``max_age`` seconds
  whatever the number of scrapes.
* :func:`cyclone.observability.serve.start_metrics_server` serves a registry at
  ``/metrics``; ``cyclone worker --metrics-port`` does all three for a worker process.

Every label value is a kind or a queue name, never a run or a step id, so that the
number of series stays bounded by the kinds and queues an application has.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from cyclone.errors import ConfigurationError
from cyclone.observability.hooks import Observer, Outcome

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from cyclone.client import Client
    from cyclone.observability.collectors import WorkerCollector
    from cyclone.transitions import Claimed

__all__ = [
    "BUCKETS",
    "DATABASE_GAUGES",
    "EXPORTED",
    "STEP_COUNTERS",
    "STEP_HISTOGRAMS",
    "WORKER_GAUGES",
    "StepMetrics",
    "prometheus",
    "register_database_metrics",
    "register_metrics",
]

BUCKETS: tuple[float, ...] = (
    *(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
    *(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0),
)
"""Upper bounds (seconds) of the histograms' buckets: a millisecond to an hour."""

STEP_COUNTERS: dict[str, str] = {
    "cyclone_steps_claimed": "Steps this worker claimed (each execution counts once).",
    "cyclone_steps_completed": "Steps this worker completed (the completion committed).",
    "cyclone_steps_failed": (
        "Failed attempts on this worker (retried or discarded: the last attempt of a "
        "discarded step included)."
    ),
    "cyclone_steps_discarded": (
        "Steps discarded: by this worker (attempts spent, Discard, an error not "
        "retried) or by this client's sweep (reclaim limit)."
    ),
    "cyclone_steps_reclaimed": (
        "Steps this client's sweep gave back (lease expired or timeout passed)."
    ),
}
"""Counter name (the exposed sample adds ``_total``) -> help; labels ``kind``, ``queue``."""

STEP_HISTOGRAMS: dict[str, str] = {
    "cyclone_step_duration_seconds": "Seconds a handler ran, per execution.",
    "cyclone_step_queue_latency_seconds": "Seconds from a step's ready time to its claim.",
}
"""Histogram name -> help; labels ``kind``, ``queue``; buckets :data:`BUCKETS`."""

WORKER_GAUGES: dict[str, str] = {
    "cyclone_worker_slots": "Slots of this worker per queue it serves.",
    "cyclone_worker_slots_busy": "Slots of this worker running a step now, per queue.",
    "cyclone_worker_leases_held": "Steps this worker holds a lease on now.",
    "cyclone_worker_completion_tx_open": "Completion transactions this worker has open now.",
    "cyclone_worker_listener_connected": (
        "1 while the LISTEN connection is up (of every client in the registry), else 0."
    ),
}
"""Gauge name -> help, read from the client at each scrape; the first two labelled
``queue``."""

DATABASE_GAUGES: dict[str, str] = {
    "cyclone_database_up": "1 when the last read of the database succeeded, else 0.",
    "cyclone_queue_available": "Steps waiting to be claimed, scheduled ones included.",
    "cyclone_queue_running": "Steps held under a lease.",
    "cyclone_queue_waiting": "Steps waiting for a signal, a timer or a child run.",
    "cyclone_queue_oldest_available_seconds": (
        "Seconds since the oldest claimable step became due (0: none claimable)."
    ),
    "cyclone_queue_expired_leases": "Running steps whose lease expired (the sweep's work).",
    "cyclone_schedules_overdue": "Enabled schedules more than a minute late to fire.",
}
"""Gauge name -> help, read from the database; the ``cyclone_queue_*`` ones labelled
``queue``."""

EXPORTED: frozenset[str] = frozenset(
    {f"{name}_total" for name in STEP_COUNTERS}
    | {f"{name}{end}" for name in STEP_HISTOGRAMS for end in ("_bucket", "_count", "_sum")}
    | set(WORKER_GAUGES)
    | set(DATABASE_GAUGES)
)
"""Every sample name a scrape of Cyclone's metrics may show (besides the ``_created``
samples ``prometheus_client`` adds to counters and histograms)."""

_HINT = "pip install -e '.[prometheus]' in a checkout of Cyclone"


def prometheus() -> ModuleType:
    """The ``prometheus_client`` module, imported now.

    Raises:
        ConfigurationError: it is not installed (the message names the extra).
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigurationError(
            f"Prometheus metrics need the prometheus extra (prometheus_client): {_HINT} ({exc})"
        ) from None
    return prometheus_client


class _Children(NamedTuple):
    """The series of one ``(kind, queue)`` (``prometheus_client`` children)."""

    claimed: Any
    completed: Any
    failed: Any
    discarded: Any
    duration: Any
    queue_latency: Any


class StepMetrics(Observer):
    """The step counters and histograms of one registry, fed by the engine's events.

    One instance per registry, shared by every client registered in it (their counts
    add up). Made by :func:`register_metrics`.

    Raises:
        ValueError: the registry already holds metrics of these names (registered
            other than through :func:`register_metrics`).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        labels = ("kind", "queue")
        counters = {
            name: Counter(name, text, labels, registry=registry)
            for name, text in STEP_COUNTERS.items()
        }
        self.claimed = counters["cyclone_steps_claimed"]
        self.completed = counters["cyclone_steps_completed"]
        self.failed = counters["cyclone_steps_failed"]
        self.discarded = counters["cyclone_steps_discarded"]
        self.reclaimed = counters["cyclone_steps_reclaimed"]
        self._counters = tuple(counters.values())
        histograms = {
            name: Histogram(name, text, labels, registry=registry, buckets=BUCKETS)
            for name, text in STEP_HISTOGRAMS.items()
        }
        self.duration = histograms["cyclone_step_duration_seconds"]
        self.queue_latency = histograms["cyclone_step_queue_latency_seconds"]
        self._children: dict[tuple[str, str], _Children] = {}

    def _of(self, kind: str, queue: str) -> _Children:
        """The labelled series of ``(kind, queue)``, looked up once."""
        children = self._children.get((kind, queue))
        if children is None:
            children = _Children(
                claimed=self.claimed.labels(kind, queue),
                completed=self.completed.labels(kind, queue),
                failed=self.failed.labels(kind, queue),
                discarded=self.discarded.labels(kind, queue),
                duration=self.duration.labels(kind, queue),
                queue_latency=self.queue_latency.labels(kind, queue),
            )
            self._children[kind, queue] = children
        return children

    def prepare(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Start the counters of each ``(kind, queue)`` at 0, so that a rate over them
        is defined before the first event."""
        for pair in pairs:
            for counter in self._counters:
                counter.labels(*pair)

    def step_claimed(self, step: Claimed) -> None:
        """Count the claim; observe its queue latency (seconds, ready to claim)."""
        children = self._of(step.kind, step.queue)
        children.claimed.inc()
        children.queue_latency.observe(max(0.0, step.queue_latency))

    def step_ended(self, step: Claimed, outcome: Outcome, duration: float | None) -> None:
        """Count the outcome (a discard is also a failed attempt); observe the handler's
        seconds when it returned."""
        children = self._of(step.kind, step.queue)
        if outcome == "completed":
            children.completed.inc()
        elif outcome in ("failed", "discarded"):
            children.failed.inc()
            if outcome == "discarded":
                children.discarded.inc()
        if duration is not None:
            children.duration.observe(max(0.0, duration))

    def step_reclaimed(self, kind: str, queue: str) -> None:
        """Count a reclaim by this client's sweep."""
        self.reclaimed.labels(kind, queue).inc()

    def step_swept_discard(self, kind: str, queue: str) -> None:
        """Count a discard by this client's sweep (reclaim limit reached)."""
        self.discarded.labels(kind, queue).inc()


class _Registered:
    """What :func:`register_metrics` added to one registry."""

    __slots__ = ("steps", "worker")

    def __init__(self, steps: StepMetrics, worker: WorkerCollector) -> None:
        self.steps, self.worker = steps, worker


_REGISTERED: weakref.WeakKeyDictionary[CollectorRegistry, _Registered] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def register_metrics(
    client: Client, registry: CollectorRegistry | None = None
) -> CollectorRegistry:
    """Add ``client``'s step metrics and worker gauges to ``registry``.

    The counters ``cyclone_steps_{claimed,completed,failed,discarded,reclaimed}_total``
    and the histograms ``cyclone_step_duration_seconds`` and
    ``cyclone_step_queue_latency_seconds`` (seconds, :data:`BUCKETS`) are labelled
    ``kind`` and ``queue``; the gauges ``cyclone_worker_*`` are read from the client at
    each scrape (absent or 0 while it is not started). Call it before or after
    ``start()``; the counters of the client's kinds start at 0.

    Several clients in one registry add up: their counters and gauges are summed (one
    series per kind and queue, not per client), and ``cyclone_worker_listener_connected``
    is 1 only while every one of them listens. Registering a client again in the same
    registry does nothing.

    Args:
        client: a :class:`cyclone.Client` (a client without handlers runs no worker:
            its counters and gauges stay at 0).
        registry: a ``prometheus_client.CollectorRegistry``; ``None``: the default
            ``prometheus_client.REGISTRY``.

    Returns:
        The registry (to serve with
        :func:`cyclone.observability.serve.start_metrics_server`).

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed (the ``prometheus``
            extra).
        ValueError: the registry already holds metrics of these names that
            :func:`register_metrics` did not add.
    """
    prom = prometheus()
    from cyclone.observability.collectors import WorkerCollector

    target: CollectorRegistry = prom.REGISTRY if registry is None else registry
    with _LOCK:
        state = _REGISTERED.get(target)
        if state is None:
            worker = WorkerCollector()
            steps = StepMetrics(target)
            target.register(worker)
            state = _REGISTERED[target] = _Registered(steps, worker)
        if not state.worker.add(client):
            return target
        client.observers.add(state.steps)
        state.steps.prepare(
            (handler.kind, handler.options.queue)
            for handler in client.handlers.values()
            if handler.options.queue in client.queues
        )
    return target


def register_database_metrics(
    dsn: str,
    registry: CollectorRegistry | None = None,
    *,
    schema: str = "public",
    pooler: str | None = None,
    max_age: float = 5.0,
) -> CollectorRegistry:
    """Add the database gauges of Cyclone's tables at ``dsn`` to ``registry``.

    ``cyclone_queue_{available,running,waiting,expired_leases}`` and
    ``cyclone_queue_oldest_available_seconds`` (label ``queue``, one series per queue
    with unfinished steps, as ``cyclone queues`` lists them), ``cyclone_schedules_overdue``
    and ``cyclone_database_up``. A scrape reads the database only when the last read is
    ``max_age`` seconds old or more (one short connection, two statements); concurrent
    scrapes share that read. When the database cannot be read, the scrape still
    answers: ``cyclone_database_up`` is 0 and the other gauges are left out (until the
    next read, ``max_age`` later).

    Args:
        dsn: a libpq connection string or URL.
        registry: a ``prometheus_client.CollectorRegistry``; ``None``: the default
            ``prometheus_client.REGISTRY``.
        schema: the Postgres schema of Cyclone's tables (``cyclone --schema``).
        pooler: ``"transaction"`` behind a transaction-mode pooler (default:
            ``$CYCLONE_POOLER``, else ``"session"``).
        max_age: seconds a read serves scrapes for, 0 to 3600.

    Returns:
        The registry.

    Raises:
        ConfigurationError: ``prometheus_client`` is not installed.
        ValidationError: a bad connection string, schema, pooler or ``max_age``.
        ValueError: the registry already holds these gauges (registered twice).
    """
    prom = prometheus()
    from cyclone.observability.collectors import DatabaseCollector

    target: CollectorRegistry = prom.REGISTRY if registry is None else registry
    target.register(DatabaseCollector(dsn, schema=schema, pooler=pooler, max_age=max_age))
    return target
