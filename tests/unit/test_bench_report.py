"""The benchmark report's pure parts (bench/report.py, bench/jobs_report.py)."""

from __future__ import annotations

from bench.jobs_report import median
from bench.report import Row


def test_a_max_ratio_target_is_met_at_or_below_the_ratio() -> None:
    assert Row("cpu", 130.0, "us", "raw", 100.0, max_ratio=1.3).met is True
    assert Row("cpu", 131.0, "us", "raw", 100.0, max_ratio=1.3).met is False
    assert Row("cpu", 130.0, "us", "raw", 100.0, max_ratio=1.3).target == "<= 1.3x ref"


def test_a_ceiling_is_met_at_the_ceiling() -> None:
    assert Row("p99", 3.0, "ms", max_value=3.0).met is True
    assert Row("p99", 3.01, "ms", max_value=3.0).met is False


def test_a_row_without_a_figure_has_no_ratio_and_meets_nothing() -> None:
    row = Row("cpu", None, "us", "raw", 100.0, min_ratio=0.5)
    assert row.ratio is None
    assert row.met is None


def test_median_leaves_out_missing_values() -> None:
    assert median([3.0, None, 1.0, 2.0]) == 2.0
    assert median([None]) is None
