"""How many worker slots, completion transactions and connections a client uses.

A client serves each of its queues with a number of worker slots; its handler pools
hold the connections of completion transactions (``tx_slots`` of them open at once),
split between async and sync handlers; beside them the engine keeps
:data:`ENGINE_RESERVE` connections of its own. :func:`size_client` checks what was
given and fills in what was not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cyclone.errors import PoolTooSmallError, ValidationError
from cyclone.handlers import Handler
from cyclone.options import check_int, check_queue

__all__ = [
    "DEFAULT_SLOTS",
    "DEFAULT_TX_SLOTS",
    "ENGINE_RESERVE",
    "MAX_SLOTS",
    "Sizes",
    "size_client",
]

ENGINE_RESERVE = 6
"""Connections kept for the engine: the lease pool, the engine pool and LISTEN."""
DEFAULT_SLOTS = 100
"""Worker slots of each queue of the registered kinds when ``queues`` is not given."""
DEFAULT_TX_SLOTS = 20
"""Most completion transactions a client opens at once when ``tx_slots`` is not given."""
MAX_SLOTS = 10_000
"""Most worker slots one queue of one client may have."""


@dataclass(frozen=True, slots=True)
class Sizes:
    """A client's sizes: ``queues`` (queue name -> worker slots), ``tx_slots``,
    ``max_connections`` and ``pool_sizes`` (async, sync handler pool sizes)."""

    queues: dict[str, int]
    tx_slots: int
    max_connections: int
    pool_sizes: tuple[int, int]


def size_client(
    queues: Mapping[str, int],
    handlers: Sequence[Handler],
    tx_slots: int | None,
    max_connections: int | None,
) -> Sizes:
    """Check ``queues`` and derive what was not given: ``tx_slots`` (default: the total
    of slots, at most :data:`DEFAULT_TX_SLOTS`, and at least 1) and
    ``max_connections`` (default ``tx_slots + ENGINE_RESERVE``).

    Raises:
        ValidationError: ``queues`` is not a mapping, or a bad queue name or slot count.
        PoolTooSmallError: ``max_connections`` is below ``tx_slots + ENGINE_RESERVE``,
            or leaves fewer than two handler connections for sync and async kinds.
    """
    if not isinstance(queues, Mapping):
        raise ValidationError(f"queues must map queue names to slots, got {queues!r}")
    checked = {
        check_queue(q): check_int(n, f"slots of queue {q!r}", 1, MAX_SLOTS)
        for q, n in queues.items()
    }
    if tx_slots is None:
        tx_slots = max(1, min(DEFAULT_TX_SLOTS, sum(checked.values())) if handlers else 0)
    budget = tx_slots + ENGINE_RESERVE
    if max_connections is None:
        max_connections = budget
    if max_connections < budget:
        raise PoolTooSmallError(
            f"max_connections={max_connections} is below tx_slots + {ENGINE_RESERVE} = {budget}"
        )
    pool_sizes = _split_handler_pools(
        max_connections - ENGINE_RESERVE, list(handlers), max_connections
    )
    return Sizes(checked, tx_slots, max_connections, pool_sizes)


def _split_handler_pools(
    budget: int, handlers: list[Handler], max_connections: int
) -> tuple[int, int]:
    """(async pool size, sync pool size) for completion transactions, summing to ``budget``.

    With both flavours, each gets a share in proportion to its number of kinds, at
    least one connection each.

    Raises:
        PoolTooSmallError: both flavours registered and fewer than two connections left.
    """
    n_sync = sum(1 for h in handlers if not h.is_async)
    n_async = len(handlers) - n_sync
    if not (n_sync and n_async):
        return (budget if n_async else 0, budget if n_sync else 0)
    if budget < 2:
        raise PoolTooSmallError(
            f"max_connections={max_connections} leaves {budget} connection(s) for completion "
            f"transactions; sync and async kinds need at least {ENGINE_RESERVE + 2}"
        )
    sync_size = min(budget - 1, max(1, round(budget * n_sync / len(handlers))))
    return budget - sync_size, sync_size
