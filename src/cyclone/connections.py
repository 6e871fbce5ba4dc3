"""Connection settings shared by the client's pools, the listener and the migrator.

Every connection Cyclone opens runs with ``search_path`` set to the chosen schema
(decisions.md, Connections and pools), so the statements in ``cyclone/sql`` need no
schema qualification, and carries an ``application_name`` that says what it serves.
It also asks for TCP keepalives and a TCP user timeout (:func:`keepalive_params`), so
that a connection cut by the network fails within seconds instead of hanging until the
operating system gives up (by default after many minutes).
"""

from __future__ import annotations

import math
import re
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cyclone.errors import ValidationError

__all__ = [
    "DEFAULT_TCP_USER_TIMEOUT",
    "check_schema_name",
    "connect_kwargs",
    "engine_conninfo",
    "keepalive_params",
]

DEFAULT_TCP_USER_TIMEOUT = 10.0
"""Seconds a connection may leave data unacknowledged (or keepalives unanswered) before
it is dropped: a third of the default 30 s lease, so that a worker whose link broke
finds out and reconnects well before its leases run out, and far above the delays of a
working network."""
KEEPALIVES_COUNT = 3
"""Unanswered keepalive probes that drop an idle connection."""

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema_name(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case identifier, else raise
    ``ValidationError`` (a name that needs quoting would not survive ``search_path``)."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema):
        raise ValidationError(
            f"schema must be a plain identifier (lower-case a-z, 0-9, _), got {schema!r}"
        )
    return schema


def connect_kwargs(schema: str) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect`` that select the schema."""
    return {"options": f"-c search_path={check_schema_name(schema)}"}


def keepalive_params(tcp_user_timeout: float | None) -> dict[str, str]:
    """libpq parameters that bound how long a broken TCP connection goes unnoticed.

    ``tcp_user_timeout`` in seconds (``None``: no parameters, the libpq and operating
    system defaults apply). A busy connection is dropped once its data has gone
    unacknowledged that long (libpq's ``tcp_user_timeout``, in milliseconds); an idle one
    (a LISTEN connection, a connection resting in a pool) is probed by keepalives
    after half of it, every sixth of it, and dropped after ``KEEPALIVES_COUNT``
    unanswered probes, about ``tcp_user_timeout`` in all (libpq takes whole seconds,
    1 at least). Unix-socket connections ignore them.
    """
    if tcp_user_timeout is None:
        return {}
    return {
        "keepalives": "1",
        "keepalives_idle": str(max(1, math.ceil(tcp_user_timeout / 2))),
        "keepalives_interval": str(max(1, math.ceil(tcp_user_timeout / 6))),
        "keepalives_count": str(KEEPALIVES_COUNT),
        "tcp_user_timeout": str(max(1, round(tcp_user_timeout * 1000))),
    }


def engine_conninfo(
    conninfo: str,
    *,
    schema: str,
    application_name: str,
    tcp_user_timeout: float | None = DEFAULT_TCP_USER_TIMEOUT,
) -> str:
    """``conninfo`` with the schema's ``search_path``, an ``application_name`` and the
    :func:`keepalive_params` of ``tcp_user_timeout`` (seconds) added.

    Options already present in ``conninfo`` are kept and the search path is appended to
    them; an ``application_name``, keepalive or ``tcp_user_timeout`` set in ``conninfo``
    wins over ours.

    Raises:
        ValidationError: ``conninfo`` cannot be parsed, or ``schema`` is not an identifier.
    """
    check_schema_name(schema)
    try:
        params = conninfo_to_dict(conninfo)
    except Exception as exc:
        raise ValidationError(f"cannot parse the connection string: {exc}") from exc
    options = str(params.get("options") or "")
    params["options"] = f"{options} -c search_path={schema}".strip()
    params.setdefault("application_name", application_name)
    for key, value in keepalive_params(tcp_user_timeout).items():
        params.setdefault(key, value)
    return make_conninfo("", **params)
