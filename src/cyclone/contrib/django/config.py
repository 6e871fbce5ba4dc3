"""The ``CYCLONE`` setting of a Django project, and the DSN it stands for.

``CYCLONE = {"DSN": ..., "APP": "module:client"}`` in ``settings.py``; both keys are
optional. ``DSN`` (a libpq connection string or URL) is where Cyclone's tables are;
without it, the database of Django's ``default`` alias, as Django connects to it.
``APP`` names the application's ``cyclone.Client`` for ``manage.py cyclone worker``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from cyclone.errors import ConfigurationError

__all__ = ["KEYS", "app", "conninfo_of", "dsn", "options"]

KEYS = frozenset({"DSN", "APP"})
"""The keys ``CYCLONE`` may hold."""


def options() -> dict[str, Any]:
    """The ``CYCLONE`` setting (``{}`` when the project has none).

    Raises:
        ConfigurationError: ``CYCLONE`` is not a dict, holds a key other than ``DSN`` and
            ``APP``, or a value that is not a non-empty string.
    """
    from django.conf import settings

    given = getattr(settings, "CYCLONE", {})
    if not isinstance(given, dict):
        raise ConfigurationError(f"settings.CYCLONE must be a dict, got {given!r}")
    unknown = sorted(str(key) for key in given.keys() - KEYS)
    if unknown:
        raise ConfigurationError(
            f"settings.CYCLONE has unknown keys {unknown}; it takes {sorted(KEYS)}"
        )
    for key, value in given.items():
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                f"settings.CYCLONE[{key!r}] must be a non-empty string, got {value!r}"
            )
    return dict(given)


def conninfo_of(alias: str = "default") -> str:
    """A libpq connection string to the database of Django's ``alias``, with the
    parameters Django connects with (``NAME``, ``USER``, ``PASSWORD``, ``HOST``,
    ``PORT`` and the libpq keys of ``OPTIONS``, such as ``sslmode``).

    Raises:
        ConfigurationError: no such alias, or its engine is not PostgreSQL.
    """
    from django.db import connections
    from django.utils.connection import ConnectionDoesNotExist

    try:
        wrapper = connections[alias]
    except ConnectionDoesNotExist:
        raise ConfigurationError(f"settings.DATABASES has no alias {alias!r}") from None
    if wrapper.vendor != "postgresql":
        raise ConfigurationError(
            f"database {alias!r} uses {wrapper.settings_dict['ENGINE']!r}, not PostgreSQL; "
            "set settings.CYCLONE['DSN']"
        )
    keywords = _libpq_keywords()
    params = {
        key: str(value)
        for key, value in wrapper.get_connection_params().items()
        if key in keywords and value is not None
    }
    return make_conninfo("", **params)


def _libpq_keywords() -> set[str]:
    """The connection keywords libpq knows (``dbname``, ``host``, ``sslmode``, ...)."""
    return {option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()}


def dsn() -> str:
    """Where Cyclone's tables are: ``CYCLONE["DSN"]``, else :func:`conninfo_of` the
    ``default`` alias.

    Raises:
        ConfigurationError: as :func:`options` and :func:`conninfo_of`.
    """
    return options().get("DSN") or conninfo_of("default")


def app() -> str | None:
    """``CYCLONE["APP"]``: the client ``manage.py cyclone worker`` runs, or ``None``.

    Raises:
        ConfigurationError: as :func:`options`.
    """
    value: str | None = options().get("APP")
    return value
