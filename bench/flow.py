"""What flow control costs the drain of no-op jobs.

``python -m bench.flow [--dsn ADMIN_DSN] [--jobs N] [--processes P] [--repeats R]
[--base REF]`` drains ``--jobs`` no-op jobs (the drain of ``python -m bench.jobs``: a
backlog, then worker processes started together, jobs/s over the database's clock) in
a throwaway database, in each mode:

* ``base``: the engine of git ref ``--base`` (a worktree made under the system's
  temporary directory; its worker processes import Cyclone from there), before flow
  control existed: the figure "nothing declared" is held to;
* ``none``: this engine, nothing declared (no limit, no key);
* ``limited``: this engine, the kind declared with ``max_concurrency=1000`` and the
  backlog spread over 20 concurrency keys: a limit that never binds, so every claim
  pays for the limited claim (group locks, counts, admission) and nothing waits.

The modes run interleaved, ``--repeats`` times (median shown), each repeat after the
raw-PostgreSQL limit of the claim and completion statements (``claim_complete10.sql``,
one client per worker process), with the one-minute load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import cyclone
from bench.db import DEFAULT_ADMIN_DSN, execute, log, throwaway_database
from bench.drain import WorkerConfig, fill_backlog, noop_drain
from bench.raw import measure_raw_limit
from bench.report import text_table
from bench.workers import NOOP_KIND, throughput_worker

MODES = ("base", "none", "limited")
KEYS = 20
LIMIT = 1000
ROOT = Path(__file__).resolve().parents[1]


async def _noop(ctx: cyclone.Context, inp: Any) -> None:
    """The no-op job of the limited kind."""


limited_noop = cyclone.action(NOOP_KIND, max_concurrency=LIMIT)(_noop)
"""The no-op kind declaring ``max_concurrency=1000``."""


@contextlib.contextmanager
def base_tree(ref: str) -> Iterator[Path]:
    """A git worktree of ``ref``, removed afterwards."""
    where = Path(tempfile.mkdtemp(prefix="cyclone-base-"))
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref],
        check=True,
        capture_output=True,
    )
    try:
        yield where
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)],
            check=False,
            capture_output=True,
        )


@contextlib.contextmanager
def imports_from(src: Path | None) -> Iterator[None]:
    """Worker processes started meanwhile import Cyclone from ``src`` (``None``: this
    tree): they are spawned, and PYTHONPATH comes before the installed package."""
    before = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = str(src)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


async def drain(dsn: str, mode: str, args: argparse.Namespace, base: Path | None) -> float:
    """One drain of ``args.jobs`` jobs in ``mode``: jobs/s."""
    await asyncio.to_thread(execute, dsn, "DELETE FROM cyclone_kind_limits")
    await fill_backlog(dsn, args.jobs, settle=mode != "limited")
    if mode == "limited":
        await asyncio.to_thread(
            execute,
            dsn,
            f"UPDATE cyclone_steps SET concurrency_key = 'key' || (id % {KEYS})",
            "VACUUM ANALYZE cyclone_runs, cyclone_steps",
            "CHECKPOINT",
        )
    config = WorkerConfig(slots=args.slots, claim_batch=args.claim_batch, poll_interval=0.05)
    with imports_from(base / "src" if mode == "base" and base else None):
        result = await noop_drain(
            dsn,
            processes=args.processes,
            jobs=args.jobs,
            config=config,
            worker=throughput_worker,
            worker_options={"handler": limited_noop} if mode == "limited" else None,
        )
    return float(result["db_span_jobs_per_s"])


async def run(args: argparse.Namespace) -> None:
    """Measure every mode ``args.repeats`` times, interleaved; print the table."""
    modes = [m for m in args.modes if m != "base" or args.base]
    figures: dict[str, list[float]] = {m: [] for m in modes}
    raw: list[float] = []
    loads: list[float] = []
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(base_tree(args.base)) if args.base else None
        dsn = stack.enter_context(throwaway_database(args.dsn, "bench_flow"))
        await asyncio.to_thread(cyclone.migrate, dsn)
        for repeat in range(args.repeats):
            log(f"repeat {repeat + 1} of {args.repeats}")
            results = await asyncio.to_thread(
                measure_raw_limit,
                args.dsn,
                insert_clients=(),
                claim_clients=(args.processes,),
                batch_insert=False,
            )
            raw += [r.jobs_per_s for r in results if r.script.startswith("claim_complete10.")]
            loads.append(os.getloadavg()[0])
            for mode in modes:
                rate = await drain(dsn, mode, args, base)
                figures[mode].append(rate)
                log(f"  {mode:<8} {rate:>8,.0f} jobs/s")
            loads.append(os.getloadavg()[0])
    print(report(figures, raw, loads, args))


def report(
    figures: dict[str, list[float]],
    raw: Sequence[float],
    loads: Sequence[float],
    args: argparse.Namespace,
) -> str:
    """The medians, each against ``base`` (or ``none``) and ``none``, and the raw limit."""
    med = {m: statistics.median(v) for m, v in figures.items() if v}
    ref = med.get("base", med.get("none", 1.0))
    none = med.get("none", ref)
    lines = [("mode", "drain jobs/s", "vs base", "vs none", "runs")]
    for mode, value in med.items():
        runs = " ".join(f"{v:,.0f}" for v in figures[mode])
        lines.append(
            (mode, f"{value:,.0f}", f"{100 * value / ref:.0f}%", f"{100 * value / none:.0f}%", runs)
        )
    table = text_table(lines, right=range(1, 4))
    limit = (
        f"claim_complete10.sql c={args.processes} {statistics.median(raw):,.0f} jobs/s"
        if raw
        else ""
    )
    load = f"load average (1 min) {min(loads):.2f}-{max(loads):.2f}" if loads else ""
    setup = f"{args.jobs:,} jobs, {args.processes} worker process(es), base {args.base or '-'}"
    return f"{setup}\n{table}\nraw PostgreSQL, same run: {limit}\n{load}"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m bench.flow``: see the module."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.flow",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--dsn", default=DEFAULT_ADMIN_DSN, help="admin DSN")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slots", type=int, default=None)
    parser.add_argument("--claim-batch", type=int, default=None)
    parser.add_argument("--base", default=None, help="git ref of the engine to compare with")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
