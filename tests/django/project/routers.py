"""Migrations run on ``default`` only (``other`` is the same database, ``lite`` has no
Cyclone)."""

from __future__ import annotations

from typing import Any


class DefaultOnly:
    """Allow migrating the ``default`` alias alone."""

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == "default"
