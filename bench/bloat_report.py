"""The bloat benchmark's report: per-window figures and the printed summary.

:func:`compute` turns what :class:`bench.steady.SteadyLoad` recorded into one row per
window (the series' figures beside the samples' largest ``n_dead_tup``, table and
claim-index sizes, autovacuums, oldest horizon holder, load average), the baseline, the
recovery after the release and the dead-tuple summaries of :mod:`bench.recovery`;
:func:`print_report` prints them beside the raw limit measured in the same run.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cyclone
from bench.monitor import busy_cores
from bench.raw import PgbenchResult
from bench.recovery import (
    Baseline,
    DeadTuples,
    Recovery,
    baseline,
    baseline_span,
    dead_tuples,
    recovery_after,
    window_figures,
)
from bench.report import Row, render_table
from bench.steady import TABLES, Sample, SteadyResult

if TYPE_CHECKING:
    from bench.bloat import Settings

__all__ = ["Figures", "compute", "print_report", "window_rows"]

# -- the figures -----------------------------------------------------------------------


def _vacuums(stats: dict[str, Any]) -> int:
    return int(stats["autovacuum_count"]) + int(stats["vacuum_count"])


def _overlap(held: tuple[float | None, float | None], begin: float, end: float) -> float:
    """Seconds of ``[begin, end)`` within the hold (``None``: not begun, not released)."""
    if held[0] is None:
        return 0.0
    return min(end, end if held[1] is None else held[1]) - max(begin, held[0])


def _in(samples: Sequence[Sample], begin: float, end: float) -> list[Sample]:
    return [s for s in samples if begin <= s.at_s < end]


def window_rows(settings: Settings, steady: SteadyResult) -> list[dict[str, Any]]:
    """One row of figures per window: the series' and the samples' within it."""
    rows = []
    held = (steady.held_at_s, steady.released_at_s)
    for begin in range(0, settings.duration_s, settings.window_s):
        end = min(begin + settings.window_s, settings.duration_s)
        figures = window_figures(steady.series, begin, end - begin)
        inside = _in(steady.samples, begin, end) or _in(steady.samples, begin, end + 1)
        row: dict[str, Any] = {
            "begin_s": begin,
            "end_s": end,
            "enqueued_per_s": figures.enqueued_per_s,
            "completed_per_s": figures.completed_per_s,
            "pickup_p50_ms": figures.pickup_p50_ms,
            "pickup_p99_ms": figures.pickup_p99_ms,
            "pickup_max_ms": figures.pickup_max_ms,
            "held": _overlap(held, begin, end) >= 1,
        }
        for table in TABLES:
            stats = [s.tables[table] for s in inside if table in s.tables]
            row[f"{table}_dead_max"] = max((t["n_dead_tup"] for t in stats), default=None)
            row[f"{table}_bytes"] = stats[-1]["bytes"] if stats else None
            row[f"{table}_vacuums"] = _vacuums(stats[-1]) - _vacuums(stats[0]) if stats else None
        row["xmin_age_max"] = max((s.xmin_age or 0 for s in inside), default=None)
        row["oldest_xact_max_s"] = max((s.oldest_xact_s or 0.0 for s in inside), default=None)
        row["claim_index_bytes"] = inside[-1].claim_index_bytes if inside else None
        row["oldest_available_max_s"] = max(
            (s.oldest_available_s or 0.0 for s in inside), default=None
        )
        row["loadavg1"] = statistics.fmean(s.loadavg[0] for s in inside) if inside else None
        row["busy_cores"] = busy_cores(inside[0].cpu, inside[-1].cpu) if inside else None
        shares = [s.foreign_share for s in inside if s.foreign_share is not None]
        row["foreign_share"] = statistics.fmean(shares) if shares else None
        rows.append(row)
    return rows


@dataclass(frozen=True, slots=True)
class Figures:
    """The computed figures of a run."""

    windows: list[dict[str, Any]]
    baseline: Baseline
    recovery: Recovery | None
    dead: dict[str, DeadTuples]

    def to_json(self) -> dict[str, Any]:
        """As a JSON object."""
        return {
            "windows": self.windows,
            "baseline": self.baseline.to_json(),
            "recovery": None if self.recovery is None else self.recovery.to_json(),
            "dead_tuples": {name: d.to_json() for name, d in self.dead.items()},
        }


def compute(settings: Settings, steady: SteadyResult) -> Figures:
    """Windows, baseline, recovery and dead tuples of the steady phase."""
    held = steady.held_at_s if steady.held_at_s is not None else settings.hold_start_s
    span = baseline_span(int(held), settings.window_s)
    base = baseline(steady.series, span, settings.window_s)
    released = steady.released_at_s
    recovery = (
        None
        if released is None
        else recovery_after(steady.series, released, base, settings.window_s)
    )
    dead = {
        table: dead_tuples(
            [(s.at_s, s.tables[table]["n_dead_tup"]) for s in steady.samples if table in s.tables],
            span,
            released if released is not None else float(settings.duration_s),
        )
        for table in TABLES
        if any(table in s.tables for s in steady.samples)
    }
    return Figures(window_rows(settings, steady), base, recovery, dead)


# -- the report ------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _after(seconds: float | None) -> str:
    return "not recovered" if seconds is None else f"{seconds:.0f} s after the release"


def _cell(key: str, fmt: str = ",.0f", scale: float = 1.0, suffix: str = "") -> Any:
    def show(w: dict[str, Any]) -> str:
        value = w[key]
        if value is None:
            return "-"
        return format(value / scale if scale != 1 else value, fmt) + suffix

    return show


_COLUMNS: list[tuple[str, int, Any]] = [
    ("window s", 9, lambda w: f"{w['begin_s']}-{w['end_s']}"),
    ("enq/s", 6, _cell("enqueued_per_s")),
    ("done/s", 6, _cell("completed_per_s")),
    ("p50 ms", 7, _cell("pickup_p50_ms", ".1f")),
    ("p99 ms", 7, _cell("pickup_p99_ms", ".1f")),
    ("max ms", 7, _cell("pickup_max_ms", ".1f")),
    ("steps dead", 10, _cell("cyclone_steps_dead_max")),
    ("runs dead", 9, _cell("cyclone_runs_dead_max")),
    ("steps MB", 8, _cell("cyclone_steps_bytes", ".1f", 2**20)),
    ("claim idx", 9, _cell("claim_index_bytes", ",.0f", 2**10, " kB")),
    ("vac", 3, _cell("cyclone_steps_vacuums", "d")),
    ("xmin age", 8, _cell("xmin_age_max")),
    ("xact s", 6, _cell("oldest_xact_max_s", ".0f")),
    ("oldest", 6, _cell("oldest_available_max_s", ".1f")),
    ("load", 5, _cell("loadavg1", ".2f")),
    ("busy", 4, _cell("busy_cores", ".2f")),
    ("frgn", 4, _cell("foreign_share", ".0%")),
]


def _raw_rows(measured: dict[str, Any], figures: Figures) -> list[Row]:
    before: dict[str, PgbenchResult] = measured["raw_before"]
    after: dict[str, PgbenchResult] = measured["raw_after"]
    ten = "claim_complete10.sql"
    rows = []
    peak = measured["peak"]
    busy = "" if peak is None else f"{peak['foreign']['busy_share'] or 0:.0%}"
    if peak is not None and ten in before:
        label = f"peak no-op jobs/s ({peak['jobs']:,}-run drain)"
        rows.append(
            Row(
                label,
                peak["jobs_per_s"],
                "jobs/s",
                before[ten].label,
                before[ten].jobs_per_s,
                busy=busy,
            )
        )
    for name, raw in (("before", before), ("after", after)):
        if ten in raw:
            rows.append(
                Row(
                    f"steady baseline vs raw {name}",
                    figures.baseline.completed_per_s,
                    "jobs/s",
                    raw[ten].label,
                    raw[ten].jobs_per_s,
                )
            )
    return rows


def print_report(
    settings: Settings, server: dict[str, Any], measured: dict[str, Any], figures: Figures
) -> None:
    """The report on stdout."""
    steady: SteadyResult = measured["steady"]
    print()
    print(
        f"Cyclone {cyclone.__version__}, bloat and held horizons, on PostgreSQL "
        f"{server.get('server_version')} and {os.cpu_count()} cores: {settings.duration_s} s "
        f"at {measured['rate']:,.0f} jobs/s ({settings.processes} worker processes x "
        f"{settings.slots} slots, claim_batch {settings.claim_batch or 'free slots'}), retention "
        f"{settings.retention_s:g} s, purge every {settings.purge_interval:g} s"
    )
    if steady.held_at_s is not None and steady.released_at_s is not None:
        print(
            f"horizon held from {steady.held_at_s:.1f} s to {steady.released_at_s:.1f} s "
            f"(REPEATABLE READ snapshot and xid {steady.holder_xid}, same database)"
        )
    vacuum = measured["vacuum"]
    line = (
        f"autovacuum {vacuum['autovacuum']} (naptime {vacuum['autovacuum_naptime']}), "
        f"idle_in_transaction_session_timeout {vacuum['idle_in_transaction_session_timeout']}"
    )
    if vacuum["bench_vacuum_interval"]:
        line += (
            f"; the bench ran VACUUM cyclone_steps, cyclone_runs every "
            f"{vacuum['bench_vacuum_interval']:g} s ({len(steady.vacuums)} times, longest "
            f"{max((took for _, took in steady.vacuums), default=0):.1f} s)"
        )
    print(line)
    print()
    print(render_table(_raw_rows(measured, figures)))
    print()
    print("  ".join(f"{title:>{width}}" for title, width, _ in _COLUMNS))
    for w in figures.windows:
        cells = [f"{show(w):>{width}}" for _, width, show in _COLUMNS]
        print("  ".join(cells) + (" H" if w["held"] else ""))
    print(
        "H = the horizon was held in the window; dead = largest n_dead_tup sampled; "
        "vac = vacuums of cyclone_steps (auto or not);\nxmin age = largest age(backend_xmin) or "
        "age(backend_xid) of other sessions (xids); xact s = age of the oldest transaction "
        "holding either;\noldest = cyclone_v_queues oldest available age (s);\n"
        "load = 1-minute load average; busy = cores the machine kept busy; frgn = share "
        "of samples with another database active."
    )
    base = figures.baseline
    print()
    print(
        f"baseline (median of {base.windows} window(s), {base.span[0]}-{base.span[1]} s): "
        f"{base.completed_per_s:,.0f} jobs/s, pickup p99 {_ms(base.pickup_p99_ms)} ms"
    )
    if base.completed_per_s < 0.9 * measured["rate"]:
        print(
            f"WARNING: before the hold the workers completed {base.completed_per_s:,.0f} of "
            f"the {measured['rate']:,.0f} jobs/s offered: a backlog grew without any hold "
            "(a busy machine?); lower --load or --rate"
        )
    if figures.recovery is not None:
        rec = figures.recovery
        print(
            f"back for a whole {settings.window_s} s window: completions/s within +-10 %: "
            f"{_after(rec.throughput_s)}; pickup p99 at most +10 %: {_after(rec.p99_s)}; "
            f"both: {_after(rec.both_s)}"
        )
    for table, d in figures.dead.items():
        print(
            f"{table} n_dead_tup: baseline {d.baseline:,.0f}, 2x = {d.limit:,.0f}; peak "
            f"{d.peak:,} at {d.peak_at_s:.0f} s; end {d.end:,} "
            f"({'within' if d.end_ok else 'OVER'} 2x); under 2x again: {_after(d.back_s)}"
        )
    first, last = steady.samples[0].loadavg, steady.samples[-1].loadavg
    print(
        f"load average (1, 5, 15 min): {first[0]:.2f} {first[1]:.2f} {first[2]:.2f} at the "
        f"start, {last[0]:.2f} {last[1]:.2f} {last[2]:.2f} at the end"
    )
    print(
        f"jobs: {steady.enqueued:,} enqueued, {steady.collected:,} finished and read "
        f"({steady.not_completed} not completed), {steady.backlog_at_end:,} available at the "
        f"end; worker CPU {sum(steady.worker_cpu_s):.0f} s"
    )
    if steady.errors:
        print(
            f"WARNING: the server dropped {len(steady.errors)} connection(s) of the driver "
            f"(each opened again; the figures around them are suspect): {steady.errors[0]}"
        )
