"""``*_tx`` calls on a Django connection: ``client.enqueue_tx(connection, ...)``.

Loaded by :mod:`cyclone.joins` once ``django`` is imported. It accepts
``django.db.connection`` (a proxy of the calling thread's ``default`` connection) and
``django.db.connections[alias]``, on Django's PostgreSQL backend with psycopg 3, inside
``transaction.atomic(using=alias)``: the call's statements run on that atomic block's
psycopg connection, so the run exists once the outermost block commits and is gone if
it rolls back; the wakeup is published through ``transaction.on_commit(using=alias)``,
after the commit (and never after a rollback).

Django's psycopg connection differs from Cyclone's own in two ways, both harmless to the
statements of a ``*_tx`` call: its cursors bind parameters on the client (as Cyclone's
do behind a transaction pooler), and it loads ``jsonb``, ``inet`` and ``timestamptz``
columns its own way (``jsonb`` as text), while those statements read only ``bigint``,
``text`` and ``boolean`` columns (ids, keys, versions); ``tests/django`` runs each of
them on a Django connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionProxy

from cyclone import joins
from cyclone.errors import ValidationError

__all__ = ["database_wrapper", "psycopg_connection", "unwrap"]


def database_wrapper(obj: Any) -> Any | None:
    """The calling thread's ``DatabaseWrapper`` that ``obj`` stands for:
    ``connections[alias]`` itself, or the wrapper behind ``django.db.connection``;
    ``None`` for any other object."""
    if isinstance(obj, ConnectionProxy):
        return connections[obj.alias]
    if isinstance(obj, BaseDatabaseWrapper):
        return obj
    return None


def psycopg_connection(wrapper: Any) -> psycopg.Connection[Any]:
    """The psycopg 3 connection of ``wrapper`` (opened if Django has not yet).

    Raises:
        ValidationError: ``wrapper`` is not on Django's PostgreSQL backend with psycopg 3
            (SQLite, MySQL, psycopg2, ...).
    """
    if wrapper.vendor != "postgresql":
        raise ValidationError(
            f"Django database {wrapper.alias!r} uses {wrapper.settings_dict['ENGINE']!r}; "
            "Cyclone joins only the PostgreSQL backend on psycopg 3"
        )
    wrapper.ensure_connection()
    conn = wrapper.connection
    if not isinstance(conn, psycopg.Connection):
        raise ValidationError(
            f"Django database {wrapper.alias!r} runs on {type(conn).__module__} "
            f"({type(conn).__name__}); Cyclone joins only psycopg 3 connections"
        )
    return conn


def unwrap(obj: Any) -> joins.Join | None:
    """The :class:`cyclone.joins.Join` of a Django connection, ``None`` for any other
    object.

    Raises:
        ValidationError: the connection is not on the PostgreSQL backend with psycopg 3,
            is outside ``transaction.atomic()``, or its atomic block is marked for
            rollback (an error occurred in it); nothing is written.
    """
    wrapper = database_wrapper(obj)
    if wrapper is None:
        return None
    alias = wrapper.alias
    conn = psycopg_connection(wrapper)
    if not wrapper.in_atomic_block:
        raise ValidationError(
            f"Django database {alias!r} is not inside transaction.atomic(using={alias!r}); "
            "*_tx calls join the caller's transaction"
        )
    if wrapper.needs_rollback:
        raise ValidationError(
            f"the atomic block of Django database {alias!r} is marked for rollback "
            "(an error occurred in it)"
        )
    return joins.Join(conn=conn, after_commit=_on_commit(alias))


def _on_commit(alias: str) -> Callable[[Callable[[], None]], None]:
    def after_commit(callback: Callable[[], None]) -> None:
        transaction.on_commit(callback, using=alias)

    return after_commit


joins.register(sync=unwrap)
