"""Helpers for testing code that uses Cyclone, and a pytest plugin.

* :func:`drain` runs every due step inline, one at a time, until nothing is due;
* :func:`advance_time` moves due times and deadlines instead of sleeping;
* :func:`run_inline` runs a whole new run synchronously and returns it;
* :func:`assert_enqueued` asserts that a step of a kind waits to be claimed.

The pytest plugin (:mod:`cyclone.testing.plugin`, registered when Cyclone is installed)
gives the fixtures ``cyclone_dsn`` (a migrated database of the test's own),
``cyclone_client`` (a :class:`cyclone.Client` on it, not started, registering the
``cyclone_handlers`` and ``cyclone_workflows`` fixtures' kinds and workflows).
See docs/testing.md.

The names are imported when first used, so that loading the plugin costs nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cyclone.testing.asserts import ANY, assert_enqueued
    from cyclone.testing.clock import Shifted, advance_time
    from cyclone.testing.inline import DEFAULT_MAX_STEPS, drain, run_inline

__all__ = [
    "ANY",
    "DEFAULT_MAX_STEPS",
    "Shifted",
    "advance_time",
    "assert_enqueued",
    "drain",
    "run_inline",
]

_WHERE = {
    "ANY": "asserts",
    "assert_enqueued": "asserts",
    "Shifted": "clock",
    "advance_time": "clock",
    "DEFAULT_MAX_STEPS": "inline",
    "drain": "inline",
    "run_inline": "inline",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'cyclone.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"cyclone.testing.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
