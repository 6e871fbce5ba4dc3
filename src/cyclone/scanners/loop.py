"""The loop every scanner runs in: a pass every ``interval`` seconds, at once when
kicked, and a stop that lets the pass in progress finish (never cuts a transaction).
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psycopg_pool import AsyncConnectionPool

    from cyclone.wakeups import Announcer

__all__ = ["Periodic", "Scanner"]

log = logging.getLogger("cyclone.scanners")


class Periodic:
    """Base of the scanners: subclasses implement :meth:`pass_once`.

    Args:
        interval: seconds between passes.
        name: what a failed pass is logged as ("recovery sweep", ...).
        jitter: spread passes by up to 10 % each way, so that the scanners of many
            clients do not run in step.
    """

    def __init__(self, interval: float, *, name: str, jitter: bool = True) -> None:
        self.interval = interval
        self._name = name
        self._jitter = jitter
        self._kick = asyncio.Event()
        self._stopping = False
        self.passes = 0
        """Passes :meth:`run` has finished (tests wait for the first one)."""

    async def pass_once(self) -> bool:
        """One pass; True asks for the next pass at once (more work is waiting)."""
        raise NotImplementedError

    def next_delay(self) -> float:
        """Seconds from the end of a pass to the next: ``interval``, with jitter."""
        return self.interval * (random.uniform(0.9, 1.1) if self._jitter else 1.0)

    def kick(self) -> None:
        """Run the next pass now rather than at the next interval."""
        self._kick.set()

    def stop(self) -> None:
        """Let :meth:`run` return after the pass in progress."""
        self._stopping = True
        self._kick.set()

    async def run(self) -> None:
        """Pass until stopped; a failed pass is logged and the next comes on schedule."""
        while not self._stopping:
            self._kick.clear()
            try:
                again = await self.pass_once()
            except Exception as exc:
                log.warning("%s failed: %s", self._name, exc)
                again = False
            self.passes += 1
            if again:
                continue
            try:
                async with asyncio.timeout(self.next_delay()):
                    await self._kick.wait()
            except TimeoutError:
                pass


class Scanner(Periodic):
    """A periodic pass over the database, in batches of at most ``batch`` rows, on
    connections of ``pool``, that announces what it changed through ``announcer``.

    Args:
        pool: the engine pool (autocommit connections).
        announcer: sends the wakeups and finished runs of each commit.
        interval, name, jitter: as :class:`Periodic`.
        batch: rows one statement of a pass takes at most.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        announcer: Announcer,
        *,
        interval: float,
        name: str,
        batch: int,
        jitter: bool = True,
    ) -> None:
        super().__init__(interval, name=name, jitter=jitter)
        self._pool, self._announcer, self._batch = pool, announcer, batch
