"""The schedule scanner: fires the due slots of cron schedules, each exactly once.

docs/design.md, Schedules and retention. Every started client runs one. A pass:

1. claims due schedules with ``FOR UPDATE SKIP LOCKED`` and takes a scanner lease on
   each (``schedules_claim``, idx_schedules_due), so scanners of any number of clients
   share the schedules and never wait for each other;
2. fires each claimed schedule in its own transaction: the run is inserted (an enqueue
   of the kind, or a submit of the pinned workflow definition), then one statement moves
   ``next_run_at`` forward (guarded on the lease and on the ``next_run_at`` the claim
   read) and inserts the ``cyclone_schedule_fires`` row, whose primary key would refuse
   a second fire of the slot. A guard that matches nothing rolls the fire back: another
   scanner (after the lease expired) or an update got there first.
3. A fire that fails records ``last_error``, counts ``consecutive_failures`` and backs
   off: no scanner claims the schedule for 2^failures seconds (at most ten minutes).

Which slot fires is :func:`cyclone.schedules.fire_plan`'s decision (catch-up policy).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, fetch_async, run_plan_async
from cyclone.observability.tracing import engine_span, traceparent_of_current
from cyclone.options import micros
from cyclone.scanners.loop import Scanner
from cyclone.schedules import SKIP_COUNT_LIMIT, CatchUp, FirePlan, fire_plan
from cyclone.sql import Q
from cyclone.sql.rows import ScheduleRow
from cyclone.submit import CompiledWorkflow, SubmitRequest, submit_plan
from cyclone.wakeups import Announcer, Wakeups

__all__ = ["FAILURE_CAP", "ScheduleScanResult", "ScheduleScanner"]

log = logging.getLogger("cyclone.schedules")

FAILURE_CAP = 600.0
"""Longest back-off, in seconds, of a schedule whose fires keep failing."""


class _LostSlot(Exception):
    """The fire's guard matched nothing: roll the fire back."""


@dataclass(frozen=True, slots=True)
class ScheduleScanResult:
    """What one pass did: slots fired, fires that failed, fires another got first."""

    fired: int = 0
    failed: int = 0
    lost: int = 0


class ScheduleScanner(Scanner):
    """Fires due schedules every ``interval`` seconds (with 10 % jitter).

    Args:
        pool: the engine pool (READ COMMITTED connections).
        publisher: announces the queues of fired runs after their commit.
        owner: this client's id, written as the scanner lease owner.
        interval: seconds between passes.
        definitions: the workflow definitions this client knows, by def_version; a
            workflow schedule is fired only by a client that knows its pinned version.
        catch_up: the policy for slots missed while no client ran.
        lease_ttl: seconds a claim holds a schedule against other scanners.
        batch: most schedules one claim takes.
    """

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        announcer: Announcer,
        *,
        owner: str,
        interval: float,
        definitions: Mapping[str, CompiledWorkflow],
        catch_up: CatchUp = "latest",
        lease_ttl: float = 30.0,
        batch: int = 50,
    ) -> None:
        super().__init__(pool, announcer, interval=interval, name="schedule scan", batch=batch)
        self._owner = owner
        self._definitions = definitions
        self.catch_up: CatchUp = catch_up
        self._lease_us = micros(lease_ttl)

    async def pass_once(self) -> bool:
        """One :meth:`scan_once`; True when it took a full batch (more may be due)."""
        result = await self.scan_once()
        return result.fired + result.failed + result.lost >= self._batch

    async def scan_once(self) -> ScheduleScanResult:
        """Claim the due schedules and fire one slot of each; returns what it did."""
        return await self.fire(await self.claim())

    async def claim(self) -> list[ScheduleRow]:
        """Take the scanner lease on due schedules this client can fire; their rows."""
        async with self._pool.connection() as conn:
            return await fetch_async(
                conn,
                Stmt(
                    Q.schedules_claim,
                    {
                        "owner": self._owner,
                        "ttl_us": self._lease_us,
                        "limit": self._batch,
                        "versions": list(self._definitions),
                    },
                ),
            )

    async def fire(self, claimed: list[ScheduleRow]) -> ScheduleScanResult:
        """Fire one slot of each claimed schedule, each in its own transaction."""
        fired = failed = lost = 0
        for row in claimed:
            try:
                queues = await self._fire(row)
            except _LostSlot:
                lost += 1
                continue
            except Exception as exc:
                failed += 1
                await self._record_failure(row.id, exc)
                continue
            fired += 1
            self._announcer.announce(Wakeups.of_queues(queues))
        return ScheduleScanResult(fired=fired, failed=failed, lost=lost)

    async def _fire(self, row: ScheduleRow) -> set[str]:
        """Fire one slot of a claimed schedule; the queues its run went to.

        Raises:
            _LostSlot: another scanner, an update or a disable came first, or the slot
                has a fire row already (passed over, not a failure).
        """
        # a long catch-up walk is CPU work: off the event loop
        plan = await asyncio.to_thread(
            fire_plan,
            row.cron_spec,
            row.location,
            row.next_run_at,
            row.now,
            self.catch_up,
        )
        if plan.skipped:
            log.info(
                "schedule %r: %s missed slot(s) before %s not fired (catch-up 'latest')",
                row.id,
                f"{plan.skipped}+" if plan.skipped >= SKIP_COUNT_LIMIT else plan.skipped,
                plan.slot.isoformat(),
            )
        try:
            run_id, queues = await self._insert_fire(row, plan)
        except psycopg.errors.UniqueViolation:
            # The slot has a fire row already (next_run_at was moved back by hand): it
            # fired once, so it is passed over rather than counted as a failure.
            await self._pass_over(row, plan)
            raise _LostSlot(row.id) from None
        log.info("schedule %r fired slot %s: run %d", row.id, plan.slot.isoformat(), run_id)
        return queues

    async def _insert_fire(self, row: ScheduleRow, plan: FirePlan) -> tuple[int, set[str]]:
        """The fire transaction: the run, then the guarded move and the fire row."""
        attributes = {"cyclone.schedule": row.id, "cyclone.workflow": row.kind}
        async with self._pool.connection() as conn, conn.transaction():
            with engine_span(f"cyclone.fire {row.id}", attributes) as span:
                # the fired run's steps are children of this span
                traceparent = traceparent_of_current()
                if row.def_version is None:
                    params = {**_enqueue_params(row), "traceparent": traceparent}
                    (enqueued,) = await fetch_async(conn, Stmt(Q.steps_enqueue, params))
                    run_id = enqueued.run_id
                    queues = {row.queue}
                else:
                    compiled = self._definitions[row.def_version]
                    request = SubmitRequest.build(compiled, json.loads(row.input))
                    request = request.traced(traceparent)
                    run_id = (await run_plan_async(conn, submit_plan(request))).run_id
                    queues = set(compiled.queues)
                if span is not None:
                    span.set_attribute("cyclone.run_id", run_id)
            done = await fetch_async(
                conn,
                Stmt(
                    Q.schedules_fired,
                    {
                        "id": row.id,
                        "owner": self._owner,
                        "due": row.next_run_at,
                        "slot": plan.slot,
                        "next_run_at": plan.next_run_at,
                        "run_id": run_id,
                    },
                ),
            )
            if not done:
                raise _LostSlot(row.id)
        return run_id, queues

    async def _pass_over(self, row: ScheduleRow, plan: FirePlan) -> None:
        async with self._pool.connection() as conn:
            moved = await fetch_async(
                conn,
                Stmt(
                    Q.schedules_pass_over,
                    {
                        "id": row.id,
                        "owner": self._owner,
                        "due": row.next_run_at,
                        "slot": plan.slot,
                        "next_run_at": plan.next_run_at,
                    },
                ),
            )
        if moved:
            log.warning("schedule %r: slot %s has fired before; passed over", row.id, plan.slot)

    async def _record_failure(self, schedule_id: str, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, psycopg.Error):
            error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
        async with self._pool.connection() as conn:
            rows = await fetch_async(
                conn,
                Stmt(
                    Q.schedules_failed,
                    {"id": schedule_id, "owner": self._owner, "error": error, "cap_s": FAILURE_CAP},
                ),
            )
        if rows:
            log.warning(
                "schedule %r failed to fire (%d in a row): %s",
                schedule_id,
                rows[0].consecutive_failures,
                error,
            )


def _enqueue_params(row: ScheduleRow) -> dict[str, Any]:
    """``steps_enqueue`` parameters for a kind schedule's fire (the row's options)."""
    return {
        "kind": row.kind,
        "queue": row.queue,
        "priority": row.priority,
        "max_attempts": row.max_attempts,
        "scheduled_at": None,
        "delay_us": 0,
        "timeout_us": micros(row.timeout_s),
        "unique_key": None,
        "sequence_key": None,
        "concurrency_key": None,
        "rate_key": None,
        "fairness_key": None,
        "retention_us": micros(row.retention_s),
        "input": row.input,
        "traceparent": None,
    }
