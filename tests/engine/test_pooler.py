"""Behind a real PgBouncer in transaction mode (``pooler="transaction"``).

Consecutive transactions of one client connection land on different server
connections there (``default_pool_size = 3``), so nothing may outlive a transaction:
no session advisory lock, no startup option, no server-side prepared statement, no
LISTEN. Migrations from three processes at once, then jobs, a workflow with a fan-out
and a signal wait, a schedule, and two worker processes, all through the pooler.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import cyclone
from cyclone.migrate import available_migrations
from tests.apps.pooled import ITEMS, WORKFLOW
from tests.engine.test_timeouts import timed_out_sync_handler_loses_its_transaction
from tests.helpers import ROOT, kill, poll_until, scalar, start_worker, worker_log
from tests.pgbouncer import PgBouncer, available

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="no pgbouncer binary (apt pgbouncer)"),
]

Conn = psycopg.Connection[Any]


@pytest.fixture
def bouncer(admin_dsn: str) -> Iterator[PgBouncer]:
    pooler = PgBouncer(admin_dsn, pool_size=3)
    pooler.start()
    try:
        yield pooler
    finally:
        pooler.stop()


def _dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def _advisory_locks(conn: Conn) -> int:
    return int(
        scalar(
            conn,
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = current_database()",
        )
    )


def test_three_processes_migrate_through_the_pooler(bouncer: PgBouncer, empty_dsn: str) -> None:
    """Three ``cyclone migrate --pooler transaction`` at once: each exits 0, every
    version is applied once, and no advisory lock is left on any server connection."""
    pooled = bouncer.dsn(_dbname(empty_dsn))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cyclone",
                "migrate",
                "--dsn",
                pooled,
                "--pooler",
                "transaction",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for _ in range(3)
    ]
    outputs = [proc.communicate(timeout=120)[0].decode() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    newest = available_migrations()[-1].version
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM cyclone_schema_version")]
        assert sorted(versions) == list(range(1, newest + 1))
        assert _advisory_locks(conn) == 0
    # A later migration through the pooler finds nothing to do (and does not hang).
    assert cyclone.migrate(pooled, pooler="transaction") == []


def test_jobs_workflows_and_schedules_run_through_the_pooler(
    bouncer: PgBouncer, dsn: str, db: Conn
) -> None:
    """Two worker processes and a producer, every connection through PgBouncer in
    transaction mode: every job, workflow run (fan-out, signal wait) and fired
    schedule completes, each step's ledger row exists once, the workers log no error,
    and no advisory lock is left."""
    db.execute("CREATE TABLE ledger (run_id bigint, node text, UNIQUE (run_id, node))")
    pooled = bouncer.dsn(_dbname(dsn))
    env = {"CYCLONE_TEST_APP_DSN": pooled, "CYCLONE_POOLER": "transaction"}
    workers = [start_worker("tests.apps.pooled:client", env) for _ in range(2)]
    try:
        with cyclone.SyncClient(pooled, pooler="transaction", poll_interval=0.2) as producer:
            jobs = producer.enqueue_many("pooled_job", [{"n": n} for n in range(30)])
            jobs.append(producer.enqueue("pooled_job", {"n": "one"}))
            runs = [producer.submit(WORKFLOW, {"n": n}) for n in range(4)]
            for run in runs:
                assert producer.signal(run, "approve", {"by": "test"})
            producer.create_schedule("every-second", "pooled_job", {"fired": True}, "* * * * * *")
            finished = [producer.wait(job, timeout=120) for job in jobs + runs]
            assert {run.state for run in finished} == {cyclone.RunState.COMPLETED}
            assert finished[-1].result == [[i * 10 for i in range(ITEMS)], {"by": "test"}]

            def fired_and_done() -> bool:
                return bool(
                    scalar(
                        db,
                        "SELECT count(*) FROM cyclone_runs r JOIN cyclone_schedule_fires f "
                        "ON f.run_id = r.id WHERE r.state = 'completed'",
                    )
                    >= 2
                )

            poll_until(fired_and_done, timeout=60, what="two fired schedule runs completed")
            producer.disable_schedule("every-second")
        for proc in workers:
            assert proc.poll() is None, worker_log(proc)
            kill(proc, signal.SIGTERM)
            proc.wait(timeout=60)
        logs = [worker_log(proc) for proc in workers]
        assert [proc.returncode for proc in workers] == [0, 0], logs
        for log in logs:
            assert "Traceback" not in log and "prepared statement" not in log, log
        # every completed step wrote its ledger row, once (the table's UNIQUE holds it)
        completed_with_ledger = scalar(
            db,
            "SELECT count(*) FROM cyclone_steps s JOIN ledger l "
            "ON l.run_id = s.run_id AND l.node = s.node WHERE s.state = 'completed'",
        )
        handler_steps = scalar(
            db,
            "SELECT count(*) FROM cyclone_steps WHERE state = 'completed' "
            "AND kind NOT LIKE '@%' AND fan_out_parallel IS NULL",
        )
        assert completed_with_ledger == handler_steps == scalar(db, "SELECT count(*) FROM ledger")
        assert scalar(db, "SELECT count(*) FROM cyclone_steps WHERE state <> 'completed'") == 0
        assert _advisory_locks(db) == 0
    finally:
        for proc in workers:
            kill(proc)


async def test_a_named_schema_works_through_the_pooler(bouncer: PgBouncer, empty_dsn: str) -> None:
    """With ``schema="jobs"`` the tables go into that schema, and a worker and a producer
    find them in every transaction, though the pooler keeps no session setting; the
    handlers' own statements in their completion transactions (async and sync) see
    that schema too, as they do on a direct connection."""
    pooled = bouncer.dsn(_dbname(empty_dsn))
    await cyclone.migrate_async(pooled, schema="jobs", pooler="transaction")
    seen: list[str] = []

    @cyclone.step("pooled_double")
    async def double(ctx: cyclone.Context, inp: int) -> int:
        if inp == 0:
            tx = await ctx.completion_tx()
            row = await (await tx.execute("SHOW search_path")).fetchone()
            seen.append(row[0] if row else "")
        return inp * 2

    @cyclone.action("pooled_sync_path")
    def sync_path(ctx: cyclone.Context, inp: None) -> None:
        row = ctx.completion_tx().execute("SHOW search_path").fetchone()
        seen.append(row[0] if row else "")

    async with (
        cyclone.Client(
            pooled,
            handlers=[double, sync_path],
            schema="jobs",
            pooler="transaction",
            poll_interval=0.1,
        ) as worker,
        cyclone.Client(pooled, schema="jobs", pooler="transaction", poll_interval=0.1) as producer,
    ):
        assert not worker.listening  # no LISTEN through a transaction pooler
        jobs = [await producer.enqueue(double, n) for n in range(10)]
        results = [(await producer.wait(job, timeout=60)).result for job in jobs]
        assert results == [n * 2 for n in range(10)]
        await producer.wait(await producer.enqueue(sync_path), timeout=60)
    assert seen == ["jobs", "jobs"]
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        where = conn.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'cyclone_runs'"
        ).fetchall()
        assert where == [("jobs",)]


async def test_a_timed_out_sync_handler_loses_its_transaction_behind_the_pooler(
    bouncer: PgBouncer, dsn: str, db: Conn
) -> None:
    """The engine ends a hung sync handler's transaction through the pooler too (it asks
    the server for the backend's process id: the pooler reports its own)."""
    await timed_out_sync_handler_loses_its_transaction(
        bouncer.dsn(_dbname(dsn)), db, pooler="transaction"
    )


async def test_a_timed_out_sync_handler_loses_its_transaction_behind_a_session_pooler(
    admin_dsn: str, dsn: str, db: Conn
) -> None:
    """Behind PgBouncer in session mode (``options`` ignored, schema public) too: the
    process id the connection reports is PgBouncer's, so the engine asks the server."""
    session = PgBouncer(admin_dsn, pool_size=20, mode="session", ignore_options=True)
    session.start()
    try:
        await timed_out_sync_handler_loses_its_transaction(
            session.dsn(_dbname(dsn)), db, pooler="session"
        )
    finally:
        session.stop()


def test_cli_commands_take_the_pooler_option(bouncer: PgBouncer, dsn: str) -> None:
    """``--pooler transaction`` on an inspection command makes it work through the pooler
    (without it, PgBouncer refuses the engine's startup option)."""
    pooled = bouncer.dsn(_dbname(dsn))
    with cyclone.SyncClient(dsn) as direct:
        direct.enqueue("some_kind", {})

    def cyclone_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cyclone", *args, "--dsn", pooled],
            check=False,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = cyclone_cli("runs", "--json", "--pooler", "transaction")
    assert listed.returncode == 0, listed.stderr
    assert '"workflow": "some_kind"' in listed.stdout
    refused = cyclone_cli("runs", "--json")
    assert refused.returncode == 1
    assert "options" in refused.stderr
