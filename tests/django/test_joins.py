"""``*_tx`` calls on Django's connections (:mod:`cyclone.contrib.django.joins`): they
join ``transaction.atomic()``, their wakeups wait for the commit, and a connection
that cannot join is refused with nothing written."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction

import cyclone
from cyclone.errors import ValidationError
from cyclone.notify import AVAILABLE
from tests.helpers import scalar


@cyclone.step("django_echo")
def echo(ctx: cyclone.Context, inp: Any) -> Any:
    return inp


async def _work(dsn: str, run_id: int) -> cyclone.Run:
    async with cyclone.Client(dsn, handlers=[echo]) as client:
        return await client.wait(run_id, timeout=30)


def _enqueue_then_raise(
    client: cyclone.SyncClient, conn: Any, kind: str, using: str = "default"
) -> None:
    """Enqueue in an atomic block of ``using`` that then raises ``RuntimeError``."""
    with transaction.atomic(using=using):
        client.enqueue_tx(conn, kind, {"n": 1})
        raise RuntimeError("undo")


def _runs(pg: psycopg.Connection[Any], kind: str) -> int:
    return int(scalar(pg, "SELECT count(*) FROM cyclone_steps WHERE kind = %s", (kind,)))


def test_enqueue_tx_in_atomic_commits_with_it_and_runs(
    django_dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Inside atomic() on django.db.connection the run is invisible until the commit,
    exists after it, and a worker runs it (its input came through Django's cursor)."""
    with cyclone.SyncClient(django_dsn) as client, transaction.atomic():
        handle = client.enqueue_tx(connection, echo, {"n": 1, "when": "now"})
        assert scalar(pg, "SELECT count(*) FROM cyclone_runs WHERE id = %s", (handle.run_id,)) == 0
    assert scalar(pg, "SELECT count(*) FROM cyclone_runs WHERE id = %s", (handle.run_id,)) == 1
    run = asyncio.run(_work(django_dsn, handle.run_id))
    assert (run.state, run.result) == (cyclone.RunState.COMPLETED, {"n": 1, "when": "now"})


def test_rollback_leaves_no_run(django_dsn: str, pg: psycopg.Connection[Any]) -> None:
    """An atomic block that raises takes the run with it."""
    with cyclone.SyncClient(django_dsn) as client:
        with pytest.raises(RuntimeError, match="undo"):
            _enqueue_then_raise(client, connection, "django_rolled_back")
        with transaction.atomic(), transaction.atomic():  # the inner one is a savepoint
            client.enqueue_tx(connection, "django_rolled_back", {"n": 2})
            transaction.set_rollback(True)  # rolled back: the run in it goes
    assert _runs(pg, "django_rolled_back") == 0


def _until_marker(listen: psycopg.Connection[Any], marker: str) -> list[psycopg.Notify]:
    """The notifications ``listen`` receives up to the one on channel ``marker``."""
    seen: list[psycopg.Notify] = []
    for note in listen.notifies(timeout=30):
        if note.channel == marker:
            return seen
        seen.append(note)
    raise AssertionError(f"no notification on {marker} within 30 s")


def _woken(notes: list[psycopg.Notify], queue: str) -> bool:
    return any(n.channel == AVAILABLE and json.loads(n.payload)["queue"] == queue for n in notes)


def test_wakeup_is_published_after_the_commit(django_dsn: str, pg: psycopg.Connection[Any]) -> None:
    """The queue's wakeup goes out through transaction.on_commit: none while the block
    is open (a marker sent meanwhile arrives with no wakeup before it), one after."""
    queue, marker = "django_wake", "django_test_marker"
    with psycopg.connect(django_dsn, autocommit=True) as listen:
        listen.execute(f"LISTEN {AVAILABLE}")
        listen.execute(f"LISTEN {marker}")
        with cyclone.SyncClient(django_dsn) as client:
            with transaction.atomic():
                client.enqueue_tx(connection, "django_woken", None, queue=queue)
                assert len(connection.run_on_commit) == 1
                pg.execute(f"NOTIFY {marker}")
                assert not _woken(_until_marker(listen, marker), queue)
            pg.execute(f"NOTIFY {marker}")
            assert _woken(_until_marker(listen, marker), queue)


def test_other_alias_joins_its_own_atomic_block(
    django_dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """connections[alias] joins atomic(using=alias); its rollback is its own."""
    other = connections["other"]
    with cyclone.SyncClient(django_dsn) as client:
        with transaction.atomic(using="other"):
            kept = client.enqueue_tx(other, "django_other", {"n": 1})
            assert other.connection is not connections["default"].connection
        with pytest.raises(RuntimeError, match="undo"):
            _enqueue_then_raise(client, other, "django_other", using="other")
        outside = r"'other' is not inside transaction\.atomic"
        with transaction.atomic(), pytest.raises(ValidationError, match=outside):
            client.enqueue_tx(other, "django_other", {"n": 3})  # default's block, not other's
    rows = pg.execute("SELECT run_id FROM cyclone_steps WHERE kind = 'django_other'").fetchall()
    assert rows == [(kept.run_id,)]


def test_every_tx_call_reads_its_rows_on_django_connection(
    django_dsn: str, pg: psycopg.Connection[Any]
) -> None:
    """Django's cursor class and loaders (jsonb as text, its timestamptz loader) change
    nothing a *_tx call reads: keyed, unique, many and submit calls find their
    duplicates, and a scheduled time and a JSON input go in as given."""
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    wf = cyclone.Workflow("django_flow")
    wf.node("only", echo)
    with cyclone.SyncClient(django_dsn) as client, transaction.atomic():
        first = client.enqueue_tx(connection, "django_keyed", [1, "x"], submit_key="k1")
        again = client.enqueue_tx(connection, "django_keyed", [2], submit_key="k1")
        unique = client.enqueue_tx(connection, "django_unique", None, unique_key="u1")
        unique_again = client.enqueue_tx(connection, "django_unique", None, unique_key="u1")
        many = client.enqueue_many_tx(connection, "django_many", [{"a": 1}, {"b": 2}])
        later = client.enqueue_tx(connection, "django_later", {"t": 1}, scheduled_at=at)
        submitted = client.submit_tx(connection, wf, {"w": 1}, submit_key="w1")
        resubmitted = client.submit_tx(connection, wf, {"w": 2}, submit_key="w1")
    assert (again.run_id, again.duplicate) == (first.run_id, True)
    assert (unique_again.run_id, unique_again.duplicate) == (unique.run_id, True)
    assert len({h.run_id for h in many}) == 2
    assert (resubmitted.run_id, resubmitted.duplicate) == (submitted.run_id, True)
    row = pg.execute(
        "SELECT r.input, s.scheduled_at FROM cyclone_runs r JOIN cyclone_steps s ON s.run_id = r.id"
        " WHERE r.id = %s",
        (later.run_id,),
    ).fetchone()
    assert row == ({"t": 1}, at)
    assert scalar(pg, "SELECT input FROM cyclone_runs WHERE id = %s", (first.run_id,)) == [1, "x"]


def test_refused_connections_write_nothing(django_dsn: str, pg: psycopg.Connection[Any]) -> None:
    """Outside atomic(), on a block marked for rollback, or on SQLite: a
    ValidationError naming the database, and no run."""
    from django.db import DatabaseError

    with cyclone.SyncClient(django_dsn) as client:
        with pytest.raises(ValidationError, match=r"'default' is not inside transaction\.atomic"):
            client.enqueue_tx(connection, "django_refused", None)
        with transaction.atomic():
            try:
                with transaction.atomic(savepoint=False):
                    connection.cursor().execute("SELECT 1/0")
            except DatabaseError:
                pass
            with pytest.raises(ValidationError, match="marked for rollback"):
                client.enqueue_tx(connection, "django_refused", None)
        sqlite = r"'lite' uses 'django\.db\.backends\.sqlite3'"
        with transaction.atomic(using="lite"), pytest.raises(ValidationError, match=sqlite):
            client.enqueue_tx(connections["lite"], "django_refused", None)
        not_a_connection: Any = object()
        with pytest.raises(ValidationError, match=r"expected a psycopg\.Connection"):
            client.enqueue_tx(not_a_connection, "django_refused", None)
    assert _runs(pg, "django_refused") == 0
