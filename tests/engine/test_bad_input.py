"""Bad input: a clear cyclone.errors exception naming the value, and nothing written.

docs/design.md, Rules of the public API: a rejected call writes nothing. Each case
checks the exception type, that its message names the offending value, and that no run
or step exists afterwards (and a caller's transaction is left usable).
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

import cyclone
from tests.helpers import scalar


def _nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


BAD_ENQUEUES: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("queue over 256 bytes", ("k", {}), {"queue": "q" * 257}, "257 bytes"),
    ("multibyte queue over 256 bytes", ("k", {}), {"queue": "é" * 129}, "258 bytes"),
    ("empty queue", ("k", {}), {"queue": ""}, "queue must not be empty"),
    ("input is a set", ("k", {1, 2}), {}, r"not a JSON value.*\{1, 2\}"),
    ("input is an object", ("k", {"when": object()}), {}, "not a JSON value"),
    ("input holds NaN", ("k", {"x": math.nan}), {}, "not a JSON value"),
    ("NUL in a nested string", ("k", {"a": ["ok", "b\x00d"]}), {}, r"NUL character at \$\.a\[1\]"),
    ("NUL in a key", ("k", {"a\x00": 1}), {}, "NUL character"),
    ("empty kind", ("", {}), {}, "kind must not be empty"),
    ("kind not a string", (42, {}), {}, "kind must be a string, got 42"),
    ("NUL in kind", ("a\x00b", {}), {}, "kind must not contain NUL"),
    (
        "max_attempts zero",
        ("k", {}),
        {"max_attempts": 0},
        "max_attempts must be between 1 and .*got 0",
    ),
    ("max_attempts negative", ("k", {}), {"max_attempts": -3}, "got -3"),
    (
        "max_attempts not int",
        ("k", {}),
        {"max_attempts": 2.5},
        "max_attempts must be an integer, got 2.5",
    ),
    ("negative timeout", ("k", {}), {"timeout": -1}, "timeout must be positive, got -1"),
    ("zero timeout", ("k", {}), {"timeout": timedelta(0)}, "timeout must be positive"),
    (
        "timeout not a duration",
        ("k", {}),
        {"timeout": "5s"},
        "timeout must be a timedelta or seconds, got '5s'",
    ),
    (
        "naive scheduled_at",
        ("k", {}),
        {"scheduled_at": datetime(2030, 1, 1)},
        "timezone-aware, got naive",
    ),
    ("negative delay", ("k", {}), {"scheduled_at": timedelta(seconds=-5)}, "zero or more"),
    ("delay past a century", ("k", {}), {"scheduled_at": timedelta.max}, "between 0 and"),
    ("timeout past a century", ("k", {}), {"timeout": 1e15}, "timeout must be between"),
    ("timeout under a millisecond", ("k", {}), {"timeout": 1e-7}, "timeout must be between"),
    ("lone surrogate in kind", ("a\ud800", {}), {}, "lone surrogate"),
    ("lone surrogate in queue", ("k", {}), {"queue": "q\udfff"}, "lone surrogate"),
    ("lone surrogate in input", ("k", {"s": "x\ud800"}), {}, "lone surrogate"),
    ("input nested too deeply", ("k", _nested(5000)), {}, "nested too deeply"),
    ("int too long to print", ("k", {"n": 10**5000}), {}, "not a JSON value"),
    ("priority beyond int32", ("k", {}), {"priority": 2**31}, "priority must be between"),
    ("priority is a bool", ("k", {}), {"priority": True}, "priority must be an integer, got True"),
    ("NUL in unique_key", ("k", {}), {"unique_key": "a\x00"}, "unique_key must not contain NUL"),
    ("empty sequence_key", ("k", {}), {"sequence_key": ""}, "sequence_key must not be empty"),
    ("negative retention", ("k", {}), {"retention": -1}, "retention must be zero or more, got -1"),
]


def _nothing_written(db: psycopg.Connection[Any]) -> None:
    assert scalar(db, "SELECT count(*) FROM cyclone_runs") == 0
    assert scalar(db, "SELECT count(*) FROM cyclone_steps") == 0


@pytest.mark.parametrize(
    ("case", "args", "options", "message"), BAD_ENQUEUES, ids=[c[0] for c in BAD_ENQUEUES]
)
async def test_bad_enqueue_is_refused_and_writes_nothing(
    dsn: str,
    db: psycopg.Connection[Any],
    case: str,
    args: tuple[Any, ...],
    options: dict[str, Any],
    message: str,
) -> None:
    async with cyclone.Client(dsn) as client:
        with pytest.raises(cyclone.ValidationError, match=message):
            await client.enqueue(*args, **options)
        if "unique_key" not in options:
            with pytest.raises(cyclone.ValidationError, match=message):
                await client.enqueue_many(args[0], [args[1]], **options)
    with (
        cyclone.SyncClient(dsn) as sync_client,
        pytest.raises(cyclone.ValidationError, match=message),
    ):
        sync_client.enqueue(*args, **options)
    _nothing_written(db)


async def test_bad_input_inside_a_caller_transaction_leaves_it_usable(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn) as client, await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("CREATE TABLE business (x int)")
        await conn.execute("INSERT INTO business VALUES (1)")
        with pytest.raises(cyclone.ValidationError, match="queue"):
            await client.enqueue_tx(conn, "k", {}, queue="x" * 300)
        await conn.execute("INSERT INTO business VALUES (2)")
        await conn.commit()
    assert scalar(db, "SELECT count(*) FROM business") == 2
    _nothing_written(db)


async def test_tx_calls_refuse_connections_outside_a_transaction(
    dsn: str, db: psycopg.Connection[Any]
) -> None:
    async with cyclone.Client(dsn) as client:
        auto = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        async with auto:
            with pytest.raises(cyclone.ValidationError, match="autocommit"):
                await client.enqueue_tx(auto, "k", {})
        with pytest.raises(cyclone.ValidationError, match="is closed"):
            await client.enqueue_tx(auto, "k", {})
        with (
            psycopg.connect(dsn) as sync_conn,
            pytest.raises(cyclone.ValidationError, match="AsyncConnection"),
        ):
            await client.enqueue_tx(sync_conn, "k", {})
        async with await psycopg.AsyncConnection.connect(dsn) as failed:
            with pytest.raises(psycopg.errors.DivisionByZero):
                await failed.execute("SELECT 1/0")
            with pytest.raises(cyclone.ValidationError, match="failed transaction"):
                await client.enqueue_tx(failed, "k", {})
        with pytest.raises(cyclone.ValidationError, match="got 'not a connection'"):
            await client.enqueue_tx("not a connection", "k", {})
        untrackables: list[Any] = ["not a connection", None, {}]
        for untrackable in untrackables:
            with pytest.raises(cyclone.ValidationError, match="cannot track wakeups of"):
                client.track_wakeups(untrackable)
    with (
        cyclone.SyncClient(dsn) as sync_client,
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(cyclone.ValidationError, match="autocommit"),
    ):
        sync_client.enqueue_tx(conn, "k", {})
    _nothing_written(db)


def test_bad_kind_declarations() -> None:
    with pytest.raises(cyclone.ValidationError, match="kind must not be empty"):
        cyclone.step("")
    with pytest.raises(cyclone.ValidationError, match="queue is 300 bytes"):
        cyclone.action("k", queue="q" * 300)
    with pytest.raises(cyclone.ValidationError, match="max_attempts must be between 1"):
        cyclone.step("k", max_attempts=0)
    with pytest.raises(cyclone.ValidationError, match="must take \\(ctx, inp\\)"):
        cyclone.step("k")(lambda ctx: None)
    with pytest.raises(
        cyclone.ValidationError, match="no_retry must list exception classes, got 'x'"
    ):
        cyclone.step("k", no_retry=["x"])  # type: ignore[list-item]
    with pytest.raises(cyclone.ValidationError, match="RetryPolicy base must be positive, got -1"):
        cyclone.RetryPolicy(base=-1)
    with pytest.raises(cyclone.ValidationError, match="RetryPolicy jitter out of range: 2"):
        cyclone.RetryPolicy(jitter=2)


def test_bad_client_options(dsn: str) -> None:
    noop = cyclone.action("noop")(lambda ctx, inp: None)
    with pytest.raises(
        cyclone.PoolTooSmallError, match="max_connections=8 is below tx_slots \\+ 6 = 10"
    ):
        cyclone.Client(dsn, handlers=[noop], queues={"default": 4}, max_connections=8)
    with pytest.raises(
        cyclone.PoolTooSmallError, match="max_connections=6 is below tx_slots \\+ 6 = 7"
    ):
        cyclone.Client(dsn, handlers=[noop], tx_slots=1, max_connections=6)
    cyclone.Client(
        dsn, handlers=[noop], queues={"default": 4}, max_connections=10
    )  # exactly enough
    cyclone.Client(dsn, handlers=[noop], queues={"default": 40}, tx_slots=2, max_connections=8)
    with pytest.raises(cyclone.ValidationError, match="lease_ttl must be positive, got -1"):
        cyclone.Client(dsn, lease_ttl=-1)
    with pytest.raises(cyclone.ValidationError, match="slots of queue 'a' must be between 1"):
        cyclone.Client(dsn, handlers=[noop], queues={"a": 0})
    with pytest.raises(cyclone.ValidationError, match="queue is 257 bytes"):
        cyclone.Client(dsn, handlers=[noop], queues={"q" * 257: 1})
    with pytest.raises(cyclone.ValidationError, match="kind 'noop' is registered twice"):
        cyclone.Client(dsn, handlers=[noop, cyclone.action("noop")(lambda ctx, inp: None)])
    with pytest.raises(cyclone.ValidationError, match="handlers must be kinds"):
        cyclone.Client(dsn, handlers=[lambda ctx, inp: None])  # type: ignore[list-item]
    with pytest.raises(cyclone.ValidationError, match="schema must be a plain identifier"):
        cyclone.Client(dsn, schema="x; drop table y")
    with pytest.raises(cyclone.ValidationError, match="got 'MySchema'"):
        cyclone.Client(dsn, schema="MySchema")
    with pytest.raises(cyclone.ValidationError, match="lease_ttl must be between"):
        cyclone.Client(dsn, lease_ttl=1e15)
    with pytest.raises(cyclone.ValidationError, match="retention must be between"):
        cyclone.Client(dsn, retention=1e300)
    with pytest.raises(cyclone.ValidationError, match="max_reclaims must be between 0"):
        cyclone.Client(dsn, max_reclaims=-1)


async def test_bad_run_references(dsn: str) -> None:
    async with cyclone.Client(dsn) as client:
        with pytest.raises(
            cyclone.ValidationError, match="expected a run id or a run handle, got 'abc'"
        ):
            await client.get_run("abc")  # type: ignore[arg-type]
        with pytest.raises(cyclone.ValidationError, match="got -1"):
            await client.cancel(-1)
        with pytest.raises(cyclone.ValidationError, match="got 9223372036854775808"):
            await client.cancel(2**63)
        with pytest.raises(cyclone.ValidationError, match="workflow must not contain NUL"):
            await client.list_runs(workflow="\x00")
        with pytest.raises(cyclone.NotFoundError, match="run 123456 does not exist"):
            await client.get_run(123456)
        with pytest.raises(cyclone.ValidationError, match="timeout must be zero or more"):
            await client.wait(1, timeout=-1)


async def test_unknown_options_are_named(dsn: str, db: psycopg.Connection[Any]) -> None:
    async with cyclone.Client(dsn) as client:
        with pytest.raises(cyclone.ValidationError, match=r"unknown option\(s\) \['bogus'\]"):
            await client.enqueue("k", {}, bogus=1)  # type: ignore[call-arg]
        with pytest.raises(cyclone.ValidationError, match=r"unknown option\(s\) \['unique_key'\]"):
            await client.enqueue_many("k", [{}], unique_key="u")  # type: ignore[call-arg]
    _nothing_written(db)


async def test_unmigrated_database_and_unreachable_server_fail_at_once(empty_dsn: str) -> None:
    with pytest.raises(cyclone.ConfigurationError, match="run `cyclone migrate"):
        await cyclone.Client(empty_dsn).enqueue("k", {})
    with pytest.raises(cyclone.ConfigurationError, match="schema in 'public' is not installed"):
        cyclone.SyncClient(empty_dsn).enqueue("k", {})
    with pytest.raises(psycopg.OperationalError):
        await cyclone.Client("host=127.0.0.1 port=1 user=nobody dbname=none").enqueue("k", {})


async def test_escaped_backslash_u0000_is_plain_text(dsn: str) -> None:
    """A backslash followed by "u0000" is not a NUL: it is stored and read back."""
    async with cyclone.Client(dsn) as client:
        job = await client.enqueue("k", {"path": "C:\\u0000dir"})
        assert (await client.get_run(job)).input == {"path": "C:\\u0000dir"}
