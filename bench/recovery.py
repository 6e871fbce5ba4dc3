"""The figures of the bloat benchmark, computed from its per-second series (pure, no I/O).

:mod:`bench.bloat` records, on the database's clock, each job's enqueue, pickup
(``started_at``) and completion second counted from the start of the steady load, and
samples ``pg_stat_user_tables`` every few seconds. This module turns them into:

* one-window figures (:func:`window_figures`): completions per second and the pickup
  latency percentiles (``started_at - created_at``) of the jobs picked up in the window;
* the baseline (:func:`baseline`): the median of the one-window figures over the
  windows 2-5 (1-based; the first window is the warm-up), cut short at the start of the
  hold, or the whole span before the hold when that leaves nothing;
* the recovery (:func:`recovery_after`): how many seconds after the release the figures
  of a whole window (one sliding window of ``window_s`` seconds, at one-second steps)
  are first back within the tolerance of the baseline: throughput within +-10 %, pickup
  p99 at most 10 % above (a faster pickup is no sign of trouble);
* the dead-tuple summary (:func:`dead_tuples`): the baseline median, the peak, the end
  value and when the count came back under twice the baseline after the release.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Baseline",
    "DeadTuples",
    "Recovery",
    "Series",
    "WindowFigures",
    "baseline",
    "baseline_span",
    "dead_tuples",
    "percentile",
    "recovery_after",
    "window_figures",
]

TOLERANCE = 0.10
"""How far from the baseline a recovered figure may be (a share of the baseline)."""
DEAD_FACTOR = 2.0
"""The dead-tuple count is back when it is at most this many times its baseline."""


@dataclass(slots=True)
class Series:
    """Per-second counts of the steady phase; second 0 is the start of the load.

    ``enqueued[s]``, ``completed[s]``: jobs enqueued, completed in second ``s``.
    ``pickups_ms[s]``: the pickup latencies (milliseconds) of the jobs that started in
    second ``s``. Events outside ``[0, seconds)`` are dropped.
    """

    seconds: int
    enqueued: list[int] = field(default_factory=list)
    completed: list[int] = field(default_factory=list)
    pickups_ms: list[list[float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.enqueued = self.enqueued or [0] * self.seconds
        self.completed = self.completed or [0] * self.seconds
        self.pickups_ms = self.pickups_ms or [[] for _ in range(self.seconds)]

    def _second(self, at: float | None) -> int | None:
        if at is None or at < 0:
            return None
        second = math.floor(at)
        return second if second < self.seconds else None

    def enqueue(self, at: float, jobs: int) -> None:
        """``jobs`` enqueued at ``at`` seconds since the start."""
        if (s := self._second(at)) is not None:
            self.enqueued[s] += jobs

    def add(self, started: float | None, completed: float | None, pickup_ms: float | None) -> None:
        """One finished job: its start and completion (seconds since the start), its
        pickup latency (ms)."""
        if (s := self._second(started)) is not None and pickup_ms is not None:
            self.pickups_ms[s].append(pickup_ms)
        if (s := self._second(completed)) is not None:
            self.completed[s] += 1


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The ``pct`` percentile (0-100, linear between closest ranks); ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """The figures of ``[start, start + length)`` seconds: jobs/s and pickup in ms."""

    start: int
    length: int
    enqueued_per_s: float
    completed_per_s: float
    pickups: int
    pickup_p50_ms: float | None
    pickup_p99_ms: float | None
    pickup_max_ms: float | None


def window_figures(series: Series, start: int, length: int) -> WindowFigures:
    """The figures of the ``length`` seconds from ``start`` (cut at the series' end)."""
    end = min(start + length, series.seconds)
    span = max(end - start, 1)
    latencies = [ms for second in series.pickups_ms[start:end] for ms in second]
    return WindowFigures(
        start=start,
        length=end - start,
        enqueued_per_s=sum(series.enqueued[start:end]) / span,
        completed_per_s=sum(series.completed[start:end]) / span,
        pickups=len(latencies),
        pickup_p50_ms=percentile(latencies, 50),
        pickup_p99_ms=percentile(latencies, 99),
        pickup_max_ms=max(latencies, default=None),
    )


def baseline_span(hold_start_s: int, window_s: int) -> tuple[int, int]:
    """The seconds ``[from, to)`` of the baseline: windows 2-5, ended by the hold.

    When not one whole window lies between the first window and the hold, the
    baseline is all of ``[0, hold_start_s)`` instead (a short run has no warm-up to
    spare).
    """
    begin, end = window_s, min(5 * window_s, hold_start_s)
    if end - begin < window_s:
        return 0, hold_start_s
    return begin, begin + (end - begin) // window_s * window_s


@dataclass(frozen=True, slots=True)
class Baseline:
    """The median one-window throughput (jobs/s) and pickup p99 (ms) over ``span``."""

    span: tuple[int, int]
    windows: int
    completed_per_s: float
    pickup_p99_ms: float | None

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return asdict(self)


def baseline(series: Series, span: tuple[int, int], window_s: int) -> Baseline:
    """The median of the figures of the whole windows of ``span`` (one if it is shorter)."""
    begin, end = span
    starts = list(range(begin, max(end - window_s, begin) + 1, window_s))
    figures = [window_figures(series, s, min(window_s, end - s)) for s in starts]
    p99s = [f.pickup_p99_ms for f in figures if f.pickup_p99_ms is not None]
    return Baseline(
        span=span,
        windows=len(figures),
        completed_per_s=statistics.median(f.completed_per_s for f in figures),
        pickup_p99_ms=statistics.median(p99s) if p99s else None,
    )


@dataclass(frozen=True, slots=True)
class Recovery:
    """Seconds from the release to the first whole window back near the baseline.

    ``None``: not within the series (not recovered). ``throughput_s``: completions/s
    within the tolerance; ``p99_s``: pickup p99 at most the tolerance above; ``both_s``:
    one window where both hold.
    """

    throughput_s: int | None
    p99_s: int | None
    both_s: int | None

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return asdict(self)


def recovery_after(
    series: Series,
    release_s: float,
    base: Baseline,
    window_s: int,
    tolerance: float = TOLERANCE,
) -> Recovery:
    """How long after ``release_s`` a whole window is first back near ``base``."""
    first = math.ceil(release_s)
    throughput: int | None = None
    p99: int | None = None
    both: int | None = None
    low, high = (1 - tolerance) * base.completed_per_s, (1 + tolerance) * base.completed_per_s
    ceiling = None if base.pickup_p99_ms is None else (1 + tolerance) * base.pickup_p99_ms
    for start in range(first, series.seconds - window_s + 1):
        figures = window_figures(series, start, window_s)
        rate_ok = low <= figures.completed_per_s <= high
        p99_ok = (
            ceiling is not None
            and figures.pickup_p99_ms is not None
            and figures.pickup_p99_ms <= ceiling
        )
        after = start - first
        if rate_ok and throughput is None:
            throughput = after
        if p99_ok and p99 is None:
            p99 = after
        if rate_ok and p99_ok:
            both = after
            break
    return Recovery(throughput_s=throughput, p99_s=p99, both_s=both)


@dataclass(frozen=True, slots=True)
class DeadTuples:
    """One table's ``n_dead_tup`` against twice its baseline.

    ``baseline``: the median of the samples within the baseline span; ``peak`` and
    ``peak_at_s``: the largest sample and when (seconds since the start); ``end``: the
    last sample; ``back_s``: seconds from the release to the first sample at most
    ``DEAD_FACTOR`` x baseline, ``None`` if none.
    """

    baseline: float
    peak: int
    peak_at_s: float
    end: int
    back_s: float | None

    @property
    def limit(self) -> float:
        """``DEAD_FACTOR`` x the baseline (at least 1, so that a zero baseline can be met)."""
        return max(DEAD_FACTOR * self.baseline, 1.0)

    @property
    def end_ok(self) -> bool:
        """Whether the end value is within the limit."""
        return self.end <= self.limit

    def to_json(self) -> dict[str, Any]:
        """As a JSON object, with the limit and whether the end is within it."""
        return {**asdict(self), "limit": self.limit, "end_ok": self.end_ok}


def dead_tuples(
    samples: Sequence[tuple[float, int]], span: tuple[int, int], release_s: float
) -> DeadTuples:
    """The summary of ``(seconds since the start, n_dead_tup)`` samples, in time order.

    Raises:
        ValueError: there are no samples.
    """
    if not samples:
        raise ValueError("a dead-tuple summary needs at least one sample")
    inside = [n for at, n in samples if span[0] <= at < span[1]]
    base = float(statistics.median(inside)) if inside else float(samples[0][1])
    peak_at, peak = max(samples, key=lambda sample: sample[1])
    limit = max(DEAD_FACTOR * base, 1.0)
    back = next((at - release_s for at, n in samples if at >= release_s and n <= limit), None)
    return DeadTuples(baseline=base, peak=peak, peak_at_s=peak_at, end=samples[-1][1], back_s=back)
