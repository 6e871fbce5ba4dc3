"""Connection settings shared by the client's pools, the listener and the migrator.

Every connection Cyclone opens runs with ``search_path`` set to the chosen schema
(docs/design.md, Connections and pools), so the statements in ``cyclone/sql`` need no
schema qualification, and carries an ``application_name`` that says what it serves.

Two ways to reach the server (``pooler=``):

* ``"session"`` (the default): a direct connection, or a pooler in session mode. The
  schema travels as a startup option (``-c search_path=...``) and the engine may use
  server-side prepared statements and LISTEN.
* ``"transaction"``: a pooler in transaction mode (PgBouncer ``pool_mode =
  transaction``, the poolers of managed services), where consecutive transactions of
  one client connection may run on different server connections. Nothing may outlive
  a transaction there: no startup option (poolers refuse or drop it), no server-side
  prepared statement (``prepare_threshold=None``), no session ``SET``, no LISTEN. The
  schema is set inside every transaction instead (:func:`cyclone.dbio.pin_search_path`).

Every connection also asks for TCP keepalives and a TCP user timeout
(:func:`keepalive_params`), so that a connection cut by the network fails within
seconds instead of hanging until the operating system gives up (by default after many
minutes).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from cyclone.dbio import pin_search_path
from cyclone.errors import DatabaseUnavailable, ValidationError
from cyclone.options import HOUR, Duration, seconds

PREPARED_MAX = 256
"""Prepared statements a direct connection keeps (psycopg's default is 100)."""

__all__ = [
    "BUSY_POOL_WAIT",
    "DEFAULT_TCP_USER_TIMEOUT",
    "POOLERS",
    "POOLER_ENV",
    "PREPARED_MAX",
    "ConnectionSettings",
    "Pooler",
    "borrow_async",
    "borrow_sync",
    "check_schema_name",
    "client_connections",
    "connect_failure",
    "engine_conninfo",
    "keepalive_params",
    "resolve_pooler",
]

DEFAULT_TCP_USER_TIMEOUT = 10.0
"""Seconds a connection may leave data unacknowledged (or keepalives unanswered) before
it is dropped: a third of the default 30 s lease, so that a worker whose link broke
finds out and reconnects well before its leases run out, and far above the delays of a
working network."""
KEEPALIVES_COUNT = 3
"""Unanswered keepalive probes that drop an idle connection."""

_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

Pooler = Literal["session", "transaction"]
"""How the server is reached: directly or through a session pooler, or through a
transaction pooler."""
POOLERS: tuple[Pooler, ...] = ("session", "transaction")
POOLER_ENV = "CYCLONE_POOLER"
"""The environment variable read when ``pooler=`` is not given (a DSN cannot carry it:
libpq refuses unknown keywords)."""


def check_schema_name(schema: str) -> str:
    """Return ``schema`` if it is a plain lower-case identifier, else raise
    ``ValidationError`` (a name that needs quoting would not survive ``search_path``)."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema):
        raise ValidationError(
            f"schema must be a plain identifier (lower-case a-z, 0-9, _), got {schema!r}"
        )
    return schema


def resolve_pooler(value: str | None) -> Pooler:
    """``value``, else ``$CYCLONE_POOLER``, else ``"session"``.

    Raises:
        ValidationError: a value (given or from the environment) other than
            ``"session"`` or ``"transaction"``; statement mode is refused because
            Cyclone's transactions hold several statements.
    """
    source = "pooler"
    if value is None:
        value = os.environ.get(POOLER_ENV) or None
        source = f"${POOLER_ENV}"
        if value is None:
            return "session"
    if value not in POOLERS:
        hint = (
            " (statement mode cannot run multi-statement transactions)"
            if value == "statement"
            else ""
        )
        raise ValidationError(f"{source} must be 'session' or 'transaction', got {value!r}{hint}")
    return value


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
    pooler: Pooler = "session",
    connect_timeout: float | None = None,
    tcp_user_timeout: float | None = DEFAULT_TCP_USER_TIMEOUT,
) -> str:
    """``conninfo`` with an ``application_name`` and the :func:`keepalive_params` of
    ``tcp_user_timeout`` (seconds) added, and in session mode the schema's
    ``search_path`` as a startup option.

    Options already present in ``conninfo`` are kept; the search path is appended.
    Behind a transaction pooler no startup option is added (the schema is set in each
    transaction instead). ``connect_timeout`` (seconds) becomes libpq's
    ``connect_timeout`` (whole seconds, at least 2). An ``application_name``,
    ``connect_timeout``, keepalive or ``tcp_user_timeout`` set in ``conninfo`` wins.

    Raises:
        ValidationError: ``conninfo`` cannot be parsed, or ``schema`` is not an identifier.
    """
    check_schema_name(schema)
    try:
        params = conninfo_to_dict(conninfo)
    except Exception as exc:
        raise ValidationError(f"cannot parse the connection string: {exc}") from exc
    if pooler == "session":
        options = str(params.get("options") or "")
        params["options"] = f"{options} -c search_path={schema}".strip()
    params.setdefault("application_name", application_name)
    if connect_timeout is not None:
        params.setdefault("connect_timeout", str(max(2, math.ceil(connect_timeout))))
    for key, value in keepalive_params(tcp_user_timeout).items():
        params.setdefault(key, value)
    return make_conninfo("", **params)


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How one client connects: the user's conninfo, the schema and the pooler mode.

    Attributes:
        conninfo: the libpq connection string or URL as given.
        schema: the Postgres schema of Cyclone's tables.
        pooler: ``"session"`` or ``"transaction"`` (see the module docstring).
        connect_timeout: seconds to wait for a connection (``None``: libpq's default).
        tcp_user_timeout: seconds before a broken connection is dropped
            (:func:`keepalive_params`; ``None``: the operating system's defaults).
    """

    conninfo: str
    schema: str
    pooler: Pooler = "session"
    connect_timeout: float | None = None
    tcp_user_timeout: float | None = DEFAULT_TCP_USER_TIMEOUT

    @classmethod
    def build(
        cls,
        conninfo: str,
        *,
        schema: str,
        pooler: str | None,
        connect_timeout: float | None = None,
        tcp_user_timeout: float | None = DEFAULT_TCP_USER_TIMEOUT,
    ) -> ConnectionSettings:
        """Validated settings (``pooler`` resolved as :func:`resolve_pooler` does).

        Raises:
            ValidationError: a bad schema name, pooler mode or connection string.
        """
        settings = cls(
            conninfo,
            check_schema_name(schema),
            resolve_pooler(pooler),
            connect_timeout,
            tcp_user_timeout,
        )
        settings.conninfo_for("cyclone")  # parses the connection string once, now
        return settings

    @classmethod
    def from_options(
        cls,
        conninfo: str,
        *,
        schema: str,
        pooler: str | None,
        connect_timeout: Duration,
        tcp_user_timeout: Duration | None,
    ) -> ConnectionSettings:
        """Settings from a client's options, durations as ``timedelta`` or seconds.

        Raises:
            ValidationError: a bad schema, pooler mode, connection string or duration
                (``connect_timeout`` 0.1 s to an hour; ``tcp_user_timeout`` 1 ms to an
                hour, or ``None`` for the system's defaults).
        """
        if connect_timeout is None:
            raise ValidationError("connect_timeout must be a timedelta or seconds, got None")
        return cls.build(
            conninfo,
            schema=schema,
            pooler=pooler,
            connect_timeout=seconds(connect_timeout, "connect_timeout", minimum=0.1, maximum=HOUR),
            tcp_user_timeout=seconds(
                tcp_user_timeout, "tcp_user_timeout", minimum=0.001, maximum=HOUR
            ),
        )

    @property
    def per_transaction(self) -> bool:
        """True behind a transaction pooler: nothing may outlive a transaction."""
        return self.pooler == "transaction"

    @property
    def can_listen(self) -> bool:
        """Whether LISTEN can work (never through a transaction pooler)."""
        return not self.per_transaction

    def conninfo_for(self, application_name: str) -> str:
        """The conninfo of a connection that serves ``application_name``."""
        return engine_conninfo(
            self.conninfo,
            schema=self.schema,
            application_name=application_name,
            pooler=self.pooler,
            connect_timeout=self.connect_timeout,
            tcp_user_timeout=self.tcp_user_timeout,
        )

    def kwargs(self, *, autocommit: bool) -> dict[str, Any]:
        """Keyword arguments of ``connect`` (and of a pool's connections)."""
        kwargs: dict[str, Any] = {"autocommit": autocommit}
        if self.per_transaction:
            kwargs["prepare_threshold"] = None  # named statements die with the backend
        return kwargs

    def prepare(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        """Ready a fresh connection (or a borrowed one): behind a transaction pooler,
        every statement Cyclone runs on it sets the schema in its own transaction;
        otherwise it keeps up to :data:`PREPARED_MAX` prepared statements (the engine's
        statements, a claim per limit it uses, and room for the caller's)."""
        if self.per_transaction:
            pin_search_path(conn, self.schema)
        elif conn.prepared_max is not None and conn.prepared_max < PREPARED_MAX:
            conn.prepared_max = PREPARED_MAX

    def configure_async(self) -> Callable[[psycopg.AsyncConnection[Any]], Any]:
        """A pool ``configure`` callback: READ COMMITTED transactions (the DAG advance
        relies on it, whatever the server's default) and :meth:`prepare`."""

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.set_isolation_level(psycopg.IsolationLevel.READ_COMMITTED)
            self.prepare(conn)

        return configure

    def configure_sync(self) -> Callable[[psycopg.Connection[Any]], None]:
        """The synchronous twin of :meth:`configure_async`."""

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            self.prepare(conn)

        return configure


BUSY_POOL_WAIT = 30.0
"""Seconds in all a call waits for a connection of a pool whose connections are all
busy while the database answers (a burst of calls, not an outage)."""


def _unavailable(settings: ConnectionSettings, reason: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"no connection to the database within {settings.connect_timeout:g} s: {reason}"
    )


def _reason(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


@contextlib.asynccontextmanager
async def borrow_async(
    pool: AsyncConnectionPool[Any], settings: ConnectionSettings
) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection of ``pool`` for a producer or inspection call, prepared for
    ``settings`` (a pool passed in by the caller is not configured by Cyclone).

    Waits ``settings.connect_timeout`` seconds; if no connection came, a direct
    connection tells an outage (raised at once) from a pool whose connections are all
    busy (then the wait goes on, :data:`BUSY_POOL_WAIT` seconds in all).

    Raises:
        DatabaseUnavailable: the database cannot be reached (nothing was sent).
        psycopg_pool.PoolTimeout: the database answers but no connection of the pool
            came free within :data:`BUSY_POOL_WAIT` seconds.
    """
    timeout = settings.connect_timeout or BUSY_POOL_WAIT
    async with contextlib.AsyncExitStack() as stack:
        try:
            conn = await stack.enter_async_context(pool.connection(timeout=timeout))
        except PoolTimeout:
            try:
                probe = await psycopg.AsyncConnection.connect(
                    settings.conninfo_for("cyclone-probe"), **settings.kwargs(autocommit=True)
                )
            except psycopg.Error as exc:
                raise _unavailable(settings, _reason(exc)) from exc
            await probe.close()
            rest = max(0.1, BUSY_POOL_WAIT - timeout)
            conn = await stack.enter_async_context(pool.connection(timeout=rest))
        settings.prepare(conn)
        yield conn


@contextlib.contextmanager
def borrow_sync(
    pool: ConnectionPool[Any], settings: ConnectionSettings
) -> Iterator[psycopg.Connection[Any]]:
    """The synchronous twin of :func:`borrow_async`."""
    timeout = settings.connect_timeout or BUSY_POOL_WAIT
    with contextlib.ExitStack() as stack:
        try:
            conn = stack.enter_context(pool.connection(timeout=timeout))
        except PoolTimeout:
            try:
                probe = psycopg.connect(
                    settings.conninfo_for("cyclone-probe"), **settings.kwargs(autocommit=True)
                )
            except psycopg.Error as exc:
                raise _unavailable(settings, _reason(exc)) from exc
            probe.close()
            rest = max(0.1, BUSY_POOL_WAIT - timeout)
            conn = stack.enter_context(pool.connection(timeout=rest))
        settings.prepare(conn)
        yield conn


def connect_failure(exc: psycopg.OperationalError) -> DatabaseUnavailable:
    """The error of a client that could not open its first connection: the server is
    down, unreachable or refusing connections, or it rejected this one (the message
    gives the server's reason: a wrong database name, a failed authentication)."""
    if isinstance(exc, DatabaseUnavailable):
        return exc
    return DatabaseUnavailable(f"cannot connect to the database: {_reason(exc)}")


P = TypeVar("P", AsyncConnectionPool[Any], ConnectionPool[Any])


def client_connections(
    conninfo: object,
    pool_type: type[P],
    client: str,
    *,
    schema: str,
    pooler: str | None,
    connect_timeout: Duration,
    tcp_user_timeout: Duration | None,
) -> tuple[P | None, str, ConnectionSettings]:
    """What a client was given to connect with: the pool passed in (``None`` for a
    connection string), the connection string, and the settings of every connection
    the client opens (:meth:`ConnectionSettings.from_options`).

    Raises:
        ValidationError: ``conninfo`` is neither a string nor a pool of ``pool_type``,
            a pool without a conninfo string, or a bad option.
    """
    pool: P | None = None
    if isinstance(conninfo, pool_type):
        pool, base = conninfo, conninfo.conninfo
        if not isinstance(base, str):
            raise ValidationError(f"a pool passed to {client} needs a conninfo string")
    elif isinstance(conninfo, str):
        base = conninfo
    else:
        name = pool_type.__name__
        article = "an" if name[0] in "AEIOU" else "a"
        raise ValidationError(f"conninfo must be a string or {article} {name}, got {conninfo!r}")
    settings = ConnectionSettings.from_options(
        base,
        schema=schema,
        pooler=pooler,
        connect_timeout=connect_timeout,
        tcp_user_timeout=tcp_user_timeout,
    )
    return pool, base, settings
