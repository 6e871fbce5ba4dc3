"""Django ORM writes that commit with a step's completion: :func:`completion_atomic`.

A sync handler's business writes made through the ORM inside
``with completion_atomic(ctx):`` run on the step's completion transaction
(``ctx.completion_tx()``): they commit together with the step's completion, or not at
all (the handler raised, the step was reclaimed, the commit failed).

How: Django keeps one ``DatabaseWrapper`` per alias per thread, whose ``connection``
attribute is the psycopg connection its cursors run on. For the duration of the block,
in the handler's thread only, the wrapper of ``using`` is lent the completion
transaction's connection, configured as Django configures its own (its cursor class,
its loaders of ``jsonb``, ``inet`` and ``timestamptz``, its range dumper, its
``prepare_threshold`` and its session time zone), and is told that a transaction is
already open, as when Django's autocommit is off: the block is an ``atomic()`` block
whose outermost level is a savepoint of the completion transaction. After the block the
wrapper gets its own connection and state back, and the completion connection its own
configuration; other threads and other aliases are never touched.

Limits:
    * sync (``def``) handlers only: the ORM is synchronous, and an ``async def``
      handler's completion transaction is an ``AsyncConnection``.
    * Inside the block, ``transaction.atomic()`` nests as savepoints; Django's own
      commit and rollback (``transaction.commit()``, ``set_autocommit()``, a durable
      ``atomic``) raise ``TransactionManagementError`` or ``RuntimeError``, and psycopg
      refuses ``commit()`` on the connection itself: only the worker ends the
      transaction.
    * ``transaction.on_commit()`` and ``connection.close()`` inside the block raise
      :class:`cyclone.StateError` (the commit comes later, in the worker; use
      ``ctx.enqueue_completion`` for work that must follow it).
    * The block must not be entered while the thread's connection of ``using`` is in
      a transaction of Django's own (an ``atomic()`` block, or autocommit turned off).
    * ``OPTIONS["assume_role"]`` is not applied, and the statements run on the
      completion transaction's database: the alias must name the database Cyclone is
      in.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connections, transaction
from django.utils.connection import ConnectionDoesNotExist
from psycopg.adapt import AdaptersMap, PyFormat
from psycopg.pq import Format, TransactionStatus
from psycopg.types.range import Range

from cyclone.context import Context
from cyclone.contrib.django.joins import psycopg_connection
from cyclone.errors import StateError, ValidationError

__all__ = ["completion_atomic"]

_WRAPPER_STATE = (
    "connection",
    "autocommit",
    "in_atomic_block",
    "savepoint_ids",
    "atomic_blocks",
    "needs_rollback",
    "commit_on_exit",
    "closed_in_transaction",
    "run_on_commit",
    "health_check_done",
)
"""The attributes of Django's ``DatabaseWrapper`` that say which connection it uses and
where its transaction stands; saved before the block and put back after it."""


@contextmanager
def completion_atomic(ctx: Context, using: str = "default") -> Iterator[None]:
    """Run the ORM of Django database ``using`` on ``ctx``'s completion transaction.

    ``with completion_atomic(ctx): Order.objects.create(...)`` in a plain ``def``
    handler: the rows written in the block commit with the step's completion, or are
    rolled back with it. The block is an ``atomic()`` block (a savepoint: an exception
    leaving it undoes its writes, then fails the handler unless caught). See the
    module's docstring for the mechanism and its limits.

    Args:
        ctx: the handler's :class:`cyclone.Context`.
        using: the alias in ``settings.DATABASES`` whose ORM use is redirected (a
            PostgreSQL database on psycopg 3, the one Cyclone's tables are in).

    Raises:
        ValidationError: ``ctx`` belongs to an ``async def`` handler, ``using`` is not
            an alias of ``settings.DATABASES``, or it is not on the PostgreSQL backend
            with psycopg 3.
        StateError: the thread's connection of ``using`` is inside a transaction of
            Django's own, or ``transaction.on_commit()`` / ``close()`` was called on it
            inside the block.
        LeaseLost: the step timed out and its completion transaction was ended.
    """
    try:
        wrapper = connections[using]
    except ConnectionDoesNotExist:
        raise ValidationError(f"using={using!r} is not an alias of settings.DATABASES") from None
    if wrapper.vendor != "postgresql":
        psycopg_connection(wrapper)  # raises, naming the alias and its engine
    if wrapper.in_atomic_block or (wrapper.connection is not None and not wrapper.autocommit):
        raise StateError(
            f"Django database {using!r} is inside a transaction of its own in this thread; "
            "completion_atomic() must be entered outside transaction.atomic()"
        )
    params = wrapper.get_connection_params()
    if "context" not in params:  # the backend runs on psycopg2
        raise ValidationError(
            f"Django database {using!r} runs on psycopg2; completion_atomic() needs psycopg 3"
        )
    tx = ctx.completion_tx()
    if inspect.isawaitable(tx):
        if inspect.iscoroutine(tx):
            tx.close()  # never awaited: no transaction was opened
        raise ValidationError(
            f"completion_atomic() needs a plain def handler; {ctx!r} is an async handler's"
        )
    conn: psycopg.Connection[Any] = tx
    saved = {name: getattr(wrapper, name) for name in _WRAPPER_STATE}
    restore_conn = _configure(conn, params)
    try:
        wrapper.connection = conn
        wrapper.autocommit = False  # Django's atomic() then opens no transaction
        wrapper.in_atomic_block = wrapper.needs_rollback = wrapper.closed_in_transaction = False
        wrapper.savepoint_ids, wrapper.atomic_blocks, wrapper.run_on_commit = [], [], []
        wrapper.health_check_done = True
        wrapper.on_commit = _refuse("transaction.on_commit()", using)
        wrapper.close = _refuse("connection.close()", using)
        restore_zone = _set_time_zone(wrapper, conn)
        try:
            with transaction.atomic(using=using):
                yield
        finally:
            restore_zone()
    finally:
        for name in ("on_commit", "close"):
            vars(wrapper).pop(name, None)
        for name, value in saved.items():
            setattr(wrapper, name, value)
        restore_conn()


def _refuse(what: str, using: str) -> Callable[..., None]:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise StateError(
            f"{what} on Django database {using!r} inside completion_atomic(): the "
            "completion transaction is committed by the worker after the handler returns"
        )

    return refuse


def _configure(conn: psycopg.Connection[Any], params: dict[str, Any]) -> Callable[[], None]:
    """Give ``conn`` the cursor class, loaders, range dumper and ``prepare_threshold``
    Django gives its own connections (``params``: its ``get_connection_params()``); a
    function that puts ``conn``'s own back."""
    cursor_factory, threshold = conn.cursor_factory, conn.prepare_threshold
    template: AdaptersMap = params["context"]
    adapters = conn.adapters
    loaders: list[tuple[int, type[Any]]] = []
    for info in template.types:
        for fmt in (Format.TEXT, Format.BINARY):
            wanted = template.get_loader(info.oid, fmt)
            current = adapters.get_loader(info.oid, fmt)
            if wanted is not None and current is not None and wanted is not current:
                loaders.append((info.oid, current))
                adapters.register_loader(info.oid, wanted)
    dumpers = [adapters.get_dumper(Range, PyFormat.TEXT), adapters.get_dumper(Range, PyFormat.AUTO)]
    adapters.register_dumper(Range, template.get_dumper(Range, PyFormat.TEXT))
    conn.cursor_factory = params["cursor_factory"]
    conn.prepare_threshold = params.get("prepare_threshold")

    def restore() -> None:
        conn.cursor_factory, conn.prepare_threshold = cursor_factory, threshold
        for oid, loader in loaders:
            adapters.register_loader(oid, loader)
        for dumper in dumpers:  # the one for AUTO last, as it was
            adapters.register_dumper(Range, dumper)

    return restore


def _set_time_zone(wrapper: Any, conn: psycopg.Connection[Any]) -> Callable[[], None]:
    """Set the session time zone Django sets on its connections (``UTC`` with
    ``USE_TZ``, else ``TIME_ZONE``), as Django's own statement does; a function that
    sets the previous one back (unless the transaction failed: its rollback does)."""
    zone = wrapper.timezone_name
    previous = conn.info.parameter_status("TimeZone")
    if not zone or previous is None or previous == zone:
        return lambda: None
    statement = wrapper.ops.set_time_zone_sql()
    with conn.cursor() as cur:
        cur.execute(statement, [zone])

    def restore() -> None:
        if conn.info.transaction_status == TransactionStatus.INTRANS:
            with conn.cursor() as cur:
                cur.execute(statement, [previous])

    return restore
