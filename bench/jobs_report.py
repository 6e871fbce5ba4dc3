"""The report of ``python -m bench.jobs``: medians of the repeats, the table, the details.

Every figure of :mod:`bench.jobs` is a list of samples, one per repeat, each with the
raw figures measured right before it (``raw``: script -> :class:`bench.raw.
PgbenchResult`) and what the load monitor saw meanwhile (``foreign``). A row of the
table is the median of the samples beside the median of their raw figures; ``busy`` is
the mean share of monitor samples with foreign activity and ``load`` the median of the
mean one-minute load averages.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cyclone
from bench.cpu import ServerCpu
from bench.raw import PgbenchResult
from bench.report import Row, latency_summary, profile_summary, render_table

if TYPE_CHECKING:
    from bench.jobs import Settings

__all__ = ["build_rows", "median", "print_report", "to_json"]

Sample = dict[str, Any]
_TEN, _ONE = "claim_complete10.sql", "claim_complete1.sql"


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are not ``None`` (``None`` if there are none)."""
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None


def _busy(samples: Sequence[Sample]) -> str:
    shares = [s.get("foreign", {}).get("busy_share") for s in samples]
    found = [x for x in shares if x is not None]
    return f"{statistics.fmean(found):.0%}" if found else ""


def _load(samples: Sequence[Sample]) -> str:
    load = median(s.get("foreign", {}).get("load_avg") for s in samples)
    return "" if load is None else f"{load:.2f}"


def _seen(samples: Sequence[Sample]) -> dict[str, Any]:
    return {"busy": _busy(samples), "load": _load(samples)}


def _raw(
    samples: Sequence[Sample],
    script: str,
    value: Callable[[PgbenchResult], float | None] = lambda r: r.jobs_per_s,
    suffix: str = "",
) -> dict[str, Any]:
    """The median raw figure of ``script`` beside the samples, as ``Row`` arguments."""
    found: list[PgbenchResult] = [s["raw"][script] for s in samples if script in s.get("raw", {})]
    if not found:
        return {}
    return {"raw_label": found[0].label + suffix, "raw_value": median(value(r) for r in found)}


def _grouped(samples: Iterable[Sample], key: Callable[[Sample], Any]) -> dict[Any, list[Sample]]:
    groups: dict[Any, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(key(sample), []).append(sample)
    return groups


def _rate(samples: Sequence[Sample]) -> float | None:
    return median(s["jobs_per_s"] for s in samples)


# -- rows ------------------------------------------------------------------------------


def enqueue_rows(samples: Sequence[Sample], prefix: str = "") -> list[Row]:
    """Enqueue one per transaction vs ``insert1.sql``, batched vs ``insert100.sql``."""
    rows = []
    for name, group in _grouped(samples, lambda s: s["name"]).items():
        producers, batch = group[0]["producers"], group[0]["batch"]
        if name.startswith("enqueue_many"):
            label = f"{prefix}enqueue_many of {batch:,}, 1 producer (rows/s)"
            rows.append(
                Row(
                    label,
                    _rate(group),
                    "jobs/s",
                    min_ratio=0.5,
                    **_raw(group, "insert100.sql"),
                    **_seen(group),
                )
            )
            continue
        plural = "s" * (producers > 1)
        rows.append(
            Row(
                f"{prefix}enqueue, 1 per tx, {producers} producer{plural}",
                _rate(group),
                "jobs/s",
                min_ratio=0.7,
                **_raw(group, "insert1.sql"),
                **_seen(group),
            )
        )
    return rows


def noop_rows(settings: Settings, samples: Sequence[Sample], prefix: str = "") -> list[Row]:
    """No-op jobs/s vs claim+complete, server and worker CPU per job, and each count of
    retained runs vs none."""
    rows: list[Row] = []
    groups = _grouped(samples, lambda s: (s["retained_runs"], s["processes"]))
    base = {p: _rate(g) for (n, p), g in groups.items() if n == 0}
    stale = ", stale stats" if settings.stale_stats else ""
    for (retained, processes), group in groups.items():
        rate = _rate(group)
        held = f", {retained:,} retained{stale}" if retained else stale
        rows += [
            Row(
                f"{prefix}no-op jobs, {processes} proc x {group[0]['config']}{held}",
                rate,
                "jobs/s",
                min_ratio=0.5,
                **_raw(group, _TEN),
                **_seen(group),
            ),
            Row("  same, vs batches of 1", rate, "jobs/s", **_raw(group, _ONE)),
            Row(
                "  server CPU per job",
                median(s["server_cpu_us_per_job"] for s in group),
                "us",
                **_raw(group, _TEN, lambda r: r.server_cpu_us_per_job, " server CPU"),
            ),
            Row(
                "  worker CPU per job (Python)",
                median(s["worker_cpu_us_per_job"] for s in group),
                "us",
            ),
        ]
        if retained and base.get(processes):
            rows.append(
                Row(
                    f"  {retained:,} retained vs none",
                    rate,
                    "jobs/s",
                    "same, 0 retained",
                    base[processes],
                    min_ratio=0.9,
                )
            )
    return rows


def _grid_cells(grid: dict[str, Any]) -> dict[tuple[str, int], list[Sample]]:
    return _grouped(grid["samples"], lambda s: (s["config"], s["processes"]))


def grid_rows(grid: dict[str, Any]) -> list[Row]:
    """Per process count: the best grid cell vs claim+complete in 10s, and the client's
    defaults vs the best cell."""
    rows: list[Row] = []
    cells = _grid_cells(grid)
    defaults = grid["client_defaults"]
    for processes in dict.fromkeys(p for _, p in cells):
        mine = {c: g for (c, p), g in cells.items() if p == processes}
        tried = {c: _rate(g) or 0.0 for c, g in mine.items() if not g[0]["defaults"]}
        if not tried:
            continue
        best = max(tried, key=lambda c: tried[c])
        everything = [s for g in mine.values() for s in g]
        rows.append(
            Row(
                f"no-op grid best, {processes} proc: {best}",
                tried[best],
                "jobs/s",
                min_ratio=0.5,
                **_raw(everything, _TEN),
                **_seen(mine[best]),
            )
        )
        for group in mine.values():
            if group[0]["defaults"]:
                rows.append(
                    Row(
                        f"no-op client defaults, {processes} proc ({defaults['slots']} slots x "
                        f"claim_batch {defaults['claim_batch'] or 'free slots'})",
                        _rate(group),
                        "jobs/s",
                        "best grid cell",
                        tried[best],
                        min_ratio=0.8,
                        **_seen(group),
                    )
                )
    return rows


def _summaries(latency: dict[str, Any]) -> dict[str, dict[str, float]]:
    found = {**latency["samples_ms"], "raw_wake": latency["raw_wake_ms"]}
    return {name: latency_summary(v) for name, v in found.items() if len(v) >= 2}


def latency_rows(latency: dict[str, Any], prefix: str = "") -> list[Row]:
    """Wake p50 vs the raw probe's (<= 1.3x), p99 <= 3 ms; the database's measure beside
    one ``insert1.sql`` commit."""
    s = _summaries(latency)
    seen: dict[str, Any] = {"busy": _busy([latency]), "load": _load([latency])}
    rows: list[Row] = []
    mine, raw = s.get("python_from_return"), s.get("raw_wake")
    if mine:
        for pct in ("p50", "p99"):
            reference: dict[str, Any] = (
                {"raw_label": f"raw insert+NOTIFY -> claim {pct}", "raw_value": raw[pct]}
                if raw
                else {}
            )
            target: dict[str, Any] = {"max_ratio": 1.3} if pct == "p50" else {"max_value": 3.0}
            rows.append(
                Row(
                    f"{prefix}wake {pct}, enqueue() return -> handler",
                    mine[pct],
                    "ms",
                    **reference,
                    **target,
                    **seen,
                )
            )
    commits = [r["insert1.sql"] for r in latency["raw"] if "insert1.sql" in r]
    commit: dict[str, Any] = (
        {"raw_label": "insert1.sql c=1 latency", "raw_value": median(r.latency_ms for r in commits)}
        if commits
        else {}
    )
    db = s.get("db")
    if db:
        for pct, ceiling in (("p50", 1.0), ("p99", 3.0)):
            rows.append(
                Row(
                    f"{prefix}wake {pct}, started_at - created_at",
                    db[pct],
                    "ms",
                    max_value=ceiling,
                    **commit,
                    **seen,
                )
            )
    call = s.get("python_from_call")
    if call:
        rows.append(Row("  p50, enqueue() call -> handler", call["p50"], "ms"))
    return rows


def build_rows(settings: Settings, measured: dict[str, Any]) -> list[Row]:
    """Each figure with the reference measured beside it, and its target."""
    rows: list[Row] = []
    for prefix, found in (("", measured), ("pooler: ", measured.get("pooler", {}))):
        rows += enqueue_rows(found.get("enqueue", []), prefix)
        rows += noop_rows(settings, found.get("workers", []), prefix)
        if prefix == "" and "grid" in measured:
            rows += grid_rows(measured["grid"])
        if found.get("latency"):
            rows += latency_rows(found["latency"], prefix)
    return rows


# -- the details -----------------------------------------------------------------------


def to_json(value: Any) -> Any:
    """``json.dumps`` default for the bench's own types."""
    if isinstance(value, PgbenchResult | ServerCpu):
        return value.to_json()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _spread(values: Sequence[float]) -> str:
    if len(values) < 2:
        return ""
    return f" (repeats {min(values):,.0f} to {max(values):,.0f})"


def _drain_details(samples: Sequence[Sample], what: str) -> list[str]:
    lines = []
    for (retained, processes), group in _grouped(
        samples, lambda s: (s["retained_runs"], s["processes"])
    ).items():
        rates = [s["jobs_per_s"] for s in group]
        cores = median(s["machine_busy_cores"] for s in group)
        lines.append(
            f"{what}no-op, {processes} proc, {retained:,} retained: median "
            f"{median(rates) or 0:,.0f} jobs/s{_spread(rates)}; database span "
            f"{median(s['db_span_jobs_per_s'] for s in group) or 0:,.0f} jobs/s; backlog "
            f"written in {median(s['backlog_s'] for s in group) or 0:.2f} s; machine busy "
            f"{'?' if cores is None else f'{cores:.2f}'} of {os.cpu_count()} cores"
        )
        if retained:
            fill = median(s["retained"]["fill_s"] for s in group) or 0.0
            per_s = retained / fill if fill else 0.0
            million = 1e6 / per_s if per_s else 0.0
            lines.append(
                f"  {retained:,} retained runs written in {fill:.2f} s ({per_s:,.0f} runs/s; "
                f"1,000,000 at that rate: {million:.0f} s, target < 60 s), ANALYZE "
                f"{median(s['retained']['analyze_s'] for s in group) or 0:.2f} s"
            )
    return lines


def _grid_table(grid: dict[str, Any]) -> list[str]:
    cells = _grid_cells(grid)
    counts = list(dict.fromkeys(p for _, p in cells))
    configs = list(dict.fromkeys(c for c, _ in cells))
    width = max(len(c) for c in configs)
    lines = ["  " + "cell".ljust(width) + "".join(f"  {f'{p} proc':>12}" for p in counts)]
    for config in configs:
        values = [_rate(cells.get((config, p), [])) for p in counts]
        lines.append(
            "  "
            + config.ljust(width)
            + "".join(f"  {'-' if v is None else f'{v:,.0f}':>12}" for v in values)
        )
    return lines


def print_report(
    settings: Settings,
    server: dict[str, Any],
    rows: Sequence[Row],
    raw: Sequence[PgbenchResult],
    measured: dict[str, Any],
) -> None:
    """The table and the details below it, on stdout."""
    print()
    print(
        f"Cyclone {cyclone.__version__} vs raw PostgreSQL {server.get('server_version')} "
        f"on {os.cpu_count()} cores (synchronous_commit={server.get('synchronous_commit')}, "
        f"fsync={server.get('fsync')}); no-op: {settings.jobs:,} jobs, "
        f"claim_batch {settings.claim_batch or 'free slots'}, {settings.slots} slots/process; "
        "each figure "
        f"the median of {settings.repeats} interleaved repeat(s)"
    )
    print()
    print(render_table(rows))
    print()
    print(
        "ratio = Cyclone / reference. The reference is the raw limit measured right before "
        "(pgbench, bench/raw-postgres),\nor another Cyclone figure where named. Latencies: the "
        "raw wake probe (bench/wake.py), or pgbench's mean latency\nof a single-row INSERT "
        "(one commit). server CPU = CPU time of the backends (Cyclone's application_name\n"
        "cyclone*, pgbench's pgbench) per job. busy = share of 0.5 s samples in which "
        "another database on the server\nhad an active query; load = mean 1-minute load "
        "average meanwhile."
    )
    if raw:
        print()
        print(f"raw limit runs (pgbench -n -M prepared, {settings.pgbench_seconds} s each):")
        for r in raw:
            cores = "?" if r.busy_cores is None else f"{r.busy_cores:.2f}"
            cpu = r.server_cpu_us_per_job
            print(
                f"  {r.label:<26} {r.tps:>9,.0f} TPS  {r.jobs_per_s:>9,.0f} jobs/s  "
                f"latency {r.latency_ms:.3f} ms  server CPU "
                f"{'?' if cpu is None else f'{cpu:.0f}'} us/job  machine busy {cores} cores"
            )
    for what, found in (("", measured), ("pooler: ", measured.get("pooler", {}))):
        details = _drain_details(found.get("workers", []), what)
        if details:
            print()
            print("\n".join(details))
        latency = found.get("latency")
        if latency:
            print()
            for name, s in _summaries(latency).items():
                print(
                    f"{what}latency {name:<18} n={s['count']}  p50 {s['p50']:.3f}  "
                    f"p90 {s['p90']:.3f}  p99 {s['p99']:.3f}  mean {s['mean']:.3f}  "
                    f"max {s['max']:.3f} ms"
                )
    if "grid" in measured:
        print()
        print("no-op grid, median jobs/s per cell:")
        print("\n".join(_grid_table(measured["grid"])))
    profiles = [Path(p) for s in measured.get("workers", []) for p in s["profiles"]]
    if profiles:
        print()
        print("py-spy, every no-op worker process:")
        print(profile_summary(profiles))
