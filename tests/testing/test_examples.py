"""The examples of ``examples/``, tested with the helpers of cyclone.testing: their
steps run inline (no worker), time moves by advance_time, and each test has a
migrated database of its own (the plugin's ``cyclone_dsn`` and ``cyclone_client``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import cyclone
from cyclone.states import RunState, StepState
from cyclone.testing import advance_time, assert_enqueued, drain, run_inline
from tests.helpers import ROOT, scalar


def _load_examples() -> tuple[Any, Any]:
    """The modules of examples/quickstart.py and examples/workflow.py (which imports its
    sibling ``quickstart``), loaded from their files and kept out of ``sys.modules``."""
    loaded = []
    try:
        for name in ("quickstart", "workflow"):
            spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            loaded.append(module)
    finally:
        sys.modules.pop("quickstart", None)
        sys.modules.pop("workflow", None)
    return loaded[0], loaded[1]


quickstart, nightly = _load_examples()


@pytest.fixture
def cyclone_handlers() -> list[cyclone.Handler]:
    return [quickstart.greet, quickstart.charge, quickstart.flaky]


@pytest.fixture
def cyclone_workflows() -> list[cyclone.Workflow]:
    return [nightly.wf]


@pytest.fixture
def payments(cyclone_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """The quickstart's payments table, and a connection to read it."""
    with psycopg.connect(cyclone_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (run_id bigint PRIMARY KEY, amount int)")
        yield conn


async def test_quickstart_greets_charges_once_and_retries_the_flaky_step(
    cyclone_client: cyclone.Client, payments: psycopg.Connection[Any]
) -> None:
    client = cyclone_client
    greet = await client.enqueue(quickstart.greet, {"name": "Cyclone"})
    charge = await client.enqueue(quickstart.charge, {"amount": 42})
    flaky = await client.enqueue(quickstart.flaky, None)
    await assert_enqueued(client, quickstart.charge, input={"amount": 42}, queue="default")

    assert await drain(client) >= 3  # greet, charge, and the flaky step's first attempt
    assert (await client.get_run(greet)).result == "hello, Cyclone"
    assert (await client.get_run(charge)).state is RunState.COMPLETED
    assert scalar(payments, "SELECT amount FROM payments WHERE run_id = %s", (charge.run_id,)) == 42

    # The flaky step fails its first two attempts; each retry waits for its backoff.
    for _ in range(3):
        if (await client.get_run(flaky)).state is not RunState.RUNNING:
            break
        await advance_time(client, 60)
        await drain(client)
    run = await client.get_run(flaky)
    assert (run.state, run.result) == (RunState.COMPLETED, "succeeded after 2 failed attempts")
    (step,) = await client.list_steps(flaky)
    assert (step.state, step.attempt) == (StepState.COMPLETED, 2)
    assert scalar(payments, "SELECT count(*) FROM payments") == 1


async def test_nightly_workflow_runs_its_dag_and_a_second_submit_is_a_duplicate(
    cyclone_client: cyclone.Client,
) -> None:
    client = cyclone_client
    sub = await client.submit(nightly.wf, {"source": "s3://bucket/day"}, submit_key="night-1")
    await assert_enqueued(client, nightly.fetch, input={"source": "s3://bucket/day"})
    assert await drain(client) == 4  # fetch, then clean and count, then report
    run = await client.get_run(sub)
    assert (run.state, run.result) == (RunState.COMPLETED, "117 of 120 rows kept")
    outputs = {step.node: step.output for step in await client.list_steps(sub)}
    assert outputs == {
        "fetch": {"rows": 120, "source": "s3://bucket/day"},
        "clean": 117,
        "count": 120,
        "report": "117 of 120 rows kept",
    }
    again = await client.submit(nightly.wf, {"source": "elsewhere"}, submit_key="night-1")
    assert (again.run_id, again.duplicate) == (sub.run_id, True)
    assert await drain(client) == 0


def test_nightly_workflow_runs_inline(cyclone_dsn: str) -> None:
    run = run_inline(nightly.wf, {"source": "s3://bucket/day"}, dsn=cyclone_dsn)
    assert (run.state, run.result) == (RunState.COMPLETED, "117 of 120 rows kept")
