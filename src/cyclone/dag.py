"""The model of a static DAG and the checks on it: nodes, topological order, cycles,
and the ``def_version`` fingerprint.

A :class:`NodeSpec` is one declared node (its kind, edges, input binding, options); the
builder (:class:`cyclone.Workflow`) makes them. :func:`topological_order` validates a
graph and orders it; :func:`fingerprint` hashes its shape. Pure code, no I/O.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from cyclone.errors import ValidationError, WorkflowError
from cyclone.flow import ItemKey
from cyclone.handlers import Handler
from cyclone.options import CENTURY, check_text, seconds

if TYPE_CHECKING:
    from cyclone.workflow import Workflow

__all__ = [
    "Assembly",
    "DepPolicy",
    "Node",
    "NodeRef",
    "NodeSpec",
    "check_duration",
    "check_id",
    "fan_in",
    "fingerprint",
    "signals_of",
    "topological_order",
]

Assembly = Literal["tuple", "array"]
"""How ``inputs=`` sources are assembled into one input."""
DepPolicy = Literal["fail_run", "cancel_branch"]
"""What a node does when a node upstream of it is discarded."""


@dataclass(frozen=True, slots=True)
class Node:
    """A reference to a node of a workflow, returned by :meth:`Workflow.node`.

    Pass it to ``after=``, ``input_from=``, ``inputs=`` and :meth:`Workflow.result`;
    a node id string works too.
    """

    __module__ = "cyclone"

    id: str
    workflow: str

    def __str__(self) -> str:
        return self.id


NodeRef = Node | str


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One declared node: its kind, edges, input binding and options.

    ``input`` is the constant input as JSON text, or ``None``. ``input_names`` are the
    names of ``inputs`` (aligned, slot order) when they were given as a mapping, else
    ``None``. ``overrides`` are the options given at definition; the kind's defaults
    fill the rest at submit.
    """

    id: str
    kind: str
    handler: Handler | None
    after: tuple[str, ...]
    input_from: str | None
    inputs: tuple[str, ...]
    assembly: Assembly
    input: str | None
    overrides: Mapping[str, Any]
    on_dep_failure: DepPolicy
    wait_for: float | None = None
    signal_name: str | None = None
    signal_names: tuple[str, ...] | None = None
    wait_count: int | None = None
    fan_out_parallel: int | None = None
    fan_out_max_bytes: int | None = None
    fan_out_max_items: int | None = None
    child: Workflow | None = None
    child_needs_result: bool | None = None
    keys: Mapping[str, str | ItemKey] = field(default_factory=dict)
    """The node's flow keys by name (``concurrency_key``, ``rate_key``,
    ``fairness_key``): a key, or an :class:`cyclone.ItemKey` of a fan-out's items."""
    input_names: tuple[str, ...] | None = None

    @property
    def takes_run_input(self) -> bool:
        """True when the node's input is the run input: no data edge, no constant
        input, and a node that takes an input (not a sleep or signal wait)."""
        return (
            self.input is None
            and self.input_from is None
            and not self.inputs
            and self.kind not in ("@sleep", "@signal")
        )

    @property
    def deps(self) -> dict[str, str]:
        """Every upstream node -> ``"data"`` or ``"control"``, in declaration order."""
        deps = dict.fromkeys(self.after, "control")
        for dep in (self.input_from, *self.inputs):
            if dep is not None:
                deps[dep] = "data"
        return deps


def topological_order(name: str, nodes: Mapping[str, NodeSpec]) -> list[str]:
    """The node ids of workflow ``name`` in topological order, ties in declaration
    order (the order of ``nodes``).

    Raises:
        WorkflowError: no nodes, an unknown dependency, or a cycle (named).
    """
    if not nodes:
        raise WorkflowError(f"workflow {name!r} has no nodes")
    for spec in nodes.values():
        for dep in spec.deps:
            if dep not in nodes:
                raise WorkflowError(
                    f"workflow {name!r}: node {spec.id!r} depends on unknown node {dep!r}"
                )
    waiting = {node_id: len(spec.deps) for node_id, spec in nodes.items()}
    dependents: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    for spec in nodes.values():
        for dep in spec.deps:
            dependents[dep].append(spec.id)
    ids = list(nodes)
    rank = {node_id: i for i, node_id in enumerate(ids)}
    ready = [rank[node_id] for node_id, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        node_id = ids[heapq.heappop(ready)]
        order.append(node_id)
        for child in dependents[node_id]:
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, rank[child])
    if len(order) < len(nodes):
        stuck = [node_id for node_id, n in waiting.items() if n > 0]
        raise WorkflowError(f"workflow {name!r} has a cycle through nodes {_cycle(stuck, nodes)}")
    return order


def fingerprint(name: str, result: str | None, nodes: Iterable[NodeSpec]) -> str:
    """A stable fingerprint of a validated DAG: 32 hex digits.

    Computed from the workflow name, each node's id, kind, edges (with their type),
    input bindings (slot order, assembly, and the input names of named bindings) and
    the result node, serialized as
    canonical JSON and hashed with SHA-256. The same definition gives the same string
    in every process and Python version; changing topology, kinds or edges changes it.
    Options (queue, priority, attempts, timeouts, retention, failure policy) and
    constant inputs are stored per step at submit and do not change it.
    """
    shape = {
        "workflow": name,
        "result": result,
        "nodes": [
            [
                spec.id,
                spec.kind,
                sorted(spec.deps.items()),
                spec.input_from,
                list(spec.inputs),
                spec.assembly if spec.inputs else None,
                *([["names", list(spec.input_names)]] if spec.input_names else []),
                *_wait_shape(spec),
            ]
            for spec in sorted(nodes, key=lambda s: s.id)
        ],
    }
    text = json.dumps(shape, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _wait_shape(spec: NodeSpec) -> list[Any]:
    """The fingerprinted shape of a wait or fan-out node (nothing for a plain node).

    A fan-out whose items take a key from their item (:class:`cyclone.ItemKey`) adds
    the fields it reads: a change of field is a change of definition.
    """
    if spec.fan_out_parallel is not None:
        fields = item_fields(spec)
        return ["fan_out", fields] if fields else ["fan_out"]
    if spec.child is not None:
        return ["child", spec.child.name, spec.child.def_version, spec.child_needs_result]
    if not spec.kind.startswith("@"):
        return []
    return [spec.wait_for, spec.signal_name, list(spec.signal_names or ()), spec.wait_count]


def item_fields(spec: NodeSpec) -> dict[str, str]:
    """The item fields a fan-out's keys are read from: key name -> field name."""
    return {name: key.field for name, key in spec.keys.items() if isinstance(key, ItemKey)}


def literal_keys(spec: NodeSpec) -> dict[str, str | None]:
    """The node's literal flow keys (an :class:`cyclone.ItemKey` counts as none)."""
    return {
        name: (key if isinstance(key, str) else None)
        for name, key in ((n, spec.keys.get(n)) for n in FLOW_KEYS)
    }


FLOW_KEYS = ("concurrency_key", "rate_key", "fairness_key")
"""The options of a node or an enqueue that group its steps for flow control."""


def flow_keys(where: str, *, items: bool = False, **keys: Any) -> dict[str, str | ItemKey]:
    """A node's flow keys (``None`` values dropped), each a key or, when ``items``
    (a fan-out), an :class:`cyclone.ItemKey`.

    Raises:
        WorkflowError: a key that is not a non-empty string without NUL of at most
            1,024 bytes, or an ``ItemKey`` on a node that is not a fan-out, naming it.
    """
    found: dict[str, str | ItemKey] = {}
    for name, value in keys.items():
        if value is None:
            continue
        if isinstance(value, ItemKey):
            if not items:
                raise WorkflowError(
                    f"{where}: {name}=ItemKey({value.field!r}) applies to fan-out items only"
                )
            found[name] = value
            continue
        try:
            found[name] = check_text(value, f"{name} of {where}")
        except ValidationError as exc:
            raise WorkflowError(str(exc)) from None
    return found


def fan_in(
    inputs: Any, where: str, ref: Callable[[Any, str], str]
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """A node's ``inputs=``: its source node ids in slot order (each read by ``ref``),
    and their input names when ``inputs`` is a mapping of names to nodes (``None`` for
    a list, and for no ``inputs``).

    Raises:
        WorkflowError: ``inputs`` is neither a non-empty list of nodes nor a non-empty
            mapping of names to nodes, or a name is not a non-empty string without NUL
            of at most 1,024 bytes, or is given twice, naming it.
    """
    if inputs is None:
        return (), None
    if isinstance(inputs, Mapping):
        if not inputs:
            raise WorkflowError(f"{where}: inputs must name at least one node, got {{}}")
        names = tuple(check_id(name, f"input name of {where}") for name in inputs)
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise WorkflowError(f"{where}: input name {twice[0]!r} is given twice")
        sources = tuple(
            ref(node, f"input {name!r} of {where}")
            for name, node in zip(names, inputs.values(), strict=True)
        )
        return sources, names
    if isinstance(inputs, str | Node) or not isinstance(inputs, Sequence) or not inputs:
        raise WorkflowError(
            f"{where}: inputs must be a non-empty list of nodes, or a dict of input "
            f"names to nodes, got {inputs!r}"
        )
    return tuple(ref(node, f"inputs of {where}") for node in inputs), None


def _cycle(stuck: list[str], nodes: Mapping[str, NodeSpec]) -> str:
    """One cycle among the ``stuck`` nodes, as ``a -> b -> a``."""
    members = set(stuck)
    path: list[str] = []
    seen: dict[str, int] = {}
    current = stuck[0]
    while current not in seen:
        seen[current] = len(path)
        path.append(current)
        current = next(dep for dep in nodes[current].deps if dep in members)
    loop = [*path[seen[current] :], current]
    return " -> ".join(repr(n) for n in reversed(loop))


def signals_of(spec: NodeSpec) -> list[str]:
    """The signal names a wait node waits for (none for another node)."""
    return ([spec.signal_name] if spec.signal_name else []) + list(spec.signal_names or ())


def check_duration(value: Any, what: str, *, required: bool = False) -> float | None:
    """A wait's duration in seconds (``timedelta`` or seconds, above 0, at most a
    century), or ``None`` when not given.

    Raises:
        WorkflowError: a bad duration, or none where ``required``, naming ``what``.
    """
    if value is None:
        if required:
            raise WorkflowError(f"{what} is required")
        return None
    try:
        return seconds(value, what, minimum=0.000001, maximum=CENTURY)
    except ValidationError as exc:
        raise WorkflowError(str(exc)) from None


def check_id(value: Any, what: str) -> str:
    """A workflow, node, kind or signal name: non-empty text of at most 256 bytes.

    Raises:
        WorkflowError: a bad name, naming ``what``.
    """
    try:
        text = check_text(value, what)
    except ValidationError as exc:
        raise WorkflowError(str(exc)) from None
    if not text:
        raise WorkflowError(f"{what} must not be empty")
    return text
