"""The schema-floor scripts of bench/floor.py are Cyclone's own statements: run as
written, each inserts its jobs as ``enqueue`` and ``enqueue_many`` do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from bench.floor import FLOORS, floor_scripts


def test_each_floor_script_enqueues_its_jobs(db: psycopg.Connection[Any], tmp_path: Path) -> None:
    floor_scripts(db, tmp_path)
    assert sorted(p.stem for p in tmp_path.glob("*.sql")) == sorted(FLOORS)
    total = 0
    for name, (_, jobs) in FLOORS.items():
        text = (tmp_path / f"{name}.sql").read_text()
        # one line, one statement: what pgbench takes as one command
        assert text.count("\n") == 1 and text.endswith(";\n")
        db.execute(text.rstrip().rstrip(";"))
        total += jobs
        row = db.execute(
            "SELECT count(*), count(*) FILTER (WHERE s.state = 'available'"
            " AND s.kind = 'noop' AND r.workflow = 'noop' AND r.retention = interval '7 days')"
            " FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id"
        ).fetchone()
        assert row == (total, total), name
