"""Heartbeats: one ticker per worker renews every lease it holds, one statement a tick.

A lease's renewal falls due TTL/3 after its claim or its last renewal (the moment the
renewing statement was sent, a little before the database's ``now()`` that set the new
expiry). The ticker sleeps until the earliest
renewal due, then renews, in one statement (``steps_heartbeat``), every lease due
within the next tick of TTL/6. Hence:

* a lease is renewed between TTL/6 and TTL/3 after its last renewal (plus the event
  loop's and the previous statement's latency), never later than TTL/3 + one tick:
  at least two thirds of the TTL are left whenever it is renewed;
* two statements are at least a tick apart, so a worker sends at most 6 / TTL heartbeat
  statements a second however many steps it holds (one every 5 s with the default
  30 s TTL), where a statement per step every TTL/3 made 100 a second for 1,000 steps;
* each row keeps its own guard and outcome: a step the statement did not renew lost its
  lease, and the worker is told (:class:`Heartbeats` ``lost``);
* a statement that fails is logged and sent again a tick later; its leases are not
  taken for lost (after two failures in a row a lease is renewed at most TTL/3 + two
  ticks, two thirds of the TTL, after its last renewal). A lease found busy (its row
  locked by a completion, a cancel or the sweep in flight) is tried again a tick later.

With nothing held there is no ticker task; the next claim starts one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import fetch_async
from cyclone.transitions import Claimed, heartbeat_stmt, parse_heartbeat

__all__ = ["Heartbeats"]

log = logging.getLogger("cyclone.worker")


@dataclass(slots=True, eq=False)
class _Lease:
    step: Claimed
    due: float  # loop time its renewal falls due


class Heartbeats:
    """Renews the leases of the steps a worker holds (module docstring).

    ``ttl`` is the lease in seconds; ``lost(step)`` is called once for a held step whose
    lease a heartbeat found gone (reclaimed, cancelled, timed out), which is then no
    longer renewed. The counters :attr:`statements`, :attr:`errors` and :attr:`renewed`
    tell what the ticker did.
    """

    def __init__(
        self, pool: AsyncConnectionPool[Any], *, ttl: float, lost: Callable[[Claimed], None]
    ) -> None:
        self._pool = pool
        self._ttl = ttl
        self._tick = ttl / 6
        self._lost = lost
        self._leases: dict[tuple[int, str], _Lease] = {}  # by (step id, lease owner)
        self._task: asyncio.Task[None] | None = None
        self.statements = 0
        """Heartbeat statements sent so far (each renews every lease then due)."""
        self.errors = 0
        """Heartbeat statements that failed so far (sent again a tick later)."""
        self.renewed = 0
        """Lease renewals so far (a step counts once per statement that renewed it)."""

    @property
    def running(self) -> bool:
        """True while the ticker task exists (something is held)."""
        return self._task is not None

    def hold(self, steps: Iterable[Claimed]) -> None:
        """Steps just claimed: renew their leases from now on, the first TTL/3 from now.

        Starts the ticker if it is not running. A running ticker needs no wakeup: every
        lease it renews already falls due no later than these (each TTL/3 after a moment
        before now).
        """
        due = asyncio.get_running_loop().time() + self._ttl / 3
        for step in steps:
            self._leases[step.id, step.owner] = _Lease(step, due)
        if self._leases and self._task is None:
            self._task = asyncio.create_task(self._run(), name="cyclone-heartbeats")

    def drop(self, step: Claimed) -> None:
        """Stop renewing the lease of ``step`` (its outcome is written, or given back)."""
        self._leases.pop((step.id, step.owner), None)

    async def close(self) -> None:
        """Stop the ticker (at the end of a worker's stop)."""
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._leases:
                wait = min(lease.due for lease in self._leases.values()) - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue  # steps may have finished or been claimed meanwhile
                sent = loop.time()
                due = [lease for lease in self._leases.values() if lease.due <= sent + self._tick]
                if not await self._renew(due, sent):
                    await asyncio.sleep(self._tick)
        finally:
            self._task = None

    async def _renew(self, due: list[_Lease], sent: float) -> bool:
        """Renew ``due`` in one statement sent at loop time ``sent``; False when the
        statement failed (nothing is decided then)."""
        self.statements += 1
        stmt = heartbeat_stmt([lease.step for lease in due], ttl=self._ttl)
        try:
            async with self._pool.connection() as conn:
                rows = await fetch_async(conn, stmt)
        except Exception as exc:
            self.errors += 1
            log.warning(
                "heartbeat of %d steps failed, sent again in %.2f s: %s", len(due), self._tick, exc
            )
            return False
        renewed, busy = parse_heartbeat(rows)
        self.renewed += len(renewed)
        for lease in due:
            key = (lease.step.id, lease.step.owner)
            if self._leases.get(key) is not lease:
                continue  # dropped meanwhile: finished or given back
            if key in renewed:
                lease.due = sent + self._ttl / 3
            elif key in busy:
                lease.due = sent + self._tick
            else:
                del self._leases[key]
                self._lost(lease.step)
        return True
