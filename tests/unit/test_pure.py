"""Pure parts, no database: backoff, JSON validation, codecs, SQL registry, states."""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import cyclone
from cyclone.options import JobOptions, micros, seconds
from cyclone.payloads import codec_for, encode_json, find_nul
from cyclone.sql import _FILES, Q, Queries, Query, load_blocks, load_fragments
from cyclone.states import STEP_TRANSITIONS, TERMINAL_STEP_STATES, StepState


@given(
    failures=st.integers(min_value=1, max_value=10**9),
    base=st.floats(min_value=0.001, max_value=100),
    factor=st.floats(min_value=1, max_value=100),
    extra=st.floats(min_value=0, max_value=10_000),
    rand=st.floats(min_value=0, max_value=1),
)
def test_backoff_is_finite_and_capped_at_any_attempt(
    failures: int, base: float, factor: float, extra: float, rand: float
) -> None:
    policy = cyclone.RetryPolicy(base=base, factor=factor, cap=base + extra, jitter=0.5)
    delay = policy.delay(failures, rand=lambda: rand)
    assert math.isfinite(delay)
    assert 0 < delay <= policy.cap
    assert delay >= 0.5 * min(policy.cap, base)  # jitter takes at most half


def test_backoff_grows_then_caps() -> None:
    policy = cyclone.RetryPolicy(base=1, factor=2, cap=10, jitter=0)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_encode_json_names_the_problem() -> None:
    assert encode_json({"a": [1, "x", None, True]}, "input") == '{"a":[1,"x",null,true]}'
    assert encode_json("é", "input") == '"é"'
    with pytest.raises(
        cyclone.ValidationError, match=r"input holds a NUL character at \$\.a\[1\]\.b"
    ):
        encode_json({"a": [0, {"b": "x\x00"}]}, "input")
    with pytest.raises(cyclone.ValidationError, match="is not a JSON value"):
        encode_json({"x": math.inf}, "input")
    assert find_nul(["fine", {"k": "v"}]) is None


def test_codecs_for_dataclass_and_plain_values() -> None:
    @dataclasses.dataclass
    class Order:
        id: int
        amount: float

    codec = codec_for(Order)
    assert codec.decode({"id": 1, "amount": 2.5}) == Order(1, 2.5)
    assert codec.encode(Order(1, 2.5)) == {"id": 1, "amount": 2.5}
    plain = codec_for(dict)
    assert plain.decode({"a": 1}) == {"a": 1}
    assert plain.encode(Order(3, 1.0)) == {"id": 3, "amount": 1.0}


@dataclasses.dataclass
class Item:
    name: str


def test_handler_input_annotation_picks_its_codec() -> None:
    @cyclone.step("typed")
    def typed(ctx: cyclone.Context, inp: Item) -> Item:
        return inp

    assert typed.codec.decode({"name": "x"}) == Item("x")
    assert typed.has_output and not typed.is_async
    assert repr(typed) == "<cyclone step 'typed'>"


def test_durations_accept_timedelta_and_seconds() -> None:
    assert seconds(timedelta(minutes=2), "timeout") == 120
    assert seconds(1.5, "timeout") == 1.5
    assert seconds(None, "timeout") is None
    assert micros(1.5) == 1_500_000
    assert JobOptions.build(timeout=timedelta(seconds=3)).override(priority=4).priority == 4


def test_every_declared_statement_is_in_the_sql_files_and_back() -> None:
    declared = set(Queries.__annotations__)
    folder = Path(cyclone.__file__).parent / "sql"
    assert {path.name for path in folder.glob("*.sql")} == set(_FILES)
    texts = [(folder / name).read_text() for name in _FILES]  # fragments before their uses
    fragments: dict[str, str] = {}
    for text in texts:
        fragments = load_fragments(text, fragments)
    found: set[str] = set()
    for text in texts:
        found |= set(load_blocks(text, fragments))
    assert declared == found
    assert "FOR UPDATE OF s SKIP LOCKED" in Q.steps_claim.sql
    for name in declared:  # comments stay out of the statement text
        query = getattr(Q, name)
        assert query.name == name
        assert "--" not in query.sql, name


def test_a_fragment_stands_where_it_is_used_indented_as_the_use_line() -> None:
    """``-- use: <fragment>`` is replaced by the fragment's text (comments dropped, each
    line indented as the use line); a fragment may use one defined before it; a use of
    no fragment is refused."""
    text = (
        "-- fragment: cols\n-- the columns\nid,\nname\n\n"
        "-- fragment: pick\nSELECT\n    -- use: cols\nFROM t\n\n"
        "-- name: one\nWITH x AS (\n    -- use: pick\n)\nSELECT * FROM x;\n"
    )
    blocks = load_blocks(text)
    assert blocks == {
        "one": "WITH x AS (\n    SELECT\n        id,\n        name\n    FROM t\n)\nSELECT * FROM x"
    }
    assert set(load_fragments(text)) == {"cols", "pick"}
    with pytest.raises(KeyError, match="nowhere"):
        load_blocks("-- name: orphan\nSELECT\n    -- use: nowhere\n;\n")


def test_transition_table_names_only_real_moves() -> None:
    for (source, target), who in STEP_TRANSITIONS.items():
        # nothing leaves a terminal state but an operator retry
        assert source not in TERMINAL_STEP_STATES or who.startswith("operator retry")
        assert source != target
    assert (StepState.AVAILABLE, StepState.RUNNING) in STEP_TRANSITIONS
    assert all(isinstance(s, StepState) for pair in STEP_TRANSITIONS for s in pair)


def test_public_names_report_the_cyclone_module() -> None:
    for name in ("Client", "SyncClient", "Context", "Run", "Step", "Enqueued", "RetryPolicy"):
        assert getattr(cyclone, name).__module__ == "cyclone", name
    assert issubclass(cyclone.WaitTimeout, TimeoutError)
    assert issubclass(cyclone.LeaseLost, BaseException)
    assert not issubclass(cyclone.LeaseLost, Exception)


def test_a_transactional_batch_ends_with_its_commit() -> None:
    """Nothing follows the COMMIT in a batch's message (with the schema statement of a
    pooled connection or without): a statement there that failed would make psycopg
    raise for work that has committed."""
    from cyclone.dbio import Stmt, _layout, script

    work = Stmt(Q.steps_enqueue, {"kind": "k"})
    path = Stmt(Query.plain("SELECT set_config('search_path', 'x', true)"))
    for pinned in (None, path):
        query, _ = script(_layout([work], transaction=True, path=pinned)[0])
        assert query.startswith("BEGIN")
        assert query.endswith("COMMIT")
        assert "pg_notify" not in query


def test_a_block_that_extends_another_replaces_its_last_select() -> None:
    """``-- extends: base`` takes the base statement up to its last SELECT and ends with
    the block's own text; naming no earlier block is refused."""
    text = (
        "-- name: base\nWITH a AS (\n    SELECT 1 AS x\n)\nSELECT x\nFROM a;\n\n"
        "-- name: more\n-- extends: base\n-- a comment\nSELECT x, 2 AS y\nFROM a;\n"
    )
    blocks = load_blocks(text)
    assert blocks["base"] == "WITH a AS (\n    SELECT 1 AS x\n)\nSELECT x\nFROM a"
    assert blocks["more"] == "WITH a AS (\n    SELECT 1 AS x\n)\nSELECT x, 2 AS y\nFROM a"
    with pytest.raises(KeyError):
        load_blocks("-- name: orphan\n-- extends: nowhere\nSELECT 1;\n")


def test_the_woken_enqueue_is_the_enqueue_with_its_notify() -> None:
    """steps_enqueue_woken repeats steps_enqueue up to its last SELECT, so that the two
    cannot drift apart; only the wakeup is added."""
    last = "SELECT step.id AS step_id, step.run_id"
    enqueue, woken = Q.steps_enqueue.sql, Q.steps_enqueue_woken.sql
    head = enqueue[: enqueue.rindex(last)]
    assert woken.startswith(head + last)
    assert "pg_notify" in woken and "pg_notify" not in enqueue
