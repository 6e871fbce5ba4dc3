"""How the demo submits its run: its own client, which leaves the months queue to the
worker processes; the run's submit key (the data set and the workflow's definition, so
that a changed workflow computes anew); and what the demo says of the key.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

import cyclone
from cyclone.demo import etl
from cyclone.demo.app import LEASE_TTL

if TYPE_CHECKING:
    from cyclone.demo.runner import DemoOptions

__all__ = [
    "fresh_flag",
    "months_left_to_workers",
    "own_client",
    "submit_key",
    "submit_key_note",
]


def own_client(dsn: str, wf: cyclone.Workflow) -> cyclone.Client:
    """The demo's own client on ``dsn``: it submits and follows ``wf`` (``flights_etl``)
    and runs the steps of the ETL queue; the months queue it leaves to the worker
    processes (start it inside :func:`months_left_to_workers`)."""
    return cyclone.Client(
        dsn,
        handlers=etl.HANDLERS,
        workflows=[wf],
        queues={etl.ETL_QUEUE: 2},
        lease_ttl=LEASE_TTL,
        poll_interval=0.2,
        shutdown_grace=10,
    )


def submit_key(client: cyclone.Client, wf: cyclone.Workflow, fingerprint: str) -> str:
    """The submit key of the run of ``wf`` over the data set ``fingerprint``: a re-run
    finds the run of the same data and the same definition of ``wf`` (compiled by
    ``client``) instead of computing it again."""
    return f"nycflights13-{fingerprint}-{client.config.compile(wf).def_version[:12]}"


def fresh_flag(options: DemoOptions) -> str | None:
    """The flag that makes the demo compute a new run (``--fresh``, or ``--chaos`` and
    ``--manual-approve``, which imply it), the first given; ``None`` without any."""
    given = (
        ("--fresh", options.fresh),
        ("--chaos", options.chaos),
        ("--manual-approve", options.manual_approve),
    )
    return next((flag for flag, on in given if on), None)


def submit_key_note(key: str | None, fresh: str | None) -> str:
    """What ``submitted run N (...)`` says of the run's submit key: ``key``, or that the
    flag ``fresh`` (see :func:`fresh_flag`) asked for a new run without one."""
    if key is not None:
        return f"submit key {key}"
    return f"no submit key: {fresh or 'a fresh run'} computes anew"


class _MonthsLeftToWorkers(logging.Filter):
    """Logs at INFO, not WARNING, the engine's note that the demo's own client does not
    serve the months queue: the demo leaves the months to its worker processes on
    purpose (so that ``--chaos`` finds a worker process holding one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno == logging.WARNING and etl.MONTHS_QUEUE in args:
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


@contextlib.contextmanager
def months_left_to_workers() -> Iterator[None]:
    """While it lasts, the engine's warning about the months queue (which the demo's own
    client leaves to its worker processes) is an INFO line (:class:`_MonthsLeftToWorkers`);
    start the demo's client inside it."""
    engine_log = logging.getLogger("cyclone.engine")
    note = _MonthsLeftToWorkers()
    engine_log.addFilter(note)
    try:
        yield
    finally:
        engine_log.removeFilter(note)
