"""Reporting: results files, latency percentiles, tables, and profile summaries.

A :class:`Row` is one Cyclone figure with the reference it is compared with (the raw
limit measured in the same run, or another Cyclone figure: the best grid cell, the
drain with no retained runs) and its target: a least ratio of the reference
(throughput), a greatest ratio (CPU, latency against the raw probe) or a ceiling
(latency). The table prints the ratio Cyclone / reference and whether the target is
met, with the foreign activity and the load average seen meanwhile. :func:`profile_summary`
reads py-spy's collapsed stacks (``--format raw``) and names where the samples fall.
"""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import cyclone

__all__ = [
    "Row",
    "git_commit",
    "latency_summary",
    "profile_summary",
    "provenance",
    "render_table",
    "text_table",
    "write_results",
]


def git_commit() -> str | None:
    """The short commit of the checkout the benchmarks run from (``None`` outside git)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def provenance(
    started: datetime, server: Mapping[str, Any], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """The head of every results file: when, on what machine and server, which Cyclone
    (version and commit), with which settings."""
    return {
        "started_at": started.isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "server": dict(server),
        "cyclone": {"version": cyclone.__version__, "commit": git_commit()},
        "settings": dict(settings),
    }


def write_results(
    results_dir: Path,
    name: str,
    started: Any,
    results: dict[str, Any],
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """Write a run's figures as ``<name>-<UTC time>.json`` in ``results_dir``; say where."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(results, indent=2, default=default) + "\n")
    print()
    print(f"figures written to {path}")
    return path


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """Count, p50, p90, p99, mean and max of latencies in milliseconds."""
    if len(samples_ms) < 2:
        raise ValueError("a latency summary needs at least two samples")
    cuts = statistics.quantiles(samples_ms, n=100, method="inclusive")
    return {
        "count": len(samples_ms),
        "p50": cuts[49],
        "p90": cuts[89],
        "p99": cuts[98],
        "mean": statistics.fmean(samples_ms),
        "max": max(samples_ms),
    }


@dataclass(frozen=True, slots=True)
class Row:
    """One figure of the report.

    ``min_ratio``: the target is ``value >= min_ratio * raw``. ``max_ratio``: the target
    is ``value <= max_ratio * raw``. ``max_value``: the target is ``value <= max_value``
    (a latency). None of them: an informational row. ``busy``: how much foreign
    database activity was seen while the figure was measured; ``load``: the load
    average meanwhile.
    """

    figure: str
    value: float | None
    unit: str
    raw_label: str = ""
    raw_value: float | None = None
    min_ratio: float | None = None
    max_value: float | None = None
    busy: str = ""
    max_ratio: float | None = None
    load: str = ""

    @property
    def ratio(self) -> float | None:
        """Cyclone / reference, when there are both."""
        if self.value is None or self.raw_value is None or self.raw_value <= 0:
            return None
        return self.value / self.raw_value

    @property
    def target(self) -> str:
        """The target in words."""
        if self.min_ratio is not None:
            return f">= {self.min_ratio:.0%} of ref"
        if self.max_ratio is not None:
            return f"<= {self.max_ratio:g}x ref"
        if self.max_value is not None:
            return f"<= {self.max_value:g} {self.unit}"
        return ""

    @property
    def met(self) -> bool | None:
        """Whether the target is met; ``None`` without a target or a figure."""
        ratio = self.ratio
        if self.min_ratio is not None and ratio is not None:
            return ratio >= self.min_ratio
        if self.max_ratio is not None and ratio is not None:
            return ratio <= self.max_ratio
        if self.max_value is not None and self.value is not None:
            return self.value <= self.max_value
        return None

    def to_json(self) -> dict[str, Any]:
        """The row as a JSON object."""
        return {
            "figure": self.figure,
            "value": None if self.value is None else round(self.value, 4),
            "unit": self.unit,
            "raw": self.raw_label or None,
            "raw_value": None if self.raw_value is None else round(self.raw_value, 1),
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "target": self.target or None,
            "met": self.met,
            "busy": self.busy or None,
            "load": self.load or None,
        }


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    if unit == "ms":
        return f"{value:.3f} ms"
    return f"{value:,.0f} {unit}"


def render_table(rows: Iterable[Row]) -> str:
    """The rows as an aligned text table."""
    header = (
        "figure",
        "Cyclone",
        "reference",
        "reference is",
        "ratio",
        "target",
        "met",
        "busy",
        "load",
    )
    lines: list[tuple[str, ...]] = [header]
    for row in rows:
        ratio = row.ratio
        met = row.met
        lines.append(
            (
                row.figure,
                _number(row.value, row.unit),
                "" if row.raw_value is None else _number(row.raw_value, row.unit),
                row.raw_label,
                "" if ratio is None else f"{ratio:.0%}",
                row.target,
                "" if met is None else ("ok" if met else "MISS"),
                row.busy,
                row.load,
            )
        )
    return text_table(lines, right={1, 2, 4, 7, 8})


def text_table(lines: Sequence[tuple[str, ...]], right: Iterable[int] = ()) -> str:
    """``lines`` (the header first) as columns two spaces apart, a rule under the
    header; the columns numbered in ``right`` (0-based) aligned to the right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    to_right = set(right)
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(widths[i]) if i in to_right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths).rstrip())
    return "\n".join(out)


_FRAME = re.compile(r"^(?P<name>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame(text: str) -> tuple[str, str]:
    """``func (pkg/module.py:123)`` -> (``func (module.py)``, ``pkg``)."""
    match = _FRAME.match(text)
    if match is None:
        return text, "?"
    path = Path(match["file"])
    package = path.parts[0] if len(path.parts) > 1 else path.stem
    return f"{match['name']} ({path.name})", package


def profile_summary(paths: Iterable[Path], top: int = 12, focus: str = "cyclone") -> str:
    """Where py-spy's samples (collapsed stacks, ``--format raw``) fall.

    Three views: self samples (the innermost frame) by package and by function, and
    total samples (every function once per stack) of the ``focus`` package's functions,
    which shows what each engine path costs including the libraries it calls.
    """
    by_package: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for path in paths:
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_frame(f) for f in stack.split(";")]
            samples += count
            leaf, package = frames[-1]
            own[leaf] += count
            by_package[package] += count
            for name in {name for name, pkg in frames if pkg == focus}:
                total[name] += count
    if not samples:
        return "no samples"

    def lines(counter: Counter[str]) -> list[str]:
        return [f"{100 * n / samples:7.1f}  {name}" for name, n in counter.most_common(top)]

    return "\n".join(
        [
            f"{samples} samples",
            "",
            "self %  package",
            *lines(by_package),
            "",
            "self %  function",
            *lines(own),
            "",
            f"total %  {focus} function (including what it calls)",
            *lines(total),
        ]
    )
