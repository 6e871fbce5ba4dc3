"""Network and server faults between worker hosts and the database.

Each test runs PostgreSQL of its own (:mod:`tests.throwaway`) inside a "database host"
network namespace and two worker processes on worker hosts of their own
(:mod:`tests.netns`), each joined to the database host by its own veth pair. Cyclone
connects as a role without superuser rights; the test process reaches the server
through its Unix socket. The server runs with the settings docs/operations.md names for
network faults (``SERVER_SETTINGS``); the workers with ``lease_ttl=2`` and
``tcp_user_timeout=1`` (tests/apps/netfault.py).

* a link cut longer than the lease TTL, then restored: the other host reclaims, the
  cut-off worker's late business writes roll back, it recovers without a restart;
* every Cyclone backend terminated every second for 20 s;
* the server's connections taken by another role for 30 s.

Afterwards every run completes, every ledger row exists exactly once, no worker exited.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import cyclone
from tests import netns
from tests.apps.netfault import ITEMS, LEDGER, job, plain, workflow
from tests.helpers import kill, poll_until, start_worker, worker_log
from tests.netns import Hosts, Link
from tests.throwaway import ThrowawayServer, available

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.slow,
    pytest.mark.skipif(not available(), reason="no initdb/pg_ctl to make a throwaway server"),
    pytest.mark.skipif(
        not netns.available(), reason="network namespaces need root, `ip` and `sysctl`"
    ),
]

APP = "tests.apps.netfault:client"
ROLE = "cyclone_app"
HOG = "hog"
SERVER_SETTINGS = {
    "max_connections": "40",
    # An unreachable client's backend goes within seconds, and with it its locks.
    "tcp_keepalives_idle": "1",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "2",
    "tcp_user_timeout": "2000",
    "idle_in_transaction_session_timeout": "5000",
    "log_line_prefix": "%u:",
}
STEPS_PER_RUN = 3 + ITEMS  # start, sum, end and the items; the fan-out node writes none
LEDGERED = "s.kind IN ('nf_start', 'nf_item', 'nf_node', 'nf_job') AND s.node <> 'split'"


@dataclass
class Net:
    """The hosts, the server and the worker processes of one test."""

    hosts: Hosts
    server: ThrowawayServer
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def dsn(self, user: str, host: str | None = None) -> str:
        where = host if host is not None else str(self.server.root)
        return f"host={where} port={self.server.port} user={user} dbname=app"

    @property
    def admin(self) -> str:
        """The superuser, through the Unix socket (it may use the reserved slots)."""
        return self.dsn("postgres")

    @property
    def app(self) -> str:
        """Cyclone's role, through the Unix socket (the producer's DSN)."""
        return self.dsn(ROLE)

    def start(self, link: Link, **env: str) -> subprocess.Popen[bytes]:
        proc = start_worker(
            APP,
            {
                "CYCLONE_TEST_APP_DSN": self.dsn(ROLE, link.db_addr),
                "CYCLONE_TEST_HOST": link.netns,
                **env,
            },
            log_level="INFO",
            netns=link.netns,
        )
        self.workers.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- worker {w.pid}\n{worker_log(w)[-4000:]}" for w in self.workers)


@pytest.fixture
def net() -> Iterator[Net]:
    with netns.hosts(2) as hosts:
        server = ThrowawayServer(
            netns=hosts.db_netns,
            listen=hosts.db_addrs,
            hba=["host all all 127.42.0.0/16 trust"],
            settings=SERVER_SETTINGS,
        )
        made = Net(hosts, server)
        try:
            server.start()
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                conn.execute(f"CREATE ROLE {ROLE} LOGIN")
                conn.execute(f"CREATE ROLE {HOG} LOGIN")
                conn.execute(f"CREATE DATABASE app OWNER {ROLE}")
            cyclone.migrate(made.app)
            with psycopg.connect(made.app, autocommit=True) as conn:
                conn.execute(LEDGER)
            yield made
        finally:
            for proc in made.workers:
                kill(proc)
            server.stop()


def _one(dsn: str, query: str, params: Any = None) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def _owner(proc: subprocess.Popen[bytes]) -> str:
    """A LIKE pattern matching the lease owners of the worker process ``proc``."""
    return f"%:{proc.pid}:%"


def _submit(net: Net, runs: int, jobs: int = 0) -> list[int]:
    wf = workflow()
    with cyclone.SyncClient(net.app, workflows=[wf], handlers=[job, plain]) as producer:
        ids = [producer.submit(wf, {"n": i}).run_id for i in range(runs)]
        for i in range(jobs):
            ids.append(producer.enqueue(job, {"j": i}).run_id)
            ids.append(producer.enqueue(plain, {"j": i}).run_id)
    return ids


def _unfinished(net: Net, run_ids: list[int]) -> int:
    return int(
        _one(
            net.admin,
            "SELECT count(*) FROM cyclone_runs WHERE id = ANY(%s)"
            " AND state NOT IN ('completed', 'failed', 'cancelled')",
            (run_ids,),
        )
    )


def _wait_finished(net: Net, run_ids: list[int], what: str) -> None:
    poll_until(
        lambda: _unfinished(net, run_ids) == 0,
        timeout=120,
        interval=0.25,
        what=f"every run to finish {what}\n{net.logs()}",
    )


def _assert_exactly_once(net: Net, run_ids: list[int], runs: int, jobs: int) -> None:
    """Every run completed, each ledgered step has exactly one ledger row, none else."""
    with psycopg.connect(net.admin) as conn:
        states: dict[str, int] = dict(
            conn.execute(
                "SELECT state, count(*) FROM cyclone_runs WHERE id = ANY(%s) GROUP BY 1",
                (run_ids,),
            ).fetchall()
        )
        assert states == {"completed": len(run_ids)}, (states, net.logs())
        per_step = conn.execute(
            "SELECT s.run_id, s.node, count(l.*) FROM cyclone_steps s"
            " LEFT JOIN ledger l ON l.run_id = s.run_id AND l.node = s.node"
            f" WHERE s.run_id = ANY(%s) AND {LEDGERED} GROUP BY s.run_id, s.node",
            (run_ids,),
        ).fetchall()
        expected = runs * STEPS_PER_RUN + jobs
        assert len(per_step) == expected
        assert {n for _, _, n in per_step} == {1}, [r for r in per_step if r[2] != 1][:10]
        assert conn.execute(
            "SELECT count(*) FROM ledger WHERE run_id = ANY(%s)", (run_ids,)
        ).fetchone() == (expected,)


def _assert_alive(net: Net) -> None:
    exited = [(w.pid, w.returncode) for w in net.workers if w.poll() is not None]
    assert not exited, (exited, net.logs())


def _backends(net: Net, where: str, params: Any = None) -> int:
    return int(_one(net.admin, f"SELECT count(*) FROM pg_stat_activity WHERE {where}", params))


def _wait_listening(net: Net, workers: int) -> None:
    poll_until(
        lambda: _backends(net, "application_name = 'cyclone-listen'") == workers,
        timeout=60,
        what=f"the workers to listen\n{net.logs()}",
    )


def test_link_cut_longer_than_the_lease_is_fenced_and_recovered(net: Net, tmp_path: Path) -> None:
    near, far = net.hosts.links
    gate = tmp_path / "gate"
    gate.touch()  # the far host's items stop before their business write
    other = net.start(near)
    cut_off = net.start(far, CYCLONE_TEST_GATE=str(gate))
    _wait_listening(net, 2)
    runs = 6
    first = _submit(net, runs)

    # The far host holds items at the gate (all its slots); then its link goes down.
    def held_at_gate() -> list[int]:
        rows = _one(
            net.admin,
            "SELECT array_agg(id) FROM cyclone_steps WHERE state = 'running'"
            " AND kind = 'nf_item' AND lease_owner LIKE %s",
            (_owner(cut_off),),
        )
        return list(rows) if rows is not None and len(rows) >= 4 else []

    held = poll_until(held_at_gate, timeout=60, what=f"items held by the far host\n{net.logs()}")
    net.hosts.cut(far)
    # The near host's sweep reclaims them once their leases expire, and runs them.
    poll_until(
        lambda: _one(
            net.admin,
            "SELECT bool_and(reclaims > 0 AND (state = 'completed'"
            " OR lease_owner LIKE %s)) FROM cyclone_steps WHERE id = ANY(%s)",
            (_owner(other), held),
        ),
        timeout=60,
        what=f"the near host to reclaim the far host's steps\n{net.logs()}",
    )
    # The server's keepalives end every backend of the cut-off host (and its locks),
    # and its kernel forgets their sockets and drops what it still had queued for the
    # far host: nothing will tell the far host that its idle connections (its LISTEN,
    # those resting in its pools) are dead; only its own keepalives find out.
    poll_until(
        lambda: (
            _backends(net, "client_addr = %s", (far.worker_addr,)) == 0
            and far.worker_addr not in net.hosts.tcp_peers(net.hosts.db_netns)
            and not net.hosts.unresolved(net.hosts.db_netns, far.worker_addr)
        ),
        timeout=60,
        what="the server to drop the far host's connections",
    )
    mark = _one(net.admin, "SELECT coalesce(max(id), 0) FROM ledger")
    net.hosts.restore(far)
    gate.unlink()  # the held items now make their (late) business writes

    # The cut-off worker recovers without a restart: its listener comes back (only its
    # keepalives tell it that the old one is dead), and it completes new work.
    poll_until(
        lambda: (
            _backends(
                net,
                "application_name = 'cyclone-listen' AND client_addr = %s",
                (far.worker_addr,),
            )
            == 1
        ),
        timeout=60,
        what=f"the far host's listener to reconnect\n{net.logs()}",
    )
    # Then the near host stops (gracefully): the new runs can only be done by the far
    # host, with the pools and listener it has now.
    _assert_alive(net)
    kill(other, signal.SIGTERM)
    assert other.wait(timeout=60) == 0, net.logs()
    second = _submit(net, runs)
    _wait_finished(net, first + second, "after the link came back")
    assert _one(
        net.admin, "SELECT count(*) FROM ledger WHERE host = %s AND id > %s", (far.netns, mark)
    ), net.logs()
    assert cut_off.poll() is None, net.logs()
    _assert_exactly_once(net, first + second, 2 * runs, 0)
    # Fenced: the far host made the business write of each held item after the
    # restore, and none of those writes committed.
    log_text = worker_log(cut_off)
    written = {s for s in held if f"business write of step {s} " in log_text}
    assert written, log_text[-4000:]
    kept = _one(
        net.admin,
        "SELECT count(*) FROM ledger l JOIN cyclone_steps s"
        " ON s.run_id = l.run_id AND s.node = l.node"
        " WHERE s.id = ANY(%s) AND l.host = %s",
        (list(written), far.netns),
    )
    assert kept == 0, log_text[-4000:]


def test_backends_terminated_every_second_for_20_s(net: Net) -> None:
    for link in net.hosts.links:
        net.start(link, CYCLONE_TEST_WORK="0.6")
    _wait_listening(net, 2)
    runs, jobs = 20, 60  # 340 steps of 0.6 s on 8 slots: about 25 s of work
    run_ids = _submit(net, runs, jobs)
    poll_until(
        lambda: _one(net.admin, "SELECT count(*) FROM ledger"),
        timeout=60,
        what=f"work to start\n{net.logs()}",
    )
    terminated = 0
    began = time.monotonic()
    with psycopg.connect(net.admin, autocommit=True) as admin:
        while time.monotonic() - began < 20.0:
            terminated += admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE usename = %s",
                (ROLE,),
            ).fetchone()[0]  # type: ignore[index]
            time.sleep(1.0)  # the storm's own beat
            _assert_alive(net)
    assert _unfinished(net, run_ids) > 0, "the storm ended after the work: too little work"
    _wait_finished(net, run_ids, "after the storm")
    _assert_alive(net)
    _assert_exactly_once(net, run_ids, runs, jobs)
    assert terminated > 20


def test_connections_exhausted_by_another_role_for_30_s(net: Net) -> None:
    for link in net.hosts.links:
        net.start(link, CYCLONE_TEST_WORK="0.3")
    _wait_listening(net, 2)
    runs, jobs = 8, 20
    run_ids = _submit(net, runs, jobs)
    hogged: list[psycopg.Connection[Any]] = []
    refused = False
    with psycopg.connect(net.admin, autocommit=True) as admin:
        try:
            # Take every slot a non-superuser may have, end Cyclone's sessions (the
            # slots they free are taken too): its reconnects are refused meanwhile.
            for round_ in range(2):
                while True:
                    try:
                        hogged.append(psycopg.connect(net.dsn(HOG), autocommit=True))
                    except psycopg.OperationalError:
                        refused = True
                        break
                if round_ == 0:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                        (ROLE,),
                    )
            began = time.monotonic()
            while time.monotonic() - began < 30.0:
                time.sleep(0.5)  # the hold's own beat
                _assert_alive(net)
        finally:
            for conn in hogged:
                conn.close()
    assert refused and hogged
    _wait_finished(net, run_ids, "after the connections were released")
    _assert_alive(net)
    _assert_exactly_once(net, run_ids, runs, jobs)
    log_text = (net.server.root / "log").read_text(errors="replace")
    assert f"{ROLE}:FATAL:  remaining connection slots" in log_text, log_text[-3000:]
