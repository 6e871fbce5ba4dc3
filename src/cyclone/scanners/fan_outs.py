"""The fan-out part of a wait scanner pass: release, complete or discard reached
fan-out nodes.

A reached fan-out node's pending items are released up to ``max_parallel``; a node
whose items all completed completes with their outputs in item order (or is discarded
when they are over ``max_bytes``); a node without items is discarded when its input is
not a list or is longer than ``max_items``, and completes with ``[]`` for an empty
list. A pass reads per node a bounded number of index entries (``steps_fan_outs_state``:
the active items up to ``max_parallel``, whether any item is unfinished) and releases
with a LIMIT, so its cost does not grow with the node's item count; the upstream list
is read only for a node without items.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, fetch_async
from cyclone.graph import Completion, expand_stmt, parse_advanced
from cyclone.scanners.settle import Settlement, advance
from cyclone.sql import Q
from cyclone.sql.rows import FanOutRow
from cyclone.states import StepState
from cyclone.wakeups import Wakeups

__all__ = ["fan_outs", "refusal"]

PENDING = StepState.PENDING
"""The state of a reached fan-out node (its CAS, to complete or discard it)."""


def refusal(node: FanOutRow) -> tuple[str, str] | None:
    """Why a fan-out node without items is discarded, as ``(error_kind, error)``;
    ``None`` when its list is fine (empty, or not expanded yet)."""
    if node.over_type != "array":
        return "fan_out_input", (
            f"fan-out {node.node!r} needs a list from its upstream node, got {node.over_type}"
        )
    if node.fan_out_max_items and (node.over_length or 0) > node.fan_out_max_items:
        return "fan_out_too_large", (
            f"fan-out {node.node!r} got a list of {node.over_length} items, "
            f"over its max_items of {node.fan_out_max_items}"
        )
    return None


async def fan_outs(pool: AsyncConnectionPool[Any], batch: int) -> Settlement:
    """Release, complete or discard the reached fan-out nodes of up to ``batch`` runs,
    locked with ``SKIP LOCKED``, in one transaction."""
    done = Settlement()
    async with pool.connection() as conn, conn.transaction():
        runs = await fetch_async(conn, Stmt(Q.steps_fan_outs_lock, {"limit": batch}))
        if not runs:
            return done
        states = await fetch_async(
            conn, Stmt(Q.steps_fan_outs_state, {"run_ids": [run.id for run in runs]})
        )
        for node in states:
            if not node.expanded:
                refused = refusal(node)
                if refused is not None:
                    await done.discard(conn, node, PENDING, *refused)
                    continue
                if node.over_length:
                    # Not expanded yet: every completion that reaches a fan-out node
                    # expands it in its own transaction; one reached another way
                    # (nothing does today) is expanded here rather than left hanging.
                    expanded = await fetch_async(conn, expand_stmt([node.run_id]))
                    done.wakeups |= parse_advanced(expanded).wakeups
                    done.changed += 1
                    continue
            else:
                await _release(conn, node, done)
                if node.unfinished:
                    continue
            await _complete(conn, node, done)
    return done


async def _release(conn: Any, node: FanOutRow, done: Settlement) -> None:
    """Make pending items of ``node`` available, up to its ``max_parallel``."""
    parallel = node.fan_out_parallel
    room = None if parallel == 0 else parallel - node.active
    if room is not None and room <= 0:
        return
    params = {"run_id": node.run_id, "node": node.node, "count": room}
    released = await fetch_async(conn, Stmt(Q.steps_release_items, params))
    done.wakeups |= Wakeups.of_queues(item.queue for item in released)
    done.changed += 1 if released else 0


async def _complete(conn: Any, node: FanOutRow, done: Settlement) -> None:
    """Complete a fan-out node whose items all completed (or that has none, for an
    empty list) with their outputs, or discard it when they are over max_bytes."""
    output: str | None = "null"
    if node.fan_out_max_bytes is not None:
        params = {"run_id": node.run_id, "node": node.node}
        (collected,) = await fetch_async(conn, Stmt(Q.steps_fan_out_collect, params))
        output = collected.output or "null"
        size = len(output.encode())
        if node.fan_out_max_bytes and size > node.fan_out_max_bytes:
            error = (
                f"fan-out {node.node!r} collected {size} bytes of output, "
                f"over its max_bytes of {node.fan_out_max_bytes}"
            )
            await done.discard(conn, node, PENDING, "fan_out_too_large", error)
            return
    waiting = PENDING.value
    done.add(await advance(conn, [Completion(node.id, node.run_id, output, waiting=waiting)]))
