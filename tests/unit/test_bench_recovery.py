"""The bloat benchmark's pure figures (bench/recovery.py) over synthetic series."""

from __future__ import annotations

import pytest
from bench.recovery import (
    Series,
    baseline,
    baseline_span,
    dead_tuples,
    percentile,
    recovery_after,
    window_figures,
)

NORMAL_MS = [i / 10 for i in range(1, 101)]  # 0.1 .. 10.0 ms: p99 about 9.9 ms


def _second(series: Series, second: int, jobs: int, pickup_ms: float | None) -> None:
    """``jobs`` jobs created, started and completed in ``second``."""
    for n in range(jobs):
        latency = NORMAL_MS[n % len(NORMAL_MS)] if pickup_ms is None else pickup_ms
        series.enqueue(second + 0.1, 1)
        series.add(second + 0.2, second + 0.3, latency)


def _held_series(after_release: int) -> Series:
    """600 s at 100 jobs/s; a hold at 300-360 s (30 jobs/s, 500 ms pickups); then
    30 s of catch-up (170 jobs/s, 50 ms pickups) and ``after_release`` jobs/s after."""
    series = Series(600)
    for second in range(600):
        if 300 <= second < 360:
            _second(series, second, 30, 500.0)
        elif 360 <= second < 390:
            _second(series, second, 170, 50.0)
        else:
            _second(series, second, 100 if second < 300 else after_release, None)
    return series


def test_percentile_interpolates_between_ranks_and_is_none_when_empty() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0], 100) == 2.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 99) is None


def test_series_drops_events_outside_its_seconds() -> None:
    series = Series(10)
    series.enqueue(-0.5, 4)
    series.enqueue(3.2, 2)
    series.enqueue(10.0, 8)
    series.add(2.5, 10.0, 1.0)
    series.add(None, 9.9, None)
    assert series.enqueued[3] == 2
    assert sum(series.enqueued) == 2
    assert series.pickups_ms[2] == [1.0]
    assert series.completed[9] == 1
    assert sum(series.completed) == 1


def test_window_figures_count_per_second_and_take_pickup_percentiles() -> None:
    series = Series(60)
    for second in range(60):
        _second(series, second, 100, None)
    figures = window_figures(series, 0, 60)
    assert figures.completed_per_s == 100
    assert figures.enqueued_per_s == 100
    assert figures.pickups == 6000
    assert figures.pickup_p99_ms == pytest.approx(9.9, abs=0.05)
    assert figures.pickup_max_ms == 10.0


@pytest.mark.parametrize(
    ("hold_start", "window", "span"),
    [
        (360, 60, (60, 300)),  # windows 2-5 of a 15-minute run
        (200, 60, (60, 180)),  # cut short by the hold, to whole windows
        (60, 20, (20, 60)),  # the short mode
        (60, 60, (0, 60)),  # no whole window after the first: all before the hold
    ],
)
def test_baseline_span_is_windows_2_to_5_before_the_hold(
    hold_start: int, window: int, span: tuple[int, int]
) -> None:
    assert baseline_span(hold_start, window) == span


def test_baseline_is_the_median_of_the_window_figures() -> None:
    series = Series(300)
    for second in range(300):
        _second(series, second, [90, 100, 100, 300, 100][second // 60], None)
    base = baseline(series, (60, 300), 60)
    assert base.windows == 4
    assert base.completed_per_s == 100  # median of 100, 100, 300, 100
    assert base.pickup_p99_ms == pytest.approx(9.9, abs=0.05)


def test_recovery_counts_from_the_release_to_the_first_whole_window_near_the_baseline() -> None:
    series = _held_series(after_release=100)
    base = baseline(series, baseline_span(300, 60), 60)
    recovery = recovery_after(series, 360.0, base, 60)
    # Throughput: (170 x (390 - s) + 100 x (s - 330)) / 60 <= 110 from s = 382 on.
    assert recovery.throughput_s == 22
    # p99: a window starting before 390 s still holds more than 1 % of 50 ms pickups.
    assert recovery.p99_s == 30
    assert recovery.both_s == 30


def test_recovery_is_none_when_the_figures_stay_off() -> None:
    series = Series(600)
    for second in range(600):
        _second(series, second, 100 if second < 300 else 50, None)  # half from 300 s on
    base = baseline(series, baseline_span(300, 60), 60)
    recovery = recovery_after(series, 360.0, base, 60)
    assert recovery.throughput_s is None
    assert recovery.p99_s == 0
    assert recovery.both_s is None


def test_dead_tuples_against_twice_the_baseline() -> None:
    samples = [(float(t), 1_000) for t in range(0, 300, 5)]
    samples += [(float(t), 1_000 + 800 * (t - 300)) for t in range(300, 400, 5)]
    samples += [(400.0, 90_000), (405.0, 1_900), (410.0, 2_500)]
    summary = dead_tuples(samples, (60, 300), 360.0)
    assert summary.baseline == 1_000
    assert summary.limit == 2_000
    assert (summary.peak, summary.peak_at_s) == (90_000, 400.0)
    assert summary.back_s == 45.0
    assert summary.end == 2_500
    assert not summary.end_ok
    with pytest.raises(ValueError, match="at least one sample"):
        dead_tuples([], (0, 60), 0.0)
