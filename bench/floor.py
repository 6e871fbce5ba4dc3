"""The schema floor: Cyclone's own insert statements run by pgbench, with no client.

``python -m bench.floor [--dsn ADMIN_DSN] [--seconds S] [--repeats N]`` measures, in one
throwaway database that holds both the raw ``jobs`` table (``schema.sql``) and Cyclone's
schema (``cyclone.migrate``), interleaved and repeated:

* ``insert1.sql`` and ``insert100.sql``, the raw limits ``bench.jobs`` compares
  ``enqueue`` and ``enqueue_many`` with;
* ``steps_enqueue`` (the statement of one ``enqueue``: a run row and its step row, the
  step's foreign key checked) and ``steps_enqueue_many`` with 100 and with 10,000
  inputs (the statement of ``enqueue_many``), with the parameters a default client
  sends, each written out as a pgbench script with literal values
  (``psycopg.ClientCursor.mogrify``) and run prepared, like the raw ones.

pgbench sends each statement from C with no Python, no pool and no wakeup around it, so
its rate is the most any client could reach with these statements on this schema: the
floor a Cyclone figure cannot pass. The report prints each floor as a share of the raw
limit (rows = jobs) beside the load average; the tables are emptied before every run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import psycopg

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, log, throwaway_database
from bench.raw import DEFAULT_SCRIPTS, PgbenchResult, RawLimit
from cyclone.producer import enqueue_many_stmt, enqueue_stmt

__all__ = ["FLOORS", "FLOOR_KIND", "floor_scripts", "main"]

FLOOR_KIND = "noop"
"""The kind the floor scripts enqueue (no handler: the client's defaults apply)."""
FLOORS = {
    "steps_enqueue": ("insert1.sql", 1),
    "steps_enqueue_many_100": ("insert100.sql", 100),
    "steps_enqueue_many_10000": ("insert100.sql", 10_000),
}
"""Each floor script: the raw script it is compared with, and the jobs per transaction."""


def floor_scripts(conn: psycopg.Connection[Any], into: Path) -> None:
    """Write the scripts of :data:`FLOORS` into ``into`` (``<name>.sql``): the statements
    and parameters a default ``SyncClient`` sends for ``enqueue(FLOOR_KIND, {})`` and
    ``enqueue_many(FLOOR_KIND, [{}] * n)``, the values bound as literals by psycopg."""
    config = cyclone.SyncClient(conn.info.dsn).config
    stmts = {"steps_enqueue": enqueue_stmt(config.request(FLOOR_KIND, {}))}
    for n in (100, 10_000):
        request = config.request(FLOOR_KIND, [{}] * n, many=True)
        stmts[f"steps_enqueue_many_{n}"] = enqueue_many_stmt(request)
    cur = psycopg.ClientCursor(conn)
    for name, stmt in stmts.items():
        text = cur.mogrify(stmt.sql, stmt.params)
        # pgbench reads one statement per line unless it ends with a semicolon
        (into / f"{name}.sql").write_text(" ".join(text.split()) + ";\n")


def _empty(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE jobs")
        conn.execute("TRUNCATE cyclone_runs, cyclone_steps CASCADE")
        conn.execute("CHECKPOINT")


def measure(admin_dsn: str, *, scripts: Path, seconds: int, repeats: int) -> dict[str, Any]:
    """Raw and floor jobs/s, ``repeats`` interleaved runs of each; the medians and the
    samples."""
    samples: dict[str, list[PgbenchResult]] = {}
    loads: list[float] = []
    with throwaway_database(admin_dsn, "bench_floor") as dsn, tempfile.TemporaryDirectory() as tmp:
        cyclone.migrate(dsn)
        raw = RawLimit(dsn, scripts, seconds=seconds)
        raw.create_schema(fill=False)
        floor = RawLimit(dsn, Path(tmp), seconds=seconds)
        with psycopg.connect(dsn) as conn:
            floor_scripts(conn, Path(tmp))
        plan: list[tuple[RawLimit, str, int]] = [
            (raw, "insert1.sql", 1),
            (raw, "insert100.sql", 100),
            *((floor, f"{name}.sql", batch) for name, (_, batch) in FLOORS.items()),
        ]
        for repeat in range(repeats):
            for runner, script, batch in plan:
                _empty(dsn)
                result = runner.run(script, 1, batch)
                samples.setdefault(script.removesuffix(".sql"), []).append(result)
                loads.append(os.getloadavg()[0])
                log(f"  [{repeat + 1}/{repeats}] {script:<30} {result.jobs_per_s:>10,.0f} jobs/s")
    medians = {
        name: statistics.median(r.jobs_per_s for r in runs) for name, runs in samples.items()
    }
    return {
        "medians": medians,
        "load_avg": statistics.fmean(loads),
        "samples": {name: [r.to_json() for r in runs] for name, runs in samples.items()},
    }


def report(measured: dict[str, Any]) -> str:
    """The table: each floor beside its raw limit."""
    medians: dict[str, float] = measured["medians"]
    lines = [
        f"{'statement (pgbench, 1 client)':<32} {'jobs/s':>10}  {'raw limit':<14} {'jobs/s':>10}"
        f"  {'floor/raw':>9}",
    ]
    for name, (raw_script, _) in FLOORS.items():
        raw_name = raw_script.removesuffix(".sql")
        lines.append(
            f"{name:<32} {medians[name]:>10,.0f}  {raw_name:<14} {medians[raw_name]:>10,.0f}"
            f"  {medians[name] / medians[raw_name]:>9.0%}"
        )
    lines.append(
        f"medians of {len(measured['samples']['insert1'])} interleaved runs; "
        f"load average {measured['load_avg']:.2f}"
    )
    return "\n".join(lines)


def main() -> None:
    """``python -m bench.floor``: print the schema floor beside the raw limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN (creates databases)")
    parser.add_argument("--scripts", type=Path, default=DEFAULT_SCRIPTS)
    parser.add_argument("--seconds", type=int, default=3, help="length of each pgbench run")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each")
    args = parser.parse_args()
    measured = measure(args.dsn, scripts=args.scripts, seconds=args.seconds, repeats=args.repeats)
    print(report(measured))


if __name__ == "__main__":
    main()
