"""A real declarative ORM model on the test's database, SQLAlchemy engines on it, and
a listener on the wakeup channel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, ForeignKey, String, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from tests.helpers import poll_until

MARK = "mark"


class Base(DeclarativeBase):
    """The test model's base: its metadata is bound to no engine."""


class Customer(Base):
    __tablename__ = "shop_customers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(String(100), unique=True)
    customer_id: Mapped[int | None] = mapped_column(ForeignKey("shop_customers.id"))
    run_id: Mapped[int | None]


def sa_url(dsn: str, driver: str = "psycopg") -> URL:
    """The SQLAlchemy URL of libpq ``dsn`` for ``postgresql+<driver>``."""
    params = conninfo_to_dict(dsn)
    port = params.get("port")
    host = str(params["host"]) if params.get("host") else None
    socket_dir = host is not None and host.startswith("/")  # an embedded server's socket
    return URL.create(
        f"postgresql+{driver}",
        username=str(params["user"]) if params.get("user") else None,
        password=str(params["password"]) if params.get("password") else None,
        host=None if socket_dir else host,
        port=int(port) if port and not socket_dir else None,
        database=str(params["dbname"]),
        query=_socket_query(host, port) if socket_dir else {},
    )


def _socket_query(host: str | None, port: object) -> dict[str, str]:
    """The URL query of a server reached through its socket folder ``host``."""
    query = {"host": str(host)}
    if port:
        query["port"] = str(port)
    return query


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    """A psycopg 3 engine on the test's database, the model's tables created."""
    made = create_engine(sa_url(dsn))
    Base.metadata.create_all(made)
    yield made
    made.dispose()


@pytest.fixture
async def async_engine(engine: Engine, dsn: str) -> AsyncIterator[AsyncEngine]:
    """The asyncio twin of :func:`engine` (the tables made by it)."""
    made = create_async_engine(sa_url(dsn))
    yield made
    await made.dispose()


@pytest.fixture
def heard(dsn: str) -> Iterator[Callable[[], list[str]]]:
    """A listener on ``cyclone_available``; calling it returns the queues it heard since
    the last call (read up to a marker sent by the call: everything committed before the
    call has been delivered by then). A handler receives every notification, so that
    none is lost with the rest of a batch when the marker is found."""
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as marker,
    ):
        received: list[str] = []
        listener.add_notify_handler(lambda note: received.append(note.payload))
        listener.execute("LISTEN cyclone_available")

        def marker_received() -> bool:
            listener.execute("SELECT 1")  # delivers what arrived to the handler
            return MARK in received

        def read() -> list[str]:
            marker.execute("SELECT pg_notify('cyclone_available', %s)", [MARK])
            poll_until(marker_received, what="the marker notification")
            at = received.index(MARK)
            got, received[: at + 1] = received[:at], []
            return [json.loads(payload)["queue"] for payload in got]

        yield read
