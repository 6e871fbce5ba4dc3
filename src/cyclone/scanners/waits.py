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
  item order (or is discarded when over ``max_bytes``, or when its input is not a list);
* reached child nodes (``waiting_child``) start their child run (a client that knows the
  parent's definition does it, in the transaction that holds the parent run's lock,
  so one child run per node); a child node whose child run finished completes with
  the child's result, or is discarded when the child failed or was cancelled.

A run that ends here (or whose child node's branch is cancelled) cancels its active child
runs in the same transaction (``runs_cancel_children``); as a backstop for runs left
active before that rule, child runs whose parent run ended or is gone are cancelled too.

The scanner runs every ``interval`` seconds, and at once when kicked (a worker saw a
signal wait reached).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, batch_async, fetch_async, int_array, run_plan_async
from cyclone.inputs import InputError, assemble, needed, parse_bindings
from cyclone.notify import Publisher
from cyclone.scanners.loop import Periodic
from cyclone.signals import settle_plan
from cyclone.sql import Q
from cyclone.submit import CompiledWorkflow, SubmitRequest, submit_plan
from cyclone.transitions import cancel_children_stmt, expand_stmt, parse_completed

__all__ = ["CHILD_MARK", "FAN_OUT_MARK", "MARKS", "WAIT_MARK", "ScanResult", "WaitScanner"]

log = logging.getLogger("cyclone.waits")

WAIT_MARK = "@signal"
"""What an advance reports among its woken queues when it reached a signal wait."""
FAN_OUT_MARK = "@fanout"
"""What an advance reports when it reached a fan-out node or finished an item task."""
CHILD_MARK = "@child"
"""What an advance reports when it reached a child node."""
MARKS = frozenset({WAIT_MARK, FAN_OUT_MARK, CHILD_MARK})
"""Markers among woken queues that ask the scanner for a pass (never real queues)."""


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What one pass did."""

    timers: int = 0
    timeouts: int = 0
    signalled: int = 0
    deadlines: int = 0
    fan_outs: int = 0
    children: int = 0


class WaitScanner(Periodic):
    """Completes timers and satisfied signal waits, times out waits, enforces deadlines."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        publisher: Publisher,
        *,
        interval: float,
        wake: Callable[[set[str]], None],
        definitions: Mapping[str, CompiledWorkflow] | None = None,
        batch: int = 200,
    ) -> None:
        super().__init__(interval, name="wait scan", jitter=False)
        self._definitions = definitions or {}
        self._pool = pool
        self._publisher = publisher
        self._wake = wake
        self._batch = batch

    async def pass_once(self) -> bool:
        """One :meth:`scan_once`."""
        await self.scan_once()
        return False

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

    def _announce(
        self, finished: set[int] | frozenset[int], woken: set[str] | frozenset[str]
    ) -> None:
        queues = set(woken)
        if queues & MARKS:
            queues -= MARKS
            self.kick()
        if queues:
            self._wake(queues)
        if finished:
            self._publisher.run_done(finished)

    async def _timers(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            due = await fetch_async(conn, Stmt(Q.steps_timers_due, {"limit": self._batch}))
            if not due:
                return 0
            items = ",".join(f'[{step_id},null,null,null,"waiting_timer"]' for step_id, _ in due)
            done = await fetch_async(conn, Stmt(Q.steps_complete_dag, {"dag_steps": f"[{items}]"}))
            expanded = await fetch_async(conn, expand_stmt({run_id for _, run_id in due}))
            completed, finished, woken = parse_completed([[], done, expanded])
            finished |= await self._end_children(conn, finished)
        self._announce(finished, woken)
        return len(completed)

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
        self._announce(finished, set())
        return count

    async def _signals(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            runs = await fetch_async(conn, Stmt(Q.signals_ready_runs, {"limit": self._batch}))
            if not runs:
                return 0
            settled = await run_plan_async(conn, settle_plan([row[0] for row in runs]))
        self._announce(settled.finished, settled.woken)
        return settled.completed

    async def _deadlines(self) -> int:
        async with self._pool.connection() as conn, conn.transaction():
            failed = await fetch_async(conn, Stmt(Q.runs_fail_deadline, {"limit": self._batch}))
            ended = {row[0] for row in failed}
            cancelled = await self._end_children(conn, ended)
        if failed:
            log.warning("runs %s failed: deadline passed", sorted(ended))
            self._announce(ended | cancelled, set())
        return len(failed)

    async def _fan_outs(self) -> int:
        changed = 0
        finished: set[int] = set()
        woken: set[str] = set()
        async with self._pool.connection() as conn, conn.transaction():
            runs = await fetch_async(conn, Stmt(Q.steps_fan_outs_lock, {"limit": self._batch}))
            if not runs:
                return 0
            states = await fetch_async(
                conn, Stmt(Q.steps_fan_outs_state, {"run_ids": [row[0] for row in runs]})
            )
            for (
                step_id,
                run_id,
                node,
                parallel,
                max_bytes,
                over_type,
                active,
                waiting,
                left,
            ) in states:
                if over_type != "array":
                    error = f"fan-out {node!r} needs a list from its upstream node, got {over_type}"
                    changed += await self._discard(
                        conn,
                        Stmt(
                            Q.steps_discard_fan_out,
                            {"id": step_id, "error": error, "error_kind": "fan_out_input"},
                        ),
                        step_id=step_id,
                        run_id=run_id,
                        finished=finished,
                    )
                    continue
                room = waiting if parallel == 0 else min(waiting, parallel - active)
                if room > 0:
                    rows = await fetch_async(
                        conn,
                        Stmt(
                            Q.steps_release_items, {"run_id": run_id, "node": node, "count": room}
                        ),
                    )
                    woken.update(row[0] for row in rows)
                    changed += 1
                if left:
                    continue
                output = "null"
                if max_bytes is not None:
                    ((output,),) = await fetch_async(
                        conn, Stmt(Q.steps_fan_out_collect, {"run_id": run_id, "node": node})
                    )
                    size = len(output.encode())
                    if max_bytes and size > max_bytes:
                        error = (
                            f"fan-out {node!r} collected {size} bytes of output, "
                            f"over its max_bytes of {max_bytes}"
                        )
                        changed += await self._discard(
                            conn,
                            Stmt(
                                Q.steps_discard_fan_out,
                                {"id": step_id, "error": error, "error_kind": "fan_out_too_large"},
                            ),
                            step_id=step_id,
                            run_id=run_id,
                            finished=finished,
                        )
                        continue
                item = f'[[{step_id},null,null,{output},"pending"]]'
                done = await fetch_async(conn, Stmt(Q.steps_complete_dag, {"dag_steps": item}))
                expanded = await fetch_async(conn, expand_stmt([run_id]))
                completed, ended, more = parse_completed([[], done, expanded])
                finished |= ended | await self._end_children(conn, ended)
                woken |= more
                changed += len(completed)
        self._announce(finished, woken)
        return changed

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
            conn, Stmt(Q.runs_resolve_discard, {"run_id": run_id, "step_id": step_id})
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
        woken: set[str] = set()
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
                woken |= child.queues
                changed += 1
        async with self._pool.connection() as conn, conn.transaction():
            done = await fetch_async(conn, Stmt(Q.steps_children_done, {"limit": self._batch}))
            for step_id, run_id, _node, needs_result, child_id, state, result, error in done:
                if state == "completed":
                    output = result if needs_result and result is not None else "null"
                    item = f'[[{step_id},null,null,{output},"waiting_child"]]'
                    rows = await fetch_async(conn, Stmt(Q.steps_complete_dag, {"dag_steps": item}))
                    expanded = await fetch_async(conn, expand_stmt([run_id]))
                    completed, ended, more = parse_completed([[], rows, expanded])
                    finished |= ended | await self._end_children(conn, ended)
                    woken |= more
                    changed += len(completed)
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
        self._announce(finished, woken)
        return changed
