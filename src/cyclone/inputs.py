"""Output Resolution: a workflow step's input, from upstream outputs, through an LRU cache.

docs/design.md, Data flow in a DAG. When a worker claims
a step with a data edge, it reads the upstream outputs by ``(run_id, node)``: first from
this client's :class:`OutputCache` (at most 10,000 entries and 64 MiB of JSON text; an
output larger than the budget is never cached), then from the database in one query per
claim for all the misses. Outputs are cached as JSON text and decoded for each use, so a
handler that mutates its input cannot change what the next reader gets.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "MAX_CACHE_BYTES",
    "MAX_CACHE_ENTRIES",
    "InputError",
    "OutputCache",
    "assemble",
    "bindings_of",
    "names_of",
    "needed",
]

MAX_CACHE_ENTRIES = 10_000
"""Most outputs one client's cache holds."""
MAX_CACHE_BYTES = 64 * 1024 * 1024
"""Most bytes of JSON text one client's cache holds (64 MiB)."""

OutputKey = tuple[int, str]
"""``(run_id, node)``."""


class InputError(Exception):
    """A step's input cannot be assembled from its upstream outputs (the step is discarded)."""


def _size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


class OutputCache:
    """Least-recently-used upstream outputs by ``(run_id, node)``, as JSON text.

    Bounded by entry count and by bytes of JSON text; an output over the byte budget is
    not cached. ``None`` stands for a step that completed with no output.
    """

    def __init__(
        self, *, max_entries: int = MAX_CACHE_ENTRIES, max_bytes: int = MAX_CACHE_BYTES
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._items: OrderedDict[OutputKey, str | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: OutputKey) -> tuple[bool, str | None]:
        """``(found, text)``; a hit becomes the most recently used entry."""
        if key not in self._items:
            self.misses += 1
            return False, None
        self.hits += 1
        self._items.move_to_end(key)
        return True, self._items[key]

    def put(self, key: OutputKey, text: str | None) -> None:
        """Remember an output, evicting the least recently used entries to fit."""
        size = 0 if text is None else _size(text)
        if size > self.max_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self.bytes -= _size(old)
        self._items[key] = text
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            _, evicted = self._items.popitem(last=False)
            if evicted is not None:
                self.bytes -= _size(evicted)


def needed(
    run_id: int, input_from: str | None, bindings: Sequence[tuple[str, str]] | None
) -> list[OutputKey]:
    """The upstream outputs one step's input is made of."""
    if input_from is not None:
        return [(run_id, input_from)]
    return [(run_id, node) for node, _ in bindings or ()]


def bindings_of(
    nodes: Sequence[str] | None, modes: Sequence[str] | None
) -> tuple[tuple[str, str], ...] | None:
    """A step's input bindings as ``(upstream node, assembly mode)`` pairs in slot order,
    from the two aligned arrays ``steps_claim`` returns (``None`` for a step without
    any)."""
    if not nodes or not modes:
        return None
    return tuple(zip(nodes, modes, strict=True))


def names_of(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """A step's input names in slot order, from the array ``steps_claim`` returns
    (``binding_names``), or ``None`` for positional bindings."""
    return tuple(names) if names else None


def assemble(
    run_id: int,
    input_from: str | None,
    bindings: Sequence[tuple[str, str]] | None,
    outputs: Mapping[OutputKey, str | None],
    names: Sequence[str] | None = None,
) -> Any:
    """The input of a step with a data edge, from the texts of its upstream outputs.

    ``input_from``: that output. ``bindings`` with ``names`` (one per binding, in slot
    order): a dict, each source's output under its name. Otherwise, in ``tuple`` mode:
    a list with one element per source; in ``array`` mode: the sources' lists
    concatenated (``None`` adds nothing).

    Raises:
        InputError: an upstream output is missing, an ``array`` source is not a list,
            or the names do not match the bindings one to one.
    """

    def load(node: str) -> Any:
        key = (run_id, node)
        if key not in outputs:
            raise InputError(f"upstream node {node!r} of run {run_id} has no completed output")
        text = outputs[key]
        return None if text is None else json.loads(text)

    if input_from is not None:
        return load(input_from)
    pairs = bindings or ()
    if names:
        if len(names) != len(pairs):
            raise InputError(
                f"{len(names)} input names for {len(pairs)} input bindings: {list(names)}"
            )
        return {name: load(node) for name, (node, _) in zip(names, pairs, strict=True)}
    if pairs and all(mode == "array" for _, mode in pairs):
        merged: list[Any] = []
        for node, _ in pairs:
            value = load(node)
            if value is None:
                continue
            if not isinstance(value, list):
                raise InputError(
                    f"array assembly needs a list from node {node!r}, got {type(value).__name__}"
                )
            merged.extend(value)
        return merged
    return [load(node) for node, _ in pairs]
