"""The schema-floor scripts of bench/floor.py are Cyclone's own statements: run as
written, each inserts its jobs exactly as ``enqueue`` and ``enqueue_many`` do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from bench.floor import FLOOR_KIND, FLOORS, floor_scripts

import cyclone

# every column a client's enqueue writes that does not differ from one job to the next
_SHAPE = (
    "SELECT s.node, s.kind, s.state, s.queue, s.priority, s.max_attempts, s.timeout,"
    " s.sequence_key, s.unique_key, s.retention, r.workflow, r.def_version, r.input::text,"
    " r.result_node, r.retention, r.state"
    " FROM cyclone_steps s JOIN cyclone_runs r ON r.id = s.run_id"
)


def test_each_floor_script_enqueues_as_the_client_does(
    dsn: str, db: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with cyclone.SyncClient(dsn) as client:
        client.enqueue(FLOOR_KIND, {})
    (expected,) = db.execute(_SHAPE).fetchall()
    db.execute("TRUNCATE cyclone_runs, cyclone_steps CASCADE")
    floor_scripts(db, tmp_path)
    assert sorted(p.stem for p in tmp_path.glob("*.sql")) == sorted(FLOORS)
    total = 0
    for name, (_, jobs) in FLOORS.items():
        text = (tmp_path / f"{name}.sql").read_text()
        # one line, one statement: what pgbench takes as one command
        assert text.count("\n") == 1 and text.endswith(";\n")
        db.execute(text.rstrip().rstrip(";"))
        total += jobs
        rows = db.execute(_SHAPE).fetchall()
        assert len(rows) == total and set(rows) == {expected}, name
