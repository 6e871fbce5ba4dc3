"""Static DAG workflows: the builder (its checks and fingerprint: :mod:`cyclone.dag`).

A :class:`Workflow` is plain
data: nodes (each a kind with options), control edges (``after=``), data edges
(``input_from=``, ``inputs=``) and a result node. Pure code, no I/O: submit turns a
validated workflow into the rows of one transaction (:mod:`cyclone.submit`).

Data flow (docs/design.md, Data flow in a DAG). A node's input is, in this order:

* ``input_from=x``: the output of ``x``;
* ``inputs=[x, y, ...]``: the outputs of the sources in slot order, assembled by
  ``assembly``: ``"tuple"`` (default) gives a list with one element per source,
  ``"array"`` concatenates the sources' outputs, each of which must be a list
  (``None`` counts as an empty list);
* ``inputs={"a": x, "b": y}``: named fan-in: a dict, each source's output under its
  name (slots in the mapping's order);
* ``input=value``: a constant given at definition;
* otherwise the run input.

A data edge implies its control edge: the node runs once every node of ``after``,
``input_from`` and ``inputs`` has completed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple, TypedDict, Unpack

from cyclone.dag import (
    FLOW_KEYS,
    Assembly,
    DepPolicy,
    Node,
    NodeRef,
    NodeSpec,
    check_id,
    fan_in,
    fingerprint,
    flow_keys,
    signals_of,
    topological_order,
)
from cyclone.errors import ValidationError, WorkflowError
from cyclone.flow import ItemKey
from cyclone.handlers import Handler
from cyclone.options import Duration, JobOptions
from cyclone.payloads import PLAIN, encode_json
from cyclone.wait_nodes import WaitNodes

__all__ = ["Assembly", "DepPolicy", "Node", "NodeOptions", "NodeSpec", "Workflow"]

_ASSEMBLIES = ("tuple", "array")
_POLICIES = ("fail_run", "cancel_branch")
_MAX_NODES = 100_000
_INT32 = 2**31 - 1
"""The largest value of an ``integer`` column (fan_out_parallel, fan_out_max_items)."""
_INT64 = 2**63 - 1
"""The largest value of a ``bigint`` column (fan_out_max_bytes)."""


class _Edges(NamedTuple):
    """What a node's input and order depend on, as given to :meth:`Workflow.node`."""

    after: Any
    input_from: Any
    inputs: Any
    assembly: Any
    input: Any


class NodeOptions(TypedDict, total=False):
    """The options of a node's steps that override its kind's defaults (see
    :meth:`Workflow.node`), and its dependency-failure policy."""

    queue: str | None
    priority: int | None
    max_attempts: int | None
    timeout: Duration | None
    retention: Duration | None
    on_dep_failure: DepPolicy
    concurrency_key: str | ItemKey | None
    rate_key: str | ItemKey | None
    fairness_key: str | ItemKey | None


class Workflow(WaitNodes):
    """A static DAG of steps, declared once and submitted many times.

    Example::

        wf = cyclone.Workflow("order")
        v = wf.node("validate", validate)
        c = wf.node("charge", charge, input_from=v)
        r = wf.node("report", report, inputs=[v, c])
        wf.result(r)

    Args:
        name: the workflow name stored in ``cyclone_runs.workflow`` (at most 1,024 bytes).

    Raises:
        WorkflowError: a bad name.
    """

    __module__ = "cyclone"

    def __init__(self, name: str) -> None:
        self.name = check_id(name, "workflow name")
        self._nodes: dict[str, NodeSpec] = {}
        self._result: str | None = None
        self._fingerprint: str | None = None
        self._order: list[str] | None = None
        self.revision = 0
        """Bumped by every change, so compiled forms know they are stale."""

    def __repr__(self) -> str:
        return f"<cyclone.Workflow {self.name!r} nodes={len(self._nodes)}>"

    @property
    def nodes(self) -> Mapping[str, NodeSpec]:
        """The declared nodes by id, in declaration order."""
        return self._nodes

    @property
    def result_node(self) -> str | None:
        """The node whose output is the run result (``None``: the result is ``None``)."""
        return self._result

    def node(
        self,
        id: str,
        kind: Handler | str,
        *,
        after: Iterable[NodeRef] = (),
        input_from: NodeRef | None = None,
        inputs: Sequence[NodeRef] | Mapping[str, NodeRef] | None = None,
        assembly: Assembly = "tuple",
        input: Any = None,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        timeout: Duration | None = None,
        retention: Duration | None = None,
        on_dep_failure: DepPolicy = "fail_run",
        concurrency_key: str | ItemKey | None = None,
        rate_key: str | ItemKey | None = None,
        fairness_key: str | ItemKey | None = None,
    ) -> Node:
        """Declare a node that runs ``kind`` once its upstream nodes completed.

        Args:
            id: node id, unique in the workflow (no ``[`` or ``]``: item tasks use them).
            kind: the handler, or the name of a kind the submitting client registers.
            after: control edges: nodes that must complete first.
            input_from: single-source data edge: the node's input is that output.
            inputs: multi-source fan-in: a list of nodes (ordered slots; see
                ``assembly``), or a dict of input names to nodes, ``{"lines": v,
                "approval": w}``: the input is then a dict, each source's output under
                its name.
            assembly: ``"tuple"`` (one list element per source) or ``"array"`` (the
                sources' lists concatenated); a list ``inputs`` only.
            input: a constant input (JSON value) when no data edge is given; ``None``
                means the run input.
            queue, priority, max_attempts, timeout, retention: override the kind's
                defaults (durations are ``timedelta`` or seconds).
            on_dep_failure: ``"fail_run"`` (default) or ``"cancel_branch"``.
            concurrency_key, rate_key, fairness_key: the node's flow keys, as the
                options of ``enqueue`` (docs/flow-control.md); on a fan-out, a
                :class:`cyclone.ItemKey` takes each item task's key from its item.

        Returns:
            A :class:`Node` reference for edges and :meth:`result`.

        Raises:
            WorkflowError: a duplicate id, a self-edge, a bad option, both
                ``input_from`` and ``inputs``, or a bad input name (not a non-empty
                string, given twice), naming it. Nothing is declared then.
        """
        node_id, where = self._new_id(id)
        if isinstance(kind, Handler):
            kind_name, handler = kind.kind, kind
        elif isinstance(kind, str):
            kind_name, handler = check_id(kind, f"kind of {where}"), None
            if kind_name.startswith("@"):
                raise WorkflowError(f"{where}: kind names starting with '@' are the engine's")
        else:
            raise WorkflowError(f"{where}: kind must be a handler or a kind name, got {kind!r}")
        overrides = {
            key: value
            for key, value in {
                "queue": queue,
                "priority": priority,
                "max_attempts": max_attempts,
                "timeout": timeout,
                "retention": retention,
            }.items()
            if value is not None
        }
        try:
            JobOptions().override(**overrides)
        except ValidationError as exc:
            raise WorkflowError(f"{where}: {exc}") from None
        keys = flow_keys(
            where,
            concurrency_key=concurrency_key,
            rate_key=rate_key,
            fairness_key=fairness_key,
        )
        edges = _Edges(after, input_from, inputs, assembly, input)
        spec = self._spec(
            node_id,
            where,
            kind_name,
            handler,
            edges,
            on_dep_failure=on_dep_failure,
            overrides=overrides,
            keys=keys,
        )
        return self._add(spec)

    def _spec(
        self,
        node_id: str,
        where: str,
        kind: str,
        handler: Handler | None,
        edges: _Edges,
        *,
        on_dep_failure: Any,
        overrides: Mapping[str, Any],
        **extra: Any,
    ) -> NodeSpec:
        """A node's spec with its edges, input binding and policy validated."""
        after, input_from, inputs, assembly, input = edges
        after_ids = self._after(after, where)
        source = None if input_from is None else self._ref(input_from, f"input_from of {where}")
        sources, names = fan_in(inputs, where, self._ref)
        if source is not None and sources:
            raise WorkflowError(f"{where}: give input_from or inputs, not both")
        if assembly != "tuple" and (not sources or names):
            raise WorkflowError(f"{where}: assembly applies to inputs=[...] only")
        if assembly not in _ASSEMBLIES:
            raise WorkflowError(f"{where}: assembly must be 'tuple' or 'array', got {assembly!r}")
        if on_dep_failure not in _POLICIES:
            raise WorkflowError(
                f"{where}: on_dep_failure must be 'fail_run' or 'cancel_branch', "
                f"got {on_dep_failure!r}"
            )
        if node_id in (*after_ids, source, *sources):
            raise WorkflowError(f"{where} depends on itself")
        constant = None
        if input is not None:
            if source is not None or sources:
                raise WorkflowError(f"{where}: a constant input and a data edge exclude each other")
            try:
                constant = encode_json(PLAIN.encode(input), f"input of {where}")
            except ValidationError as exc:
                raise WorkflowError(str(exc)) from None
        return NodeSpec(
            id=node_id,
            kind=kind,
            handler=handler,
            after=after_ids,
            input_from=source,
            inputs=sources,
            input_names=names,
            assembly=assembly,
            input=constant,
            overrides=overrides,
            on_dep_failure=on_dep_failure,
            **extra,
        )

    def fan_out(
        self,
        id: str,
        kind: Handler | str,
        *,
        over: NodeRef,
        max_parallel: int = 0,
        max_bytes: int = 0,
        max_items: int = 0,
        after: Iterable[NodeRef] = (),
        **options: Unpack[NodeOptions],
    ) -> Node:
        """Declare a fan-out: one item task of ``kind`` per element of ``over``'s output.

        When ``over`` completes, the same transaction inserts the item tasks ``id[0]``,
        ``id[1]``, ... (each with one list element as input), at most ``max_parallel``
        of them runnable at once (0: no limit; the rest are released as items finish).
        The node completes when every item completed: with the items' outputs in item
        order for a step kind (over ``max_bytes`` of JSON, 0 for no limit, the node is
        discarded with ``error_kind = 'fan_out_too_large'``), with no output for an
        action. An empty list completes at once; an output that is not a list discards
        the node (``'fan_out_input'``). A list of more than ``max_items`` elements (0:
        no cap) gets no item tasks: the node is discarded with ``'fan_out_too_large'``,
        its error naming the list's length and the cap. The first item discarded
        discards the node and cancels the remaining items; the node's dependents then
        apply their policy.

        Args:
            id, kind, after: as :meth:`node`; the node's input is ``over``'s output.
            max_parallel: items runnable at once, 0 for no limit (at most 2**31 - 1).
            max_bytes: cap on the collected output's JSON size in bytes, 0 for none
                (at most 2**63 - 1).
            max_items: cap on the number of elements of ``over``'s list, 0 for none
                (at most 2**31 - 1).
            **options: ``queue``, ``priority``, ``max_attempts``, ``timeout``,
                ``retention``, ``on_dep_failure`` and the flow keys of the item tasks,
                as :meth:`node`; a key given as ``cyclone.ItemKey("field")`` is read
                from each item (the text of that field; no key without it).

        Raises:
            WorkflowError: as :meth:`node`, or a bad ``max_parallel`` / ``max_bytes`` /
                ``max_items`` (not an int, a bool, negative, or too large), naming it.
        """
        limits = (
            (max_parallel, "max_parallel", _INT32),
            (max_bytes, "max_bytes", _INT64),
            (max_items, "max_items", _INT32),
        )
        for value, what, ceiling in limits:
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise WorkflowError(f"fan-out {id!r}: {what} must be an int >= 0, got {value!r}")
            if value > ceiling:
                raise WorkflowError(f"fan-out {id!r}: {what} is too large: {value}")
        given = {name: options.pop(name, None) for name in FLOW_KEYS}  # type: ignore[misc]
        keys = flow_keys(f"fan-out {id!r}", items=True, **given)
        node = self.node(
            id,
            kind,
            after=after,
            input_from=over,
            **options,
        )
        spec = self._nodes[node.id]
        has_output = spec.handler.has_output if spec.handler is not None else True
        self._nodes[node.id] = replace(
            spec,
            fan_out_parallel=max_parallel,
            fan_out_max_bytes=max_bytes if has_output else None,
            fan_out_max_items=max_items,
            keys=keys,
        )
        return node

    def child(
        self,
        id: str,
        workflow: Workflow,
        *,
        needs_result: bool = True,
        after: Iterable[NodeRef] = (),
        input_from: NodeRef | None = None,
        inputs: Sequence[NodeRef] | Mapping[str, NodeRef] | None = None,
        assembly: Assembly = "tuple",
        input: Any = None,
        on_dep_failure: DepPolicy = "fail_run",
    ) -> Node:
        """Declare a child node: when reached it starts a run of ``workflow`` (its input
        is the node's input) and waits in ``waiting_child``; it completes with the
        child run's result, or is discarded when the child run fails or is cancelled.

        With ``needs_result`` (default) the child workflow must declare a result.
        Cancelling the parent run cancels its child runs. A client that runs the parent
        workflow knows the child's definition from it.

        Raises:
            WorkflowError: as :meth:`node`; ``workflow`` is not a Workflow, is this
                workflow, or has no result while ``needs_result`` is true.
        """
        if not isinstance(workflow, Workflow):
            raise WorkflowError(f"child {id!r}: expected a cyclone.Workflow, got {workflow!r}")
        if workflow is self or workflow.name == self.name:
            raise WorkflowError(f"child {id!r}: a workflow cannot be its own child")
        if needs_result and workflow.result_node is None:
            raise WorkflowError(
                f"child {id!r}: workflow {workflow.name!r} declares no result "
                "(call its .result(node), or pass needs_result=False)"
            )
        node_id, where = self._new_id(id)
        edges = _Edges(after, input_from, inputs, assembly, input)
        spec = self._spec(
            node_id,
            where,
            "@child",
            None,
            edges,
            on_dep_failure=on_dep_failure,
            overrides={},
            child=workflow,
            child_needs_result=bool(needs_result),
        )
        return self._add(spec)

    def children(self) -> list[Workflow]:
        """The workflows its child nodes start (directly)."""
        return [spec.child for spec in self._nodes.values() if spec.child is not None]

    def _new_id(self, id: Any) -> tuple[str, str]:
        node_id = check_id(id, "node id")
        if "[" in node_id or "]" in node_id:
            raise WorkflowError(f"node id {node_id!r} may not contain '[' or ']'")
        if node_id in self._nodes:
            raise WorkflowError(f"workflow {self.name!r}: duplicate node id {node_id!r}")
        return node_id, f"node {node_id!r} of workflow {self.name!r}"

    def _after(self, after: Any, where: str) -> tuple[str, ...]:
        if isinstance(after, str | Node):
            after = [after]
        if not isinstance(after, Iterable):
            raise WorkflowError(f"{where}: after must be a list of nodes, got {after!r}")
        return tuple(dict.fromkeys(self._ref(ref, f"after of {where}") for ref in after))

    def _add(self, spec: NodeSpec) -> Node:
        if len(self._nodes) >= _MAX_NODES:
            raise WorkflowError(f"workflow {self.name!r} has more than {_MAX_NODES} nodes")
        self._nodes[spec.id] = spec
        self._fingerprint = self._order = None
        self.revision += 1
        return Node(spec.id, self.name)

    def signal_names(self) -> set[str]:
        """Every signal name a wait node of this workflow declares."""
        return {n for spec in self._nodes.values() for n in signals_of(spec)}

    def result(self, node: NodeRef) -> None:
        """Make ``node``'s output the run result (``cyclone_runs.result_node``).

        Raises:
            WorkflowError: ``node`` is not a node of this workflow.
        """
        node_id = self._ref(node, f"result of workflow {self.name!r}")
        if node_id not in self._nodes:
            raise WorkflowError(f"workflow {self.name!r}: result node {node_id!r} is not declared")
        self._result = node_id
        self._fingerprint = None
        self.revision += 1

    def _ref(self, ref: Any, what: str) -> str:
        if isinstance(ref, Node):
            if ref.workflow != self.name:
                raise WorkflowError(f"{what}: {ref.id!r} is a node of workflow {ref.workflow!r}")
            return ref.id
        if isinstance(ref, str):
            return check_id(ref, what)
        raise WorkflowError(f"{what}: expected a node or a node id, got {ref!r}")

    def validate(self) -> list[str]:
        """Check the whole graph; the node ids in topological order.

        Ties keep declaration order, so a workflow declared upstream-first keeps its
        order. Submit calls this; so does a client registering the workflow.

        Raises:
            WorkflowError: no nodes, an unknown dependency, or a cycle (named).
        """
        if self._order is None:
            self._order = topological_order(self.name, self._nodes)
        return self._order

    @property
    def def_version(self) -> str:
        """A stable fingerprint of the serialized DAG: 32 hex digits
        (:func:`cyclone.dag.fingerprint`).

        Raises:
            WorkflowError: the graph is invalid (see :meth:`validate`).
        """
        if self._fingerprint is None:
            self.validate()
            self._fingerprint = fingerprint(self.name, self._result, self._nodes.values())
        return self._fingerprint

    def kinds(self) -> dict[str, Handler | None]:
        """The kinds its nodes run: name -> handler (``None`` when given by name)."""
        found: dict[str, Handler | None] = {}
        for spec in self._nodes.values():
            if found.get(spec.kind) is None:
                found[spec.kind] = spec.handler
        return found
