"""What ``cyclone demo`` says and logs on a normal run: the flag that made a run fresh
(not ``--fresh`` when ``--chaos`` or ``--manual-approve`` did), and no warning about
the months queue, which its own client leaves to its worker processes by design."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cyclone.demo import etl
from cyclone.demo.runner import DemoOptions
from cyclone.demo.submission import (
    fresh_flag,
    months_left_to_workers,
    own_client,
    submit_key_note,
)
from tests.demo.test_demo import run_demo


@pytest.mark.parametrize(
    ("flags", "note"),
    [
        ({}, "submit key nycflights13-abc"),
        ({"fresh": True}, "no submit key: --fresh computes anew"),
        ({"chaos": True}, "no submit key: --chaos computes anew"),
        ({"manual_approve": True}, "no submit key: --manual-approve computes anew"),
        ({"fresh": True, "chaos": True}, "no submit key: --fresh computes anew"),
    ],
)
def test_the_submit_key_note_names_the_flag_given(flags: dict[str, bool], note: str) -> None:
    options = DemoOptions(dsn=None, out_dir=Path("."), **flags)
    fresh = fresh_flag(options)
    assert submit_key_note(None if fresh else "nycflights13-abc", fresh) == note


async def test_the_months_queue_left_to_the_workers_is_no_warning(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The demo's own client, started as the demo starts it: the engine's line about
    the months queue it does not serve is INFO; a warning about another queue stays."""
    client = own_client(dsn, etl.flights_etl())
    with caplog.at_level(logging.INFO, logger="cyclone"), months_left_to_workers():
        await client.start()
        logging.getLogger("cyclone.engine").warning("queue %r is odd", "elsewhere")
    await client.stop()
    engine = [r for r in caplog.records if r.name == "cyclone.engine"]
    months = [r for r in engine if etl.MONTHS_QUEUE in r.getMessage()]
    assert [(r.levelname, "does not serve" in r.getMessage()) for r in months] == [("INFO", True)]
    assert [r.getMessage() for r in engine if r.levelno >= logging.WARNING] == [
        "queue 'elsewhere' is odd"
    ]


@pytest.mark.slow  # the whole demo, with its two worker processes (about 10 s)
def test_a_fresh_demo_names_its_flag_and_logs_no_warning(dsn: str, tmp_path: Path) -> None:
    out = run_demo(dsn, tmp_path, "--fresh")
    assert "(no submit key: --fresh computes anew)" in out
    logged = (tmp_path / "demo.log").read_text()
    assert "client" in logged and "started" in logged  # the demo's own client logged here
    assert [line for line in logged.splitlines() if " WARNING " in line] == []
