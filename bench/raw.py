"""The raw-PostgreSQL limit: pgbench scripts against a bare job table.

The scripts of ``bench/raw-postgres`` (see its README) run unchanged in a
throwaway database: ``schema.sql`` creates the ``jobs`` table, ``refill.sql`` loads
200,000 available rows (then VACUUM ANALYZE and CHECKPOINT), and each measurement is
one short ``pgbench -n -M prepared -c C -j min(C, cores) -T S -f SCRIPT`` run:

* ``insert1.sql``: one single-row INSERT per transaction (jobs/s = TPS);
* ``insert100.sql``: 100 rows per INSERT (jobs/s = 100 x TPS);
* ``claim_complete1.sql`` / ``claim_complete10.sql``: claim 1 (10) rows with
  ``FOR UPDATE SKIP LOCKED`` and complete them (jobs/s = TPS x 1 (10)).

Each run also records the CPU time of pgbench's backends (``application_name``
``pgbench``, sampled every 0.1 s by :class:`bench.cpu.BackendCpu`), so that the server
CPU per job of the raw limit can stand beside Cyclone's.

The table is refilled before every claim run, as the README says, so each starts from
the same 200,000 rows; a run that drains the table is refused, since claims that find
nothing would inflate its TPS.

``python -m bench.raw`` measures the limit on its own.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from bench.cpu import BackendCpu
from bench.db import DEFAULT_ADMIN_DSN, log, throwaway_database
from bench.monitor import busy_cores, machine_cpu

__all__ = [
    "CLAIM_SCRIPTS",
    "DEFAULT_SCRIPTS",
    "INSERT_SCRIPTS",
    "PgbenchResult",
    "RawLimit",
    "measure_raw_limit",
]

DEFAULT_SCRIPTS = Path(__file__).resolve().parent / "raw-postgres"
INSERT_SCRIPTS = {"insert1.sql": 1, "insert100.sql": 100}
"""Insert scripts and the rows each transaction inserts."""
CLAIM_SCRIPTS = {"claim_complete1.sql": 1, "claim_complete10.sql": 10}
"""Claim+complete scripts and the jobs each transaction claims and completes."""
_BATCH = {**INSERT_SCRIPTS, **CLAIM_SCRIPTS}

_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_PROCESSED = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)
_FAILED = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)
_LATENCY = re.compile(r"^latency average = ([0-9.]+) ms", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class PgbenchResult:
    """One pgbench run: the script, its client count and what it sustained."""

    script: str
    clients: int
    threads: int
    batch: int
    seconds: int
    transactions: int
    failed: int
    tps: float
    latency_ms: float
    busy_cores: float | None = None
    server_cpu_s: float | None = None
    """CPU seconds of pgbench's backends during the run (:mod:`bench.cpu`)."""

    @property
    def jobs_per_s(self) -> float:
        """Jobs (rows) per second: TPS times the jobs of one transaction."""
        return self.tps * self.batch

    @property
    def server_cpu_us_per_job(self) -> float | None:
        """Server CPU microseconds per job (row) of the run, when measured."""
        jobs = self.transactions * self.batch
        if self.server_cpu_s is None or jobs <= 0:
            return None
        return 1e6 * self.server_cpu_s / jobs

    @property
    def label(self) -> str:
        """``insert1.sql c=4`` and the like."""
        return f"{self.script} c={self.clients}"

    def to_json(self) -> dict[str, Any]:
        """The run as a JSON object, with ``jobs_per_s``."""
        cpu = self.server_cpu_us_per_job
        return {
            **asdict(self),
            "jobs_per_s": round(self.jobs_per_s, 1),
            "server_cpu_us_per_job": None if cpu is None else round(cpu, 1),
        }


class RawLimit:
    """Runs the raw-PostgreSQL scripts against one database that holds the ``jobs`` table."""

    def __init__(self, dsn: str, scripts: Path, *, seconds: int) -> None:
        self.dsn = dsn
        self.scripts = scripts
        self.seconds = seconds
        self._env = {**os.environ}
        password = conninfo_to_dict(dsn).get("password")
        if password:
            self._env["PGPASSWORD"] = str(password)
        for tool in ("psql", "pgbench"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not on PATH; install the PostgreSQL client tools")

    def _psql(self, script: str) -> None:
        subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.dsn, "-f", script],
            check=True,
            env=self._env,
            capture_output=True,
            cwd=self.scripts,
        )

    def create_schema(self, *, fill: bool = True) -> None:
        """Create the ``jobs`` table (``schema.sql``) and fill it (``refill.sql``) unless
        not ``fill``."""
        self._psql("schema.sql")
        if fill:
            self.refill()

    def refill(self) -> None:
        """``refill.sql``: 200,000 available rows, vacuumed, analyzed and checkpointed."""
        self._psql("refill.sql")

    def available(self) -> int:
        """Rows still available to claim."""
        with psycopg.connect(self.dsn) as conn:
            row = conn.execute("SELECT count(*) FROM jobs WHERE state = 'available'").fetchone()
        assert row is not None
        return int(row[0])

    def measure(self, script: str, clients: int) -> PgbenchResult:
        """One figure: a claim script after a refill, an insert script as the table is.

        Raises:
            RuntimeError: pgbench failed, or a claim run drained the table (its TPS
                would count claims that found nothing; use fewer seconds).
        """
        batch = _BATCH[script]
        if script not in CLAIM_SCRIPTS:
            return self.run(script, clients, batch)
        self.refill()
        result = self.run(script, clients, batch)
        if self.available() == 0:
            raise RuntimeError(f"{result.label} claimed every row within {self.seconds} s")
        return result

    def run(self, script: str, clients: int, batch: int) -> PgbenchResult:
        """One pgbench run of ``script`` with ``clients`` connections.

        Raises:
            RuntimeError: pgbench failed, or its output has no TPS line.
        """
        threads = max(1, min(clients, os.cpu_count() or 1))
        command = [
            "pgbench",
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(threads),
            "-T",
            str(self.seconds),
            "-f",
            str(self.scripts / script),
            self.dsn,
        ]
        before = machine_cpu()
        # pgbench's backends exit with it: sample often, so that little of their last
        # moments is lost (bench.cpu keeps the last value seen of a backend that exits)
        server = BackendCpu(self.dsn, "pgbench", interval=0.1).start()
        try:
            done = subprocess.run(
                command, env=self._env, capture_output=True, text=True, check=False
            )
        finally:
            server_cpu = server.stop()
        cores = busy_cores(before, machine_cpu())
        tps = _TPS.search(done.stdout)
        if done.returncode != 0 or tps is None:
            raise RuntimeError(
                f"pgbench {script} -c {clients} failed ({done.returncode}):\n"
                f"{done.stdout}\n{done.stderr}"
            )
        processed = _PROCESSED.search(done.stdout)
        failed = _FAILED.search(done.stdout)
        latency = _LATENCY.search(done.stdout)
        rate = float(tps.group(1))
        return PgbenchResult(
            script=script,
            clients=clients,
            threads=threads,
            batch=batch,
            seconds=self.seconds,
            transactions=int(processed.group(1)) if processed else 0,
            failed=int(failed.group(1)) if failed else 0,
            tps=rate,
            latency_ms=float(latency.group(1)) if latency else 1000.0 * clients / rate,
            busy_cores=cores,
            server_cpu_s=server_cpu.seconds,
        )


def measure_raw_limit(
    admin_dsn: str,
    *,
    scripts: Path = DEFAULT_SCRIPTS,
    seconds: int = 3,
    insert_clients: Iterable[int] = (1, 4),
    claim_clients: Iterable[int] = (1, 2),
    batch_insert: bool = True,
) -> list[PgbenchResult]:
    """Every raw figure, in a throwaway database created and dropped here.

    ``insert1.sql`` runs once per count of ``insert_clients``, ``insert100.sql`` with one
    client when ``batch_insert``, and each claim script once per count of
    ``claim_clients``, each after a refill.
    """
    results: list[PgbenchResult] = []

    def record(result: PgbenchResult) -> None:
        results.append(result)
        log(f"  raw {result.label:<26} {result.jobs_per_s:>10,.0f} jobs/s")

    with throwaway_database(admin_dsn, "bench_raw") as dsn:
        raw = RawLimit(dsn, scripts, seconds=seconds)
        raw.create_schema()
        for clients in sorted(set(insert_clients)):
            record(raw.measure("insert1.sql", clients))
        if batch_insert:
            record(raw.measure("insert100.sql", 1))
        for script in CLAIM_SCRIPTS:
            for clients in sorted(set(claim_clients)):
                record(raw.measure(script, clients))
    return results


def main() -> None:
    """``python -m bench.raw``: print the raw limit."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN (creates databases)")
    parser.add_argument("--scripts", type=Path, default=DEFAULT_SCRIPTS)
    parser.add_argument("--seconds", type=int, default=3, help="length of each pgbench run")
    parser.add_argument("--insert-clients", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--claim-clients", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    results = measure_raw_limit(
        args.dsn,
        scripts=args.scripts,
        seconds=args.seconds,
        insert_clients=args.insert_clients,
        claim_clients=args.claim_clients,
    )
    print(f"{'script':<24} {'clients':>7} {'TPS':>10} {'jobs/s':>10} {'latency':>10}")
    for r in results:
        print(
            f"{r.script:<24} {r.clients:>7} {r.tps:>10,.0f} {r.jobs_per_s:>10,.0f} "
            f"{r.latency_ms:>7.3f} ms"
        )


if __name__ == "__main__":
    main()
