"""The wait scanner: timers, signal waits, and run deadlines.

engine-design and schema-reference, the wait indexes; decisions.md, Waits. Every pass,
in its own short transactions, with ``FOR UPDATE SKIP LOCKED`` on the run rows (so the
scanners of any number of clients share the work and never block each other) and a CAS
on every step it changes:

* due timers (``waiting_timer`` past ``scheduled_at``, idx_steps_timer) complete, and
  their runs advance;
* signal waits past their timeout (idx_steps_signal_timeout) are discarded with
  ``error_kind = 'signal_timeout'`` and their runs resolved as for any discard;
* signal waits whose mailbox already holds their signals (sent before the wait was
  reached) complete with them;
* runs past ``deadline_at`` (idx_runs_deadline) fail, their active steps cancelled;
* reached fan-out nodes (idx_steps_fan_out): pending items are released up to
  ``max_parallel``; a node whose items all completed completes with their outputs in
  item order (or is discarded when over ``max_bytes``); a node without items is
  discarded when its input is not a list or is longer than ``max_items``, and completes
  with ``[]`` for an empty list. A pass costs per node a bounded number of index
  entries (up to ``max_parallel`` active items), whatever the node's item count;
* reached child nodes (``waiting_child``) start their child run (a client that knows the
  parent's definition does it, in the transaction that holds the parent run's lock,
  so one child run per node); a child node whose child run finished completes with
  the child's result, or is discarded when the child failed or was cancelled.

A run that ends here (or whose child node's branch is cancelled) cancels its active child
runs in the same transaction (``runs_cancel_children``); as a backstop for runs left
active before that rule, child runs whose parent run ended or is gone are cancelled too.

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, batch_async, fetch_async, int_array, run_plan_async
from cyclone.graph import (
    Advanced,
    Completion,
    advance_stmts,
    cancel_children_stmt,
    expand_stmt,
    parse_advanced,
)
from cyclone.inputs import InputError, assemble, needed, parse_bindings
from cyclone.scanners.loop import Periodic
from cyclone.signals import settle_plan
from cyclone.sql import Q
from cyclone.states import StepState
from cyclone.submit import CompiledWorkflow, SubmitRequest, submit_plan
from cyclone.wakeups import NO_WAKEUPS, Announcer, Wakeups

__all__ = ["ScanResult", "WaitScanner"]

log = logging.getLogger("cyclone.waits")


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one pass did."""

    timers: int = 0
    timeouts: int = 0
    signalled: int = 0
    deadlines: int = 0
    fan_outs: int = 0
    children: int = 0


@dataclass(frozen=True, slots=True)
class _FanOut:
    """One row of ``steps_fan_outs_state``: a reached fan-out node of a locked run.

    ``over_type`` and ``over_length`` (the upstream output's JSON type and list length)
    are read only for a node without items (``expanded`` false), else ``None``;
    ``active`` counts its available and running items up to ``parallel``.
    """

    id: int
    run_id: int
    node: str
    parallel: int
    max_bytes: int | None
    max_items: int | None
    expanded: bool
    over_type: str | None
    over_length: int | None
    active: int
    unfinished: bool

    def refusal(self) -> tuple[str, str] | None:
        """Why a node without items is discarded, as (error_kind, error); ``None`` when
        its list is fine (empty, or not expanded yet)."""
        if self.over_type != "array":
            return "fan_out_input", (
                f"fan-out {self.node!r} needs a list from its upstream node, got {self.over_type}"
            )
        if self.max_items and (self.over_length or 0) > self.max_items:
            return "fan_out_too_large", (
                f"fan-out {self.node!r} got a list of {self.over_length} items, "
                f"over its max_items of {self.max_items}"
            )
        return None


class WaitScanner(Periodic):
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
        super().__init__(interval, name="wait scan", jitter=False)
        self._full_due = True  # the first pass is a full one
        self._last_full = -math.inf
        self._definitions = definitions or {}
        self._pool = pool
        self._announcer = announcer
        self._batch = batch

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
        return ScanResult(fan_outs=await self._fan_outs())

    async def scan_once(self) -> ScanResult:
        """One pass of each kind of work; returns what it changed."""
        signalled = await self._signals()  # before timeouts: a satisfied wait completes
        return ScanResult(
            timers=await self._timers(),
            timeouts=await self._timeouts(),
            signalled=signalled,
            deadlines=await self._deadlines(),
            fan_outs=await self._fan_outs(),
            children=await self._children(),
        )

    def _announce(self, finished: Iterable[int], wakeups: Wakeups = NO_WAKEUPS) -> None:
        """After a pass's commit: its wakeups and the runs it finished."""
        self._announcer.announce(wakeups, finished)

    async def _advance(self, conn: Any, completions: Sequence[Completion]) -> Advanced:
        """Complete waits (or fan-out nodes) of locked runs and advance the runs, in
        the current transaction (:func:`cyclone.graph.advance_stmts`)."""
        rows = await batch_async(conn, advance_stmts(completions), transaction=False)
        return parse_advanced(rows)

    async def _timers(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            due = await fetch_async(conn, Stmt(Q.steps_timers_due, {"limit": self._batch}))
            if not due:
                return 0
            waiting = StepState.WAITING_TIMER.value
            advanced = await self._advance(
                conn, [Completion(step_id, run_id, waiting=waiting) for step_id, run_id in due]
            )
        self._announce(advanced.finished, advanced.wakeups)
        return len(advanced.done)

    async def _timeouts(self) -> int:
        count = 0
        finished: set[int] = set()
        async with self._pool.connection() as conn, conn.transaction():
            due = await fetch_async(conn, Stmt(Q.steps_signal_timeouts_due, {"limit": self._batch}))
            for step_id, run_id, node, wait_for in due:
                error = f"signal wait {node!r} timed out after {wait_for:g} s"
                count += await self._discard(
                    conn,
                    Stmt(Q.steps_discard_wait, {"id": step_id, "error": error}),
                    step_id=step_id,
                    run_id=run_id,
                    finished=finished,
                )
        self._announce(finished)
        return count

    async def _signals(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            runs = await fetch_async(conn, Stmt(Q.signals_ready_runs, {"limit": self._batch}))
            if not runs:
                return 0
            settled = await run_plan_async(conn, settle_plan([row[0] for row in runs]))
        self._announce(settled.finished, settled.wakeups)
        return settled.completed

    async def _deadlines(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            failed = await fetch_async(conn, Stmt(Q.runs_fail_deadline, {"limit": self._batch}))
            ended = {row[0] for row in failed}
            cancelled = await self._end_children(conn, ended)
        if failed:
            log.warning("runs %s failed: deadline passed", sorted(ended))
            self._announce(ended | cancelled)
        return len(failed)

    async def _fan_outs(self) -> int:
        """Release, complete or discard the reached fan-out nodes of locked runs.

        A pass reads per node a bounded number of index entries (steps_fan_outs_state:
        the active items up to max_parallel, whether any item is unfinished) and
        releases with a LIMIT, so its cost does not grow with the node's item count;
        the upstream list is read only for a node without items.
        """
        changed = 0
        finished: set[int] = set()
        wakeups = NO_WAKEUPS
        async with self._pool.connection() as conn, conn.transaction():
            runs = await fetch_async(conn, Stmt(Q.steps_fan_outs_lock, {"limit": self._batch}))
            if not runs:
                return 0
            states = await fetch_async(
                conn, Stmt(Q.steps_fan_outs_state, {"run_ids": [row[0] for row in runs]})
            )
            for row in states:
                node = _FanOut(*row)
                if not node.expanded:
                    refused = node.refusal()
                    if refused is not None:
                        error_kind, error = refused
                        changed += await self._discard(
                            conn,
                            Stmt(
                                Q.steps_discard_fan_out,
                                {"id": node.id, "error": error, "error_kind": error_kind},
                            ),
                            step_id=node.id,
                            run_id=node.run_id,
                            finished=finished,
                        )
                        continue
                    if node.over_length:
                        # Not expanded yet: every completion that reaches a fan-out node
                        # expands it in its own transaction; one reached another way
                        # (nothing does today) is expanded here rather than left hanging.
                        rows = await fetch_async(conn, expand_stmt([node.run_id]))
                        wakeups |= parse_advanced([rows]).wakeups
                        changed += 1
                        continue
                else:
                    room = None if node.parallel == 0 else node.parallel - node.active
                    if room is None or room > 0:
                        rows = await fetch_async(
                            conn,
                            Stmt(
                                Q.steps_release_items,
                                {"run_id": node.run_id, "node": node.node, "count": room},
                            ),
                        )
                        wakeups |= Wakeups.of_queues(r[0] for r in rows)
                        changed += 1 if rows else 0
                    if node.unfinished:
                        continue
                done = await self._complete_fan_out(conn, node, finished)
                changed += len(done.done)
                wakeups |= done.wakeups
        self._announce(finished, wakeups)
        return changed

    async def _complete_fan_out(self, conn: Any, node: _FanOut, finished: set[int]) -> Advanced:
        """Complete a fan-out node whose items all completed (or that has none, for an
        empty list) with their outputs, or discard it when they are over max_bytes
        (nothing advanced then; a run it ended is added to ``finished``)."""
        output = "null"
        if node.max_bytes is not None:
            ((output,),) = await fetch_async(
                conn, Stmt(Q.steps_fan_out_collect, {"run_id": node.run_id, "node": node.node})
            )
            size = len(output.encode())
            if node.max_bytes and size > node.max_bytes:
                error = (
                    f"fan-out {node.node!r} collected {size} bytes of output, "
                    f"over its max_bytes of {node.max_bytes}"
                )
                discarded = await self._discard(
                    conn,
                    Stmt(
                        Q.steps_discard_fan_out,
                        {"id": node.id, "error": error, "error_kind": "fan_out_too_large"},
                    ),
                    step_id=node.id,
                    run_id=node.run_id,
                    finished=finished,
                )
                return Advanced(done=frozenset({node.id} if discarded else ()))
        waiting = StepState.PENDING.value
        advanced = await self._advance(
            conn, [Completion(node.id, node.run_id, output, waiting=waiting)]
        )
        finished |= advanced.finished
        return advanced

    async def _discard(
        self, conn: Any, discard: Stmt, *, step_id: int, run_id: int, finished: set[int]
    ) -> int:
        """Run one CAS ``discard`` of a step, then resolve its run; 1 if it discarded."""
        if not await fetch_async(conn, discard):
            return 0
        log.warning(
            "step %d of run %d discarded: %s", step_id, run_id, (discard.params or {})["error"]
        )
        outcome = await fetch_async(
            conn, Stmt(Q.graph_resolve_discard, {"run_id": run_id, "step_id": step_id})
        )
        if outcome and (outcome[0][0] or outcome[0][1]):
            finished.add(run_id)
        if outcome and any(outcome[0]):  # the run, or a branch (a child node's), ended
            finished |= await self._end_children(conn, [run_id])
        return 1

    async def _end_children(self, conn: Any, run_ids: Iterable[int]) -> set[int]:
        """Cancel the active child runs of ``run_ids`` (locked in this transaction) whose
        parent run or child node ended; the ids of the runs cancelled."""
        ids = set(run_ids)
        if not ids:
            return set()
        rows = await fetch_async(conn, cancel_children_stmt(ids))
        if rows:
            log.info("child runs %s cancelled: their parent ended", [row[1] for row in rows])
        return {row[1] for row in rows}

    async def _children(self) -> int:
        changed = 0
        finished: set[int] = set()
        wakeups = NO_WAKEUPS
        async with self._pool.connection() as conn, conn.transaction():
            rows = await fetch_async(conn, Stmt(Q.steps_children_to_start, {"limit": self._batch}))
            for step_id, run_id, node, def_version, stored, input_from, raw in rows:
                parent = self._definitions.get(def_version)
                child = parent.children.get(node) if parent is not None else None
                if child is None:
                    continue  # a client that has the parent's definition starts it
                bindings = parse_bindings(raw)
                value = stored
                if input_from is not None or bindings:
                    keys = needed(run_id, input_from, bindings)
                    params = {"run_ids": [k[0] for k in keys], "nodes": [k[1] for k in keys]}
                    found = await fetch_async(conn, Stmt(Q.steps_outputs, params))
                    try:
                        value = assemble(
                            run_id, input_from, bindings, {(r, n): t for r, n, t in found}
                        )
                    except InputError as exc:
                        changed += await self._discard(
                            conn,
                            Stmt(Q.steps_discard_child, {"id": step_id, "error": str(exc)}),
                            step_id=step_id,
                            run_id=run_id,
                            finished=finished,
                        )
                        continue
                request = SubmitRequest.build(child, value, parent=(run_id, node))
                sub = await run_plan_async(conn, submit_plan(request))
                log.info("run %d node %r started child run %d", run_id, node, sub.run_id)
                wakeups |= Wakeups.of_queues(child.queues)
                changed += 1
        async with self._pool.connection() as conn, conn.transaction():
            done = await fetch_async(conn, Stmt(Q.steps_children_done, {"limit": self._batch}))
            for step_id, run_id, _node, needs_result, child_id, state, result, error in done:
                if state == "completed":
                    output = result if needs_result and result is not None else None
                    waiting = StepState.WAITING_CHILD.value
                    advanced = await self._advance(
                        conn, [Completion(step_id, run_id, output, waiting=waiting)]
                    )
                    finished |= advanced.finished
                    wakeups |= advanced.wakeups
                    changed += len(advanced.done)
                else:
                    why = f"child run {child_id} {state}" + (f": {error}" if error else "")
                    changed += await self._discard(
                        conn,
                        Stmt(Q.steps_discard_child, {"id": step_id, "error": why}),
                        step_id=step_id,
                        run_id=run_id,
                        finished=finished,
                    )
        async with self._pool.connection() as conn:
            orphaned = await fetch_async(
                conn, Stmt(Q.steps_orphaned_children, {"limit": self._batch})
            )
            for (parent_id,) in orphaned:  # each parent locked, then rechecked
                lock = Stmt(Q.runs_lock, {"run_ids": int_array([parent_id])})
                outcome = await batch_async(
                    conn, [lock, cancel_children_stmt([parent_id])], transaction=True
                )
                if outcome[-1]:
                    cancelled = [row[1] for row in outcome[-1]]
                    log.info("child runs %s cancelled: their parent ended", cancelled)
                    finished.update(cancelled)
                    changed += len(cancelled)
        self._announce(finished, wakeups)
        return changed
