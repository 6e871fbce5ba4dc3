"""Flow control's declarations and bad input: limits stored at start (the newer start
wins, with a warning), an ItemKey in def_version, and refused values that write
nothing."""

from __future__ import annotations

import logging
import re
from typing import Any

import psycopg
import pytest

import cyclone
from tests.engine.test_flow_limits import per_tenant
from tests.helpers import scalar


def test_item_key_field_is_part_of_def_version() -> None:
    """Two workflows differing only in the ItemKey's field have different def_versions,
    as do one with an ItemKey and one without; a plain string key changes nothing."""
    tenant = per_tenant(cyclone.ItemKey("tenant")).def_version
    assert tenant != per_tenant(cyclone.ItemKey("region")).def_version
    assert tenant != per_tenant(None).def_version
    assert per_tenant(None).def_version == per_tenant("x").def_version
    assert per_tenant("x").def_version == per_tenant("y").def_version


# -- the limits table and validation -------------------------------------------------


async def test_a_newer_start_with_other_limits_wins_and_warns(
    dsn: str, db: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A client starting with other limits for a kind than the stored ones writes its
    own and logs a warning naming both and the earlier writer; the same limits again
    warn nothing."""

    @cyclone.action("lim_conf", max_concurrency=2)
    async def older(ctx: cyclone.Context, inp: Any) -> None:
        return None

    @cyclone.action("lim_conf", max_concurrency=3, rate_limit="10/m")
    async def newer(ctx: cyclone.Context, inp: Any) -> None:
        return None

    caplog.set_level(logging.WARNING, logger="cyclone.worker")

    def warnings() -> list[str]:
        return [r.getMessage() for r in caplog.records if "lim_conf" in r.getMessage()]

    stored = "SELECT max_concurrency, rate_count, rate_per, rate_burst, max_snoozes, written_by"
    stored += " FROM cyclone_kind_limits WHERE kind = 'lim_conf'"
    async with cyclone.Client(dsn, handlers=[older]) as first:
        pass
    assert db.execute(stored).fetchall() == [(2, None, None, 0, 100, first.owner)]
    assert warnings() == []
    async with cyclone.Client(dsn, handlers=[newer]) as second:
        pass
    assert db.execute(stored).fetchall() == [(3, 10, 60.0, 0, 100, second.owner)]
    (warning,) = warnings()
    assert "max_concurrency=2, max_snoozes=100" in warning
    assert "max_concurrency=3, rate_limit=10/m, max_snoozes=100" in warning
    assert first.owner in warning and second.owner in warning
    async with cyclone.Client(dsn, handlers=[newer]):
        pass
    assert len(warnings()) == 1


def test_bad_limits_are_refused_naming_the_value() -> None:
    """A kind's limits are checked when it is declared: ``ValidationError`` naming the
    option and the bad value."""
    bad: list[tuple[dict[str, Any], str]] = [
        ({"max_concurrency": 0}, r"max_concurrency .*got 0"),
        ({"max_concurrency": True}, r"max_concurrency .*got True"),
        ({"rate_limit": "5/d"}, r"rate_limit .*got '5/d'"),
        ({"rate_limit": "fast"}, r"rate_limit .*got 'fast'"),
        ({"rate_limit": 5}, r"rate_limit .*got 5"),
        ({"max_snoozes": -1}, r"max_snoozes .*got -1"),
    ]
    for options, message in bad:
        with pytest.raises(cyclone.ValidationError, match=message):
            cyclone.step("lim_bad", **options)
        with pytest.raises(cyclone.ValidationError, match=message):
            cyclone.action("lim_bad", **options)
    with pytest.raises(cyclone.ValidationError, match=r"rate_limit count .*got 0"):
        cyclone.RateLimit(0)
    with pytest.raises(cyclone.ValidationError, match=r"rate_limit burst .*got -1"):
        cyclone.RateLimit(5, burst=-1)
    with pytest.raises(cyclone.ValidationError, match=r"rate_limit per .*got 0"):
        cyclone.RateLimit(5, per=0)
    with pytest.raises(cyclone.ValidationError, match="ItemKey field must not be empty"):
        cyclone.ItemKey("")


_BAD_KEYS = [("", "must not be empty"), ("a\x00b", re.escape(repr("a\x00b")))]


@pytest.mark.parametrize("option", ["concurrency_key", "rate_key", "fairness_key"])
@pytest.mark.parametrize(("key", "message"), _BAD_KEYS, ids=["empty", "nul"])
async def test_bad_flow_keys_are_refused_and_nothing_is_written(
    dsn: str, db: psycopg.Connection[Any], option: str, key: str, message: str
) -> None:
    """An empty key or one with NUL: ``ValidationError`` naming the option and the value
    from ``enqueue`` and ``enqueue_many`` of both clients, ``WorkflowError`` (a
    ``ValidationError``) from ``Workflow.node`` and ``fan_out``; no row written."""
    expected = f"{option} .*{message}"
    options: dict[str, Any] = {option: key}
    async with cyclone.Client(dsn) as producer:
        with pytest.raises(cyclone.ValidationError, match=expected):
            await producer.enqueue("lim_any", {}, **options)
        with pytest.raises(cyclone.ValidationError, match=expected):
            await producer.enqueue_many("lim_any", [{}, {}], **options)
    with cyclone.SyncClient(dsn) as sync_producer:
        with pytest.raises(cyclone.ValidationError, match=expected):
            sync_producer.enqueue("lim_any", {}, **options)
        with pytest.raises(cyclone.ValidationError, match=expected):
            sync_producer.enqueue_many("lim_any", [{}, {}], **options)
    wf = cyclone.Workflow("bad_keys")
    with pytest.raises(cyclone.WorkflowError, match=expected):
        wf.node("one", "lim_any", **options)
    source = wf.node("source", "lim_any")
    with pytest.raises(cyclone.WorkflowError, match=expected):
        wf.fan_out("each", "lim_any", over=source, **options)
    for table in ("cyclone_runs", "cyclone_steps", "cyclone_kind_limits"):
        assert scalar(db, f"SELECT count(*) FROM {table}") == 0, table


# -- the kind's one group; no head-of-line blocking ----------------------------------
