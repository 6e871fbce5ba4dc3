"""The Django app of :mod:`cyclone.contrib.django` (label ``cyclone``)."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["CycloneConfig"]


class CycloneConfig(AppConfig):
    """Add ``"cyclone.contrib.django"`` to ``INSTALLED_APPS``: ``manage.py migrate``
    applies Cyclone's schema, ``manage.py cyclone`` runs the ``cyclone`` command, and
    the admin shows runs and steps (read only)."""

    name = "cyclone.contrib.django"
    label = "cyclone"
    verbose_name = "Cyclone"
    default_auto_field = "django.db.models.BigAutoField"
