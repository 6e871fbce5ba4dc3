"""What a client's engine tells observers about the steps it runs.

An :class:`Observer` receives one call per event: a step claimed by this client's
worker, the end of one execution (its :data:`Outcome` and handler time), a step this
client's sweep gave back or discarded. :func:`cyclone.observability.register_metrics`
adds one that feeds Prometheus metrics. The engine calls observers on its event loop,
after the fact, and only when at least one is added: with none, an event costs one
truth test. An observer that raises is logged once per method and never disturbs the
step.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from cyclone.transitions import Claimed

__all__ = ["OUTCOMES", "Observer", "Observers", "Outcome"]

log = logging.getLogger("cyclone.observability")

Outcome = Literal["completed", "failed", "discarded", "released", "lost"]
"""How one execution of a step ended, for this worker:

* ``completed``: its completion committed;
* ``failed``: it raised (or timed out) and was put back for a retry with backoff;
* ``discarded``: it raised (or timed out, or its input could not be assembled) and was
  discarded (attempts spent, ``Discard``, a non-retried error, ``Snooze`` past the
  kind's ``max_snoozes``);
* ``released``: given back at shutdown, or by its handler's ``Snooze`` (no attempt
  counted);
* ``lost``: its lease ended before its outcome was written (reclaimed by a sweep,
  cancelled, or a stale completion or failure the CAS refused).
"""

OUTCOMES: tuple[Outcome, ...] = ("completed", "failed", "discarded", "released", "lost")
"""Every :data:`Outcome`, in a fixed order."""


class Observer:
    """The events of a client's engine; every method does nothing unless overridden.

    Methods run on the client's event loop and must return quickly (no I/O).
    """

    def step_claimed(self, step: Claimed) -> None:
        """This worker claimed ``step`` and is about to run it (``step.queue_latency``:
        seconds from ready to start)."""

    def step_ended(self, step: Claimed, outcome: Outcome, duration: float | None) -> None:
        """One execution of ``step`` ended with ``outcome``; ``duration``: seconds the
        handler ran (``None`` when it never returned, e.g. released at shutdown)."""

    def step_reclaimed(self, kind: str, queue: str) -> None:
        """This client's sweep gave a step of ``kind`` in ``queue`` back (lease expired
        or timeout passed)."""

    def step_swept_discard(self, kind: str, queue: str) -> None:
        """This client's sweep discarded a step of ``kind`` in ``queue`` past its
        reclaim limit."""


class Observers:
    """The observers of one client: an ordered set that forwards every event to each."""

    __slots__ = ("_failed", "_items")

    def __init__(self) -> None:
        self._items: tuple[Observer, ...] = ()
        self._failed: set[tuple[int, str]] = set()

    def add(self, observer: Observer) -> None:
        """Add ``observer`` (once; adding it again does nothing)."""
        if observer not in self._items:
            self._items = (*self._items, observer)

    def remove(self, observer: Observer) -> None:
        """Remove ``observer`` if it was added."""
        self._items = tuple(o for o in self._items if o is not observer)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Observer]:
        return iter(self._items)

    def step_claimed(self, step: Claimed) -> None:
        """Tell every observer :meth:`Observer.step_claimed`."""
        for observer in self._items:
            try:
                observer.step_claimed(step)
            except Exception as exc:
                self._report(observer, "step_claimed", exc)

    def step_ended(self, step: Claimed, outcome: Outcome, duration: float | None) -> None:
        """Tell every observer :meth:`Observer.step_ended`."""
        for observer in self._items:
            try:
                observer.step_ended(step, outcome, duration)
            except Exception as exc:
                self._report(observer, "step_ended", exc)

    def step_reclaimed(self, kind: str, queue: str) -> None:
        """Tell every observer :meth:`Observer.step_reclaimed`."""
        for observer in self._items:
            try:
                observer.step_reclaimed(kind, queue)
            except Exception as exc:
                self._report(observer, "step_reclaimed", exc)

    def step_swept_discard(self, kind: str, queue: str) -> None:
        """Tell every observer :meth:`Observer.step_swept_discard`."""
        for observer in self._items:
            try:
                observer.step_swept_discard(kind, queue)
            except Exception as exc:
                self._report(observer, "step_swept_discard", exc)

    def _report(self, observer: Observer, method: str, exc: Exception) -> None:
        key = (id(observer), method)
        if key not in self._failed:
            self._failed.add(key)
            log.warning("observer %r failed in %s (reported once): %r", observer, method, exc)
