"""The wait nodes of a workflow: sleep, wait for a signal, for N signals, for any of
several (mixed into :class:`cyclone.Workflow`).

A wait node runs no handler: it is reached like any node and then waits, in the state
migration 5's ``cyclone_reached_state_v1`` gives its kind (``waiting_timer``,
``waiting_signal``), until the wait scanner or a signal completes it. Signal names are
unique per workflow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from cyclone.dag import Node, NodeRef, NodeSpec, check_duration, check_id, signals_of
from cyclone.errors import WorkflowError
from cyclone.options import Duration

__all__ = ["WaitNodes"]


class WaitNodes:
    """The wait-node declarations of :class:`cyclone.Workflow`."""

    name: str
    _nodes: dict[str, NodeSpec]

    if TYPE_CHECKING:

        def _new_id(self, id: Any) -> tuple[str, str]: ...

        def _after(self, after: Any, where: str) -> tuple[str, ...]: ...

        def _add(self, spec: NodeSpec) -> Node: ...

    def sleep(self, id: str, duration: Duration, *, after: Iterable[NodeRef] = ()) -> Node:
        """Declare a durable timer: the node waits ``duration`` (``timedelta`` or seconds)
        from the moment it is reached (state ``waiting_timer``), then completes with no
        output. The wait scanner completes it by the database clock, across restarts.

        Raises:
            WorkflowError: a duplicate id or a bad duration.
        """
        node_id, where = self._new_id(id)
        wait = check_duration(duration, f"duration of {where}", required=True)
        return self._wait(node_id, where, "@sleep", after, wait_for=wait)

    def wait_signal(
        self,
        id: str,
        name: str | None = None,
        *,
        timeout: Duration | None = None,
        after: Iterable[NodeRef] = (),
    ) -> Node:
        """Declare a wait for one signal ``name`` (default: the node id). Its output is
        the signal's payload. Past ``timeout`` (seconds or ``timedelta`` from the moment
        the wait is reached) the node is discarded with ``error_kind = 'signal_timeout'``.

        Raises:
            WorkflowError: a duplicate id or signal name, or a bad timeout.
        """
        node_id, where = self._new_id(id)
        signal = check_id(name if name is not None else node_id, f"signal name of {where}")
        return self._signal_wait(node_id, where, after, timeout, signal_name=signal)

    def wait_n(
        self,
        id: str,
        name: str,
        n: int,
        *,
        timeout: Duration | None = None,
        after: Iterable[NodeRef] = (),
    ) -> Node:
        """Declare a wait for ``n`` signals ``name``; its output is the list of their
        payloads in arrival order. See :meth:`wait_signal` for ``timeout``.

        Raises:
            WorkflowError: a duplicate id or signal name, a bad ``n`` or timeout.
        """
        node_id, where = self._new_id(id)
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 10_000:
            raise WorkflowError(f"{where}: n must be an int from 1 to 10000, got {n!r}")
        signal = check_id(name, f"signal name of {where}")
        return self._signal_wait(node_id, where, after, timeout, signal_name=signal, wait_count=n)

    def wait_any(
        self,
        id: str,
        names: Sequence[str],
        *,
        timeout: Duration | None = None,
        after: Iterable[NodeRef] = (),
    ) -> Node:
        """Declare a wait for the first signal among ``names``; its output is
        ``{"name": ..., "payload": ...}``. See :meth:`wait_signal` for ``timeout``.

        Raises:
            WorkflowError: a duplicate id or signal name, no names, or a bad timeout.
        """
        node_id, where = self._new_id(id)
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            raise WorkflowError(f"{where}: names must be a non-empty list, got {names!r}")
        checked = tuple(check_id(n, f"signal name of {where}") for n in names)
        if len(set(checked)) < len(checked):
            raise WorkflowError(f"{where}: names {list(checked)} repeat a name")
        return self._signal_wait(node_id, where, after, timeout, signal_names=checked)

    def _signal_wait(
        self, node_id: str, where: str, after: Any, timeout: Duration | None, **names: Any
    ) -> Node:
        wait_for = check_duration(timeout, f"timeout of {where}")
        return self._wait(node_id, where, "@signal", after, wait_for=wait_for, **names)

    def _wait(self, node_id: str, where: str, kind: str, after: Any, **wait: Any) -> Node:
        after_ids = self._after(after, where)
        if node_id in after_ids:
            raise WorkflowError(f"{where} depends on itself")
        names = [wait.get("signal_name")] if wait.get("signal_name") else []
        names += list(wait.get("signal_names") or ())
        taken = {n for spec in self._nodes.values() for n in signals_of(spec)}
        for name in names:
            if name in taken:
                raise WorkflowError(
                    f"{where}: signal name {name!r} is already waited for by another node "
                    "(signal names are unique per workflow)"
                )
        return self._add(
            NodeSpec(
                id=node_id,
                kind=kind,
                handler=None,
                after=after_ids,
                input_from=None,
                inputs=(),
                assembly="tuple",
                input=None,
                overrides={},
                on_dep_failure="fail_run",
                **wait,
            )
        )
