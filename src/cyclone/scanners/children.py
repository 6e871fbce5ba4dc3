"""The child-run part of a wait scanner pass.

A reached child node (``waiting_child``) starts its child run: a client that knows the
parent's definition does it, in the transaction that holds the parent run's lock, so
there is one child run per node. A child node whose child run finished completes with
the child's result, or is discarded when the child failed or was cancelled. As a
backstop for runs left active before child runs were cancelled with their parents,
child runs whose parent run ended or is gone are cancelled too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, batch_async, fetch_async, int_array, run_plan_async
from cyclone.graph import Completion, cancel_children_stmt, parse_advanced
from cyclone.inputs import InputError, assemble, bindings_of, needed
from cyclone.scanners.settle import Settlement, advance
from cyclone.sql import Q
from cyclone.sql.rows import ChildStartRow
from cyclone.states import StepState
from cyclone.submit import CompiledWorkflow, SubmitRequest, submit_plan
from cyclone.wakeups import Wakeups

__all__ = ["children"]

log = logging.getLogger("cyclone.waits")


async def children(
    pool: AsyncConnectionPool[Any], batch: int, definitions: Mapping[str, CompiledWorkflow]
) -> Settlement:
    """Start the child runs of reached child nodes (those whose parent definition is in
    ``definitions``), settle the child nodes whose child run ended, and cancel orphaned
    child runs; each in a transaction of its own."""
    done = Settlement()
    async with pool.connection() as conn, conn.transaction():
        nodes = await fetch_async(conn, Stmt(Q.steps_children_to_start, {"limit": batch}))
        for node in nodes:
            parent = definitions.get(node.def_version)
            child = parent.children.get(node.node) if parent is not None else None
            if child is not None:  # else a client that has the parent's definition does
                await _start(conn, node, child, done)
    async with pool.connection() as conn, conn.transaction():
        ended = await fetch_async(conn, Stmt(Q.steps_children_done, {"limit": batch}))
        for end in ended:
            if end.state == "completed":
                output = end.result if end.child_needs_result else None
                waiting = StepState.WAITING_CHILD.value
                done.add(
                    await advance(conn, [Completion(end.id, end.run_id, output, waiting=waiting)])
                )
            else:
                why = f"child run {end.child_id} {end.state}"
                why += f": {end.error}" if end.error else ""
                await done.discard(conn, end, StepState.WAITING_CHILD, "child_failed", why)
    async with pool.connection() as conn:
        orphaned = await fetch_async(conn, Stmt(Q.steps_orphaned_children, {"limit": batch}))
        for row in orphaned:  # each parent locked, then rechecked
            lock = Stmt(Q.runs_lock, {"run_ids": int_array([row.parent_run_id])})
            stmts: list[Stmt[Any]] = [lock, cancel_children_stmt([row.parent_run_id])]
            results = await batch_async(conn, stmts, transaction=True)
            cancelled = parse_advanced(results).finished
            if cancelled:
                log.info("child runs %s cancelled: their parent ended", sorted(cancelled))
                done.finished |= cancelled
                done.changed += len(cancelled)
    return done


async def _start(conn: Any, node: ChildStartRow, child: CompiledWorkflow, done: Settlement) -> None:
    """Submit the child run of ``node`` with its input (the node's own, or assembled
    from upstream outputs); discard the node when that input cannot be built."""
    bindings = bindings_of(node.binding_nodes, node.binding_modes)
    value = node.input
    if node.input_from is not None or bindings:
        keys = needed(node.run_id, node.input_from, bindings)
        params = {"run_ids": [k[0] for k in keys], "nodes": [k[1] for k in keys]}
        found = await fetch_async(conn, Stmt(Q.steps_outputs, params))
        outputs = {(row.run_id, row.node): row.output for row in found}
        try:
            value = assemble(node.run_id, node.input_from, bindings, outputs, node.binding_names)
        except InputError as exc:
            await done.discard(conn, node, StepState.WAITING_CHILD, "child_failed", str(exc))
            return
    request = SubmitRequest.build(child, value, parent=(node.run_id, node.node))
    request = request.traced(node.traceparent)  # the child run joins its parent's trace
    sub = await run_plan_async(conn, submit_plan(request))
    log.info(
        "run %d step %d (node %s): started child run %d",
        node.run_id,
        node.id,
        node.node,
        sub.run_id,
        extra={"run_id": node.run_id, "step_id": node.id, "node": node.node},
    )
    done.wakeups |= Wakeups.of_queues(child.queues)
    done.changed += 1
