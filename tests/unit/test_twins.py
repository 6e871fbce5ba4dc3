"""``Client`` and ``SyncClient`` have not drifted: the same calls, with the same
parameters (an async connection where the sync twin takes a sync one) and the same
documented errors; every call the two share is written once, as a script of
:mod:`cyclone.calls` made a method of both (a coroutine function on ``Client``, a plain
function on ``SyncClient``)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

import cyclone
from cyclone.calls import producers, queues, runs, schedules
from cyclone.calls.effects import twin

ENGINE_ONLY = {
    "start",
    "stop",
    "hurry",
    "engine",
    "worker",
    "sweeper",
    "wait_scanner",
    "schedule_scanner",
    "purger",
    "threads_running",
    "listening",
    "set_queues",
    "handlers",
}
"""Public names of ``Client`` about the engine it runs: a ``SyncClient`` runs none."""
SYNC_ONLY = {"open", "close"}
"""``SyncClient`` opens and closes its pool; ``Client`` does it in start and stop."""
CALLS = [producers.ProducerCalls, runs.RunCalls, schedules.ScheduleCalls, queues.QueueCalls]
"""The classes of the calls both clients share."""
OWN_TWINS = {"wait", "migrate"}
"""Calls each client writes itself: waiting and migrating are different I/O."""


def public(cls: type) -> set[str]:
    return {
        name
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_") and name not in {"config", "settings"}
    }


def calls(cls: type) -> set[str]:
    """The public names a class defines itself (not inherited from object)."""
    return {name for name in vars(cls) if not name.startswith("_")}


def params(fn: Any) -> list[tuple[str, Any, Any, str]]:
    """(name, kind, default, annotation) of each parameter, with the async connection
    and pool types read as their sync twins."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        note = str(p.annotation).replace("AsyncConnectionPool", "ConnectionPool")
        note = note.replace("AsyncConnection", "Connection")
        out.append((p.name, p.kind, p.default, note))
    return out


def raises(fn: Any) -> set[str]:
    """The error names of a docstring's ``Raises:`` section."""
    doc = inspect.getdoc(fn) or ""
    if "Raises:" not in doc:
        return set()
    section = doc.split("Raises:", 1)[1]
    names = re.findall(r"^ {4}(\w[\w., ]*):", section, re.MULTILINE)
    return {n.strip().split(".")[-1] for group in names for n in group.split(",")}


def test_both_clients_offer_the_same_calls() -> None:
    assert public(cyclone.Client) - ENGINE_ONLY == public(cyclone.SyncClient) - SYNC_ONLY


@pytest.mark.parametrize(
    "name", sorted(public(cyclone.Client) - ENGINE_ONLY - {"migrate"}), ids=str
)
def test_twin_calls_take_the_same_parameters_and_name_the_same_errors(name: str) -> None:
    mine, twin = getattr(cyclone.Client, name), getattr(cyclone.SyncClient, name)
    if not callable(mine):
        return
    assert not inspect.iscoroutinefunction(twin)
    assert params(mine) == params(twin)
    assert raises(mine) == raises(twin), f"{name}: the twins document different errors"


@pytest.mark.parametrize("calls_class", CALLS, ids=lambda c: c.__name__)
def test_each_shared_call_is_written_once_for_both(calls_class: type) -> None:
    client = cyclone.Client("postgresql:///unused")
    sync_client = cyclone.SyncClient("postgresql:///unused")
    for name in calls(calls_class):
        shared = vars(calls_class)[name]
        assert getattr(cyclone.Client, name) is getattr(cyclone.SyncClient, name) is shared
        if isinstance(shared, twin):
            assert inspect.iscoroutinefunction(getattr(client, name)), name
            assert not inspect.iscoroutinefunction(getattr(sync_client, name)), name
            assert getattr(client, name).__doc__ == getattr(sync_client, name).__doc__


def test_only_waiting_and_migrating_are_written_twice() -> None:
    shared = set().union(*(calls(c) for c in CALLS))
    both = public(cyclone.Client) & public(cyclone.SyncClient)
    assert {n for n in both if callable(getattr(cyclone.Client, n))} - shared == OWN_TWINS
