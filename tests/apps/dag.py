"""A worker app for the random-DAG test, configured by environment variables.

``CYCLONE_TEST_APP_DSN``: the database. ``CYCLONE_TEST_DAG``: the workflow as JSON,
``{"name": ..., "parents": [[...], ...], "order": [...], "control": [...]}`` (see
:func:`build`).

Kind ``dag_record``: in its completion transaction, appends ``(run_id, node, input,
parents not completed)`` to ``dag_log``, whose primary key ``(run_id, node)`` makes a
second committed execution of a node fail loudly; returns the node id.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

import cyclone


@cyclone.step("dag_record")
async def dag_record(ctx: cyclone.Context, inp: Any) -> str:
    tx = await ctx.completion_tx()
    await tx.execute(
        """
        INSERT INTO dag_log (run_id, node, input, waiting_parents)
        SELECT %(run)s, %(node)s, %(input)s, count(*)
        FROM cyclone_deps d
        JOIN cyclone_steps p ON p.run_id = d.run_id AND p.node = d.dep_node
        WHERE d.run_id = %(run)s AND d.node = %(node)s AND p.state <> 'completed'
        """,
        {"run": ctx.run_id, "node": ctx.node, "input": Jsonb(inp)},
    )
    return ctx.node


def node_id(i: int) -> str:
    return f"n{i:03d}"


def build(
    name: str, parents: Sequence[Sequence[int]], order: Sequence[int], control: Sequence[int]
) -> cyclone.Workflow:
    """Node ``i`` depends on ``parents[i]``: by ``after=`` when ``i`` is in ``control``
    (its input is then the run input), else by ``inputs=`` (a tuple of the parents'
    outputs). Nodes are declared in ``order``, so forward references are common."""
    wf = cyclone.Workflow(name)
    controlled = set(control)
    for i in order:
        deps = [node_id(p) for p in parents[i]]
        if not deps:
            wf.node(node_id(i), dag_record)
        elif i in controlled:
            wf.node(node_id(i), dag_record, after=deps)
        else:
            wf.node(node_id(i), dag_record, inputs=deps)
    return wf


if "CYCLONE_TEST_DAG" in os.environ:
    _spec = json.loads(os.environ["CYCLONE_TEST_DAG"])
    client = cyclone.Client(
        os.environ["CYCLONE_TEST_APP_DSN"],
        workflows=[build(_spec["name"], _spec["parents"], _spec["order"], _spec["control"])],
        queues={"default": 8},
        lease_ttl=10,
        poll_interval=0.05,
        claim_batch=8,
    )
