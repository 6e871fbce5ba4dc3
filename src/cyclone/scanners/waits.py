"""The wait scanner: timers, signal waits, run deadlines, fan-outs and child runs.

Every pass, in its own short transactions, with ``FOR UPDATE SKIP LOCKED`` on the run
rows (so the scanners of any number of clients share the work and never block each
other) and a CAS on every step it changes, runs each part:

* :mod:`cyclone.scanners.timers`: due timers complete and their runs advance; signal
  waits past their timeout are discarded (``signal_timeout``) and their runs resolved
  as for any discard; signal waits whose mailbox already holds their signals complete
  with them; runs past ``deadline_at`` fail, their active steps cancelled;
* :mod:`cyclone.scanners.fan_outs`: reached fan-out nodes release their items up to
  ``max_parallel``, and complete (or are discarded) once their items finished;
* :mod:`cyclone.scanners.children`: reached child nodes start their child run; child
  nodes whose child run finished complete with its result, or are discarded.

A run that ends in a pass (or whose child node's branch is cancelled) cancels its
active child runs in the same transaction (``runs_cancel_children``). What a part
finished and woke is announced after its commit.

The scanner runs every ``interval`` seconds, and at once when kicked (a worker reached a
signal wait, a child node or a fan-out node). A kick for an item task that finished
runs only the fan-out part (releases and completions), so that a fan-out's thousands
of item completions do not each cost a pass over timers, signals, deadlines and
children; those still run every ``interval``.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.scanners import timers
from cyclone.scanners.children import children
from cyclone.scanners.fan_outs import fan_outs
from cyclone.scanners.loop import Scanner
from cyclone.scanners.settle import Settlement
from cyclone.submit import CompiledWorkflow
from cyclone.wakeups import Announcer

__all__ = ["ScanResult", "WaitScanner"]

log = logging.getLogger("cyclone.waits")


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one pass did: steps changed by each part."""

    timers: int = 0
    timeouts: int = 0
    signalled: int = 0
    deadlines: int = 0
    fan_outs: int = 0
    children: int = 0


class WaitScanner(Scanner):
    """Completes timers and satisfied signal waits, times out waits, enforces deadlines."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        announcer: Announcer,
        *,
        interval: float,
        definitions: Mapping[str, CompiledWorkflow] | None = None,
        batch: int = 200,
    ) -> None:
        super().__init__(
            pool, announcer, interval=interval, name="wait scan", batch=batch, jitter=False
        )
        self._full_due = True  # the first pass is a full one
        self._last_full = -math.inf
        self._definitions = definitions or {}

    def kick(self) -> None:
        """Run a full pass (:meth:`scan_once`) now."""
        self._full_due = True
        super().kick()

    def kick_fan_outs(self) -> None:
        """Run a fan-out pass (:meth:`scan_fan_outs`) now, unless a full pass is due.

        An item task finishing asks for this: it may let the scanner release the next
        items or complete the node, and nothing else (no timer, signal, deadline or
        child run changes with it), so the other parts keep to their ``interval``.
        """
        super().kick()

    def next_delay(self) -> float:
        """Seconds until the next full pass is due: a fan-out pass in between does not
        push timers, signals, deadlines and child runs back."""
        since = asyncio.get_running_loop().time() - self._last_full
        return max(0.0, min(super().next_delay(), self.interval - since))

    async def pass_once(self) -> bool:
        """A full :meth:`scan_once` when kicked for one or ``interval`` seconds after the
        last; else (kicked by :meth:`kick_fan_outs` only) :meth:`scan_fan_outs`."""
        now = asyncio.get_running_loop().time()
        if self._full_due or now - self._last_full >= self.interval:
            self._full_due = False
            self._last_full = now
            await self.scan_once()
        else:
            await self.scan_fan_outs()
        return False

    async def scan_fan_outs(self) -> ScanResult:
        """Only the fan-out part of a pass; returns what it changed."""
        return ScanResult(fan_outs=self._announce(await fan_outs(self._pool, self._batch)))

    async def scan_once(self) -> ScanResult:
        """One pass of each part; returns what it changed."""
        pool, batch = self._pool, self._batch
        # signals before timeouts: a satisfied wait completes rather than times out
        signalled = self._announce(await timers.signals(pool, batch))
        return ScanResult(
            timers=self._announce(await timers.timers(pool, batch)),
            timeouts=self._announce(await timers.signal_timeouts(pool, batch)),
            signalled=signalled,
            deadlines=self._announce(await timers.deadlines(pool, batch)),
            fan_outs=self._announce(await fan_outs(pool, batch)),
            children=self._announce(await children(pool, batch, self._definitions)),
        )

    def _announce(self, done: Settlement) -> int:
        """After a part's commit: its wakeups and the runs it finished; its count."""
        self._announcer.announce(done.wakeups, done.finished)
        return done.changed
