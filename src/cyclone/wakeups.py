"""What a commit asks the engine to wake, and the one place that sends it.

A statement that moves steps reports a :class:`Wakeups`: queues that received
claimable work, and whether the wait scanner has a pass to make. After the commit, the
engine's :class:`Announcer` wakes this client's own claim loops and scanner and
publishes the queues and finished runs to every other client (``cyclone_available``,
``cyclone_run_done``). Producers, operator calls, the worker, the completer and every
scanner go through it, so that no caller decides on its own what a wakeup means.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["NO_WAKEUPS", "Announcer", "Wakeups"]


@dataclass(frozen=True, slots=True)
class Wakeups:
    """What to wake after a commit that moved steps.

    ``queues`` received available steps (a NOTIFY to their workers); ``signals`` and
    ``children`` say that a signal wait or a child node was reached (a full pass of the
    wait scanner: a signal may already be in the mailbox, the child run must start);
    ``fan_outs`` that a fan-out node was reached or restored, or an item task finished
    (a fan-out pass of the wait scanner).
    """

    queues: frozenset[str] = frozenset()
    signals: bool = False
    children: bool = False
    fan_outs: bool = False

    def __or__(self, other: Wakeups) -> Wakeups:
        return Wakeups(
            self.queues | other.queues,
            self.signals or other.signals,
            self.children or other.children,
            self.fan_outs or other.fan_outs,
        )

    def __bool__(self) -> bool:
        return bool(self.queues) or self.scan is not None

    @property
    def scan(self) -> str | None:
        """The wait scanner pass asked for: ``"full"``, ``"fan_outs"`` or ``None``."""
        if self.signals or self.children:
            return "full"
        return "fan_outs" if self.fan_outs else None

    @classmethod
    def of_queues(cls, queues: Iterable[str]) -> Wakeups:
        """Only queues to wake (an enqueue, a submit's roots, released items)."""
        return cls(queues=frozenset(queues))


NO_WAKEUPS = Wakeups()
"""Nothing to wake."""


class _Publishes(Protocol):
    def available(self, queues: Iterable[str]) -> None: ...

    def run_done(self, run_ids: Iterable[int]) -> None: ...


class _Scans(Protocol):
    def kick(self) -> None: ...

    def kick_fan_outs(self) -> None: ...


class Announcer:
    """Sends the wakeups of committed work: to this client's claim loops and wait
    scanner (when it runs them) and, through the publisher, to every client.

    ``local`` (a queue name in, nothing out) wakes this client's claim loop of that
    queue; ``scanner`` is its wait scanner. Both are set when the engine starts them and
    cleared when it stops; a client that only produces has neither. Never blocks, never
    raises: the publisher logs a NOTIFY that fails, and polling finds the work.
    """

    def __init__(self, publisher: _Publishes) -> None:
        self.publisher = publisher
        self.local: Callable[[str], None] | None = None
        self.scanner: _Scans | None = None

    def announce(self, wakeups: Wakeups, finished: Iterable[int] = ()) -> None:
        """After a commit: wake for ``wakeups`` and announce the runs ``finished``."""
        scanner = self.scanner
        if scanner is not None:
            if wakeups.scan == "full":
                scanner.kick()
            elif wakeups.scan == "fan_outs":
                scanner.kick_fan_outs()
        if wakeups.queues:
            local = self.local
            if local is not None:
                for queue in wakeups.queues:
                    local(queue)
            self.publisher.available(wakeups.queues)
        finished = frozenset(finished)
        if finished:
            self.publisher.run_done(finished)
