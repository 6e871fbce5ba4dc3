"""A static DAG workflow: data edges, an ordered fan-in, a result, submit-once.

Run it with ``python examples/workflow.py`` (the same database rules as
``examples/quickstart.py``). It submits the ``nightly`` workflow of docs/workflows.md
twice with one submit key and prints the run, its steps, and the duplicate.
"""

from __future__ import annotations

import asyncio
import uuid

from quickstart import own_database  # the sibling example

import cyclone
from cyclone.devserver import find_server


@cyclone.step("fetch")
async def fetch(ctx: cyclone.Context, inp: dict) -> dict:
    return {"rows": 120, "source": inp["source"]}


@cyclone.step("clean")
def clean(ctx: cyclone.Context, inp: dict) -> int:
    return inp["rows"] - 3


@cyclone.step("count")
async def count(ctx: cyclone.Context, inp: dict) -> int:
    return inp["rows"]


@cyclone.step("report")
async def report(ctx: cyclone.Context, inp: list) -> str:
    cleaned, counted = inp  # slot order: clean, then count
    return f"{cleaned} of {counted} rows kept"


wf = cyclone.Workflow("nightly")
f = wf.node("fetch", fetch)  # a root: its input is the run input
c = wf.node("clean", clean, input_from=f)  # data edge: input is fetch's output
n = wf.node("count", count, input_from=f)
r = wf.node("report", report, inputs=[c, n])  # fan-in: [clean's output, count's output]
wf.result(r)  # the run result


async def main() -> None:
    server = find_server()
    try:
        dsn = own_database(server.dsn, "cyclone_quickstart")
        cyclone.migrate(dsn)
        key = f"night-{uuid.uuid4().hex[:8]}"
        async with cyclone.Client(dsn, workflows=[wf], poll_interval=0.5) as client:
            sub = await client.submit(wf, {"source": "s3://bucket/day"}, submit_key=key)
            run = await client.wait(sub, timeout=60)
            print(f"run {run.id} of {run.workflow!r} (def_version {run.def_version}):")
            print(f"  {run.state.value}, result {run.result!r}")
            for step in await client.list_steps(sub):
                took = (step.completed_at - step.started_at).total_seconds() * 1000
                print(f"  {step.node:<7} {step.state.value:<10} {took:6.1f} ms  {step.output!r}")
            again = await client.submit(wf, {"source": "elsewhere"}, submit_key=key)
            print(
                f"submitted again with key {key!r}: run {again.run_id}, duplicate={again.duplicate}"
            )
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main())
