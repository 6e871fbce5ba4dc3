"""Connection settings shared by the client's pools, the listener and the migrator.

Every connection Cyclone opens runs with ``search_path`` set to the chosen schema
(decisions.md, Connections and pools), so the statements in ``cyclone/sql`` need no
schema qualification, and carries an ``application_name`` that says what it serves.
"""

from __future__ import annotations

import re
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from cyclone.errors import ValidationError

__all__ = ["check_schema_name", "connect_kwargs", "engine_conninfo"]

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


def engine_conninfo(conninfo: str, *, schema: str, application_name: str) -> str:
    """``conninfo`` with the schema's ``search_path`` and an ``application_name`` added.

    Options already present in ``conninfo`` are kept; the search path is appended.

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
    return make_conninfo("", **params)
