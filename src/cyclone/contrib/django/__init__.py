"""Cyclone in a Django project (the ``django`` extra: Django 4.2 or newer, on its
PostgreSQL backend with psycopg 3).

Add ``"cyclone.contrib.django"`` to ``INSTALLED_APPS`` (its label is ``cyclone``), and
optionally ``CYCLONE = {"DSN": ..., "APP": "module:client"}`` to the settings
(:mod:`cyclone.contrib.django.config`). Then:

* ``SyncClient.enqueue_tx(django.db.connection, kind, input)`` (or
  ``connections[alias]``, or ``submit_tx``, ``enqueue_many_tx``) inside
  ``transaction.atomic()`` joins Django's transaction; the wakeup is published through
  ``transaction.on_commit`` (:mod:`cyclone.contrib.django.joins`, loaded by itself once
  Django is imported);
* :func:`completion_atomic` runs a sync handler's ORM writes in the step's completion
  transaction;
* ``manage.py migrate`` applies Cyclone's schema; ``manage.py cyclone COMMAND`` runs
  the ``cyclone`` command (``worker``, ``runs``, ...);
* the admin lists runs and steps, read only (:mod:`cyclone.contrib.django.models`).
"""

from __future__ import annotations

from cyclone.contrib.django.completion import completion_atomic

__all__ = ["completion_atomic"]
