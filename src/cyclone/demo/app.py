"""The client the demo's worker processes run: ``cyclone worker cyclone.demo.app:client``.

It reads ``CYCLONE_DSN``, registers the demo's kinds and ``flights_etl`` (with its
child workflow), serves both demo queues, and detects a crashed worker within five
seconds (``lease_ttl``), so the demo's chaos mode recovers quickly.
"""

from __future__ import annotations

import os

import cyclone
from cyclone.demo.etl import ETL_QUEUE, HANDLERS, MONTHS_QUEUE, flights_etl
from cyclone.errors import ConfigurationError

__all__ = ["LEASE_TTL", "client"]

LEASE_TTL = 5.0
"""Seconds: how long a killed worker's steps stay held before the sweep reclaims them."""


def client(*, queues: dict[str, int] | None = None) -> cyclone.Client:
    """A demo client on ``$CYCLONE_DSN``.

    Args:
        queues: queue -> slots; default two slots on each demo queue.

    Raises:
        ConfigurationError: ``CYCLONE_DSN`` is not set.
    """
    dsn = os.environ.get("CYCLONE_DSN")
    if not dsn:
        raise ConfigurationError("the demo's workers need CYCLONE_DSN")
    return cyclone.Client(
        dsn,
        handlers=HANDLERS,
        workflows=[flights_etl()],
        queues=queues or {ETL_QUEUE: 2, MONTHS_QUEUE: 2},
        lease_ttl=LEASE_TTL,
        poll_interval=0.5,
        shutdown_grace=10,
    )
