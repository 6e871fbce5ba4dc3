"""Claiming: the claim statement and what must follow it before a step may run.

One :class:`Claimer` per worker runs each claim on the lease pool: ``steps_claim``
(``FOR UPDATE SKIP LOCKED`` and a CAS update to ``running`` under a fresh lease
owner) for the kinds without limits and, for the kinds ``cyclone_kind_limits`` says
are limited, the limited claim (``steps_claim_limited`` then ``steps_claim_admit``, one
transaction in one round trip: docs/flow-control.md), the two taking turns going
first; the fairness key each claim of a queue ended with, where the next claim's turn
starts; then, on the same connection, the sequence
recheck of steps with a ``sequence_key``, the def_version check of workflow steps
(a foreign one is given back for a worker that has its definition, and skipped by this
worker's later claims), and the assembly of data-edge inputs from upstream outputs
(through an LRU cache).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from cyclone.dbio import Stmt, batch_async, fetch_async
from cyclone.handlers import Handler
from cyclone.inputs import InputError, OutputCache, assemble, needed
from cyclone.limits import LimitedKinds
from cyclone.observability.logs import step_log
from cyclone.sql import Q, claim_limit, claim_limited_sql
from cyclone.sql.flow_rows import LimitedRow
from cyclone.sql.rows import ClaimRow
from cyclone.transitions import (
    Claimed,
    claim_stmt,
    mismatch_stmt,
    parse_claimed,
    sequence_recheck_stmts,
)

__all__ = ["MAX_FOREIGN_VERSIONS", "Claimer", "Release", "next_turn"]

log = logging.getLogger("cyclone.worker")

MAX_FOREIGN_VERSIONS = 1000
"""Foreign def_versions a worker remembers (and its claim skips)."""

Release = Callable[[list[Claimed], str], Awaitable[object]]


def next_turn(after: str, keys: Iterable[str | None]) -> str:
    """The fairness key a claim ended its turn with: claims take keys in turn after
    ``after``, ascending, then from the first again (``keys``: those of the steps it
    took; no key counts as ``''``)."""
    taken = {key or "" for key in keys}
    wrapped = [key for key in taken if key <= after]
    return max(wrapped) if wrapped else max(taken, default=after)


"""Gives claimed steps back (``why`` for the log) without counting a reclaim."""


class Claimer:
    """Claims the steps of one worker's kinds (see the module docstring)."""

    def __init__(
        self,
        *,
        owner: str,
        lease_ttl: float,
        handlers: Mapping[str, Handler],
        lease_pool: AsyncConnectionPool[Any],
        workflows: Mapping[str, list[str]],
        parents: Collection[str] = (),
        measure: Callable[[], bool] = lambda: False,
    ) -> None:
        self._owner = owner
        self._lease_ttl = lease_ttl
        self._kinds = sorted(handlers)
        self._kind_timeouts = [handlers[k].options.timeout for k in self._kinds]
        self._lease_pool = lease_pool
        self._workflows = {name: list(versions) for name, versions in workflows.items()}
        self._parents = frozenset(parents)  # def_versions with child nodes
        self._foreign: list[str] = []  # def_versions found foreign, skipped by the claim
        self._serial = 0
        self._measure = measure  # whether a claim computes workflow steps' ready time
        self.limited = LimitedKinds(self._kinds)
        """Which of this worker's kinds are limited (claimed by the limited claim)."""
        self._turns: dict[str, str] = {}  # queue -> the fairness key its last claim ended with
        self._fair: dict[str, bool] = {}  # queue -> whether it held fairness keys at last claim
        self.held: dict[str, bool] = {}
        """Queue -> whether a limit held steps back at its last limited claim."""
        windows = [h.limits.rate_limit.per for h in handlers.values() if h.limits.rate_limit]
        self.rate_window = min(windows, default=math.inf)
        """Seconds: the shortest rate-limit window of this worker's kinds (a spent bucket
        has room again within it); infinite without rate limits."""
        self.outputs = OutputCache()
        """Upstream outputs read to assemble data-edge inputs (by (run id, node))."""

    async def claim(self, queue: str, limit: int, *, release: Release) -> list[Claimed]:
        """Claim up to ``limit`` steps of ``queue`` (one of ``CLAIM_LIMITS``) on the
        lease pool: the steps this worker may run, inputs resolved. The kinds the
        limits table says are limited (read again every few seconds) go through the
        limited claim, the others through ``steps_claim``.

        After the claim statement, on the same connection: steps a sequence recheck
        gives back are dropped, workflow steps of a def_version this worker does not
        register are given back (:meth:`_check_versions`), and data-edge inputs are
        assembled (:meth:`_resolve_inputs`). If one of those fails, ``release`` gives
        back what was claimed before the error is raised (no reclaim is counted).

        Raises:
            psycopg.Error: the claim or what follows it failed.
        """
        # Each claim writes its own lease owner: the client's id and a serial number.
        # With the generation it fences every later transition, even if a claim is
        # lost in a server crash and the same generation is issued again.
        self._serial += 1
        owner = f"{self._owner}/{self._serial}"
        latency = self._measure()

        def plain(n: int) -> Stmt[ClaimRow]:
            return claim_stmt(
                queue=queue,
                kinds=self._kinds,
                timeouts=self._kind_timeouts,
                owner=owner,
                ttl=self._lease_ttl,
                limit=claim_limit(n),
                foreign=self._foreign,
                latency=latency,
                after=self._turns.get(queue, ""),
                fair=self._fair.get(queue, False),
            )

        async def unlimited(n: int) -> list[ClaimRow]:
            # Run for the wrong mode (fair or not), a claim takes nothing and says so.
            for _ in range(2):
                rows = await fetch_async(conn, plain(n))
                if rows:
                    self._fair[queue] = bool(rows[0].fair)
                if not rows or rows[0].id is not None:
                    return rows
            return []

        async def limited_claim(n: int) -> list[ClaimRow]:
            for _ in range(2):
                fair = self._fair.get(queue, False)
                head, rows = await self._claim_limited(conn, plain(n), fair)
                self._fair[queue], self.held[queue] = head.fair, head.held
                if head.fair == fair:
                    return rows
            return []

        async with self._lease_pool.connection() as conn:
            limited = await self.limited.refresh(conn)
            # A queue shared by limited and other kinds: the two claims take turns
            # going first, so neither can take every free slot claim after claim.
            # A worker whose kinds are all limited has nothing for the other claim.
            limited_first = bool(limited) and self._serial % 2 == 0
            rows: list[ClaimRow] = []
            if limited_first:
                rows = await limited_claim(limit)
            if len(rows) < limit and not limited.issuperset(self._kinds):
                rows += await unlimited(limit - len(rows))
            if limited and not limited_first and len(rows) < limit:
                rows += await limited_claim(limit - len(rows))
            if rows:
                after = self._turns.get(queue, "")
                self._turns[queue] = next_turn(after, (row.fairness_key for row in rows))
            claimed = parse_claimed(rows, queue, owner, self._parents)
            try:
                sequenced = [step for step in claimed if step.sequence_key is not None]
                if sequenced:
                    results = await batch_async(
                        conn, sequence_recheck_stmts(sequenced), transaction=True
                    )
                    given_back = {row.id for row in results.of(Q.steps_sequence_release)}
                    for step in claimed:
                        if step.id in given_back:
                            step_log(log, step).debug("given back by the sequence recheck")
                    claimed = [step for step in claimed if step.id not in given_back]
                if any(step.def_version != "job" for step in claimed):
                    claimed = await self._check_versions(conn, claimed)
                    if any(step.has_data_edge for step in claimed):
                        claimed = await self._resolve_inputs(conn, claimed)
            except Exception:
                # Give the claimed steps back now rather than let the sweep reclaim them
                # (which would count a reclaim); the claim loop logs and backs off.
                if claimed:
                    await release(claimed, "after a failed claim")
                raise
        return claimed

    def waits_for_places(self, queue: str) -> bool:
        """Whether the last limited claim of ``queue`` found a limit holding steps back:
        then a place freed in the queue is worth a claim at once."""
        return self.held.get(queue, False)

    @staticmethod
    async def _claim_limited(
        conn: psycopg.AsyncConnection[Any], plain: Stmt[ClaimRow], fair: bool
    ) -> tuple[LimitedRow, list[ClaimRow]]:
        """The claim of limited kinds, with the parameters and limit of ``plain`` (a
        ``steps_claim``), for a queue with fairness keys or not (``fair``):
        ``steps_claim_limited`` (or ``_fair``) locks the candidates and their groups,
        then ``steps_claim_admit``, with a snapshot taken under those locks, starts the
        ones with a free place and room in their bucket; one transaction, one round
        trip (docs/flow-control.md). The first statement's row (whether the queue holds
        fairness keys: if not ``fair``, nothing was locked or started; whether a limit
        held steps back) and the steps started."""
        params = plain.params
        assert params is not None
        select = Stmt(
            claim_limited_sql(params["limit"], fair),
            {k: params[k] for k in ("queue", "kinds", "foreign", "after")},
        )
        admit = Stmt(
            Q.steps_claim_admit,
            {k: params[k] for k in ("owner", "ttl_us", "kinds", "timeouts_us", "latency")},
        )
        results = await batch_async(conn, [select, admit], transaction=True)
        (head,) = results.of(select.query)
        return head, results.of(Q.steps_claim_admit)

    async def _check_versions(
        self, conn: psycopg.AsyncConnection[Any], claimed: list[Claimed]
    ) -> list[Claimed]:
        """Give back workflow steps whose run's def_version this worker does not register.

        docs/design.md, Who claims what: the step goes back to ``available`` after a short
        delay, with no attempt and no reclaim counted and ``error_kind =
        'def_version_mismatch'``, for a worker that has the run's definition.
        """
        foreign = [
            step
            for step in claimed
            if step.def_version != "job"
            and step.def_version not in self._workflows.get(step.workflow, ())
        ]
        if not foreign:
            return claimed
        await fetch_async(conn, mismatch_stmt(foreign, self._workflows))
        for step in foreign:
            if step.def_version not in self._foreign:
                if len(self._foreign) >= MAX_FOREIGN_VERSIONS:
                    self._foreign.pop(0)
                self._foreign.append(step.def_version)
            step_log(log, step).warning(
                "def_version mismatch: the run has %s of workflow %r, "
                "this worker has %s; given back for a worker with that definition "
                "(this worker skips that def_version from now on)",
                step.def_version,
                step.workflow,
                self._workflows.get(step.workflow) or "none",
            )
        # Never run a foreign step, even one whose release found it moved on (cancelled).
        return [step for step in claimed if step not in foreign]

    async def _resolve_inputs(
        self, conn: psycopg.AsyncConnection[Any], claimed: list[Claimed]
    ) -> list[Claimed]:
        """Replace each data-edge step's input by its upstream outputs (cache, then DB).

        A step whose input cannot be assembled keeps the reason in ``input_error`` and
        is discarded when it runs.
        """
        cache = self.outputs
        outputs: dict[tuple[int, str], str | None] = {}
        missing: set[tuple[int, str]] = set()
        for step in claimed:
            for key in needed(step.run_id, step.input_from, step.bindings):
                found, text = cache.get(key)
                if found:
                    outputs[key] = text
                else:
                    missing.add(key)
        if missing:
            keys = sorted(missing)
            params = {"run_ids": [k[0] for k in keys], "nodes": [k[1] for k in keys]}
            for run_id, node, text in await fetch_async(conn, Stmt(Q.steps_outputs, params)):
                outputs[run_id, node] = text
                cache.put((run_id, node), text)
        resolved = []
        for step in claimed:
            if not step.has_data_edge:
                resolved.append(step)
                continue
            try:
                value = assemble(step.run_id, step.input_from, step.bindings, outputs, step.names)
                resolved.append(replace(step, input=value))
            except InputError as exc:
                resolved.append(replace(step, input=None, input_error=str(exc)))
        return resolved
