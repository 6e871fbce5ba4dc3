"""Submitting workflow runs: the rows of a DAG, validated, and the statements to write them.

Pure code shared by ``Client.submit``, ``SyncClient.submit`` and
``Context.submit_completion``. A workflow is compiled once per client registry into
three JSON texts (nodes, dependency edges, input bindings); each submit then writes the
run, every step, every edge and every binding with one statement (``runs_submit``), a
few round trips for a DAG of any size. Roots start ``available``, the rest ``pending``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from cyclone.dag import item_fields, literal_keys
from cyclone.dbio import Plan, Stmt
from cyclone.errors import StateError, ValidationError, WorkflowError
from cyclone.handlers import Handler
from cyclone.options import Duration, JobOptions, check_text, micros, seconds
from cyclone.payloads import PLAIN, Codec, check_decodes, encode_json
from cyclone.records import Submitted
from cyclone.sql import Q
from cyclone.sql.rows import IdRow, RunVersionRow
from cyclone.workflow import NodeSpec, Workflow

__all__ = [
    "SUBMIT_OPTIONS",
    "CompiledWorkflow",
    "SubmitOptions",
    "SubmitRequest",
    "check_submit_options",
    "compile_workflow",
    "submit_plan",
]

_KEY_RETRIES = 5
MAX_GRAPH_CHARS = 200 * 1024 * 1024
"""Most characters of node JSON (constant inputs included) one submit carries: PostgreSQL
caps the total size of a jsonb array's elements at 256 MiB."""


class SubmitOptions(TypedDict, total=False):
    """The keyword options of ``submit``.

    Attributes:
        submit_key: submit-once key: while a run of the workflow with this key exists
            (in any state, until it is purged), submitting again returns that run with
            ``duplicate=True``.
        deadline: the run fails if not finished this long after submit (``timedelta``
            or seconds; enforced by the deadline scanner).
    """

    submit_key: str
    deadline: Duration


SUBMIT_OPTIONS = frozenset(SubmitOptions.__annotations__)


@dataclass(frozen=True, slots=True)
class CompiledWorkflow:
    """A validated workflow as the parameters of ``runs_submit`` (JSON texts).

    ``queues`` are the queues of its root steps, announced after submit;
    ``all_queues`` those of every node (a worker registering the workflow serves them).
    """

    name: str
    def_version: str
    result_node: str | None
    nodes: str
    deps: str
    inputs: str
    queues: frozenset[str]
    all_queues: frozenset[str]
    has_fan_out: bool = False
    retention_us: int | None = None
    """The run's retention in microseconds: the longest of its nodes' (``None`` when a
    node keeps its run forever); the purge finds expired runs by it."""
    children: Mapping[str, CompiledWorkflow] = field(default_factory=dict)
    """Child node id -> the compiled workflow it starts."""
    input_checks: tuple[tuple[str, Codec], ...] = ()
    """The nodes that take the run input whose handler decodes it into a dataclass or a
    pydantic model (those of a child node taking it included), each as (what it is,
    for the error, the handler's codec): a submit checks the run input against each."""


def compile_workflow(
    wf: Workflow, registry: Mapping[str, Handler], default_retention: float | None
) -> CompiledWorkflow:
    """Validate ``wf`` against the kinds a client knows and lay out its rows.

    A node given a handler takes that handler's defaults; a node given a kind name
    takes the defaults of the registered kind of that name.

    Raises:
        WorkflowError: an invalid graph, an unknown kind, or a bad option.
    """
    if not isinstance(wf, Workflow):
        raise WorkflowError(f"expected a cyclone.Workflow, got {wf!r}")
    order = wf.validate()
    nodes: list[dict[str, Any]] = []
    deps: list[dict[str, Any]] = []
    inputs: list[dict[str, Any]] = []
    roots: set[str] = set()
    for node_id in order:
        spec = wf.nodes[node_id]
        options = _node_options(wf, spec, registry)
        retention = options.retention if options.retention is not None else default_retention
        edges = spec.deps
        if not edges:
            roots.add(options.queue)
        nodes.append(
            {
                "node": node_id,
                "kind": spec.kind,
                "root": not edges,
                "input": None if spec.input is None else json.loads(spec.input),
                "input_from": spec.input_from,
                "queue": options.queue,
                "priority": options.priority,
                "max_attempts": options.max_attempts,
                "timeout_us": micros(options.timeout),
                "retention_us": micros(retention),
                "on_dep_failure": spec.on_dep_failure,
                "wait_for_us": micros(spec.wait_for),
                "signal_name": spec.signal_name,
                "signal_names": list(spec.signal_names) if spec.signal_names else None,
                "wait_count": spec.wait_count,
                "fan_out_parallel": spec.fan_out_parallel,
                "fan_out_max_bytes": spec.fan_out_max_bytes,
                "fan_out_max_items": spec.fan_out_max_items,
                "child_workflow": spec.child.name if spec.child is not None else None,
                "child_needs_result": spec.child_needs_result,
                **literal_keys(spec),
                "item_keys": item_fields(spec) or None,
            }
        )
        deps.extend({"node": node_id, "dep_node": d, "dep_type": t} for d, t in edges.items())
        inputs.extend(
            {"node": node_id, "slot": slot, "dep_node": d, "assembly_mode": spec.assembly}
            | ({"input_name": spec.input_names[slot]} if spec.input_names else {})
            for slot, d in enumerate(spec.inputs)
        )
    nodes_text = json.dumps(nodes, separators=(",", ":"))
    if len(nodes_text) > MAX_GRAPH_CHARS:
        raise WorkflowError(
            f"workflow {wf.name!r} is {len(nodes_text)} characters of JSON with its constant "
            f"inputs, over the {MAX_GRAPH_CHARS} a submit can carry; pass large inputs as "
            "the run input or through upstream outputs"
        )
    children = {
        spec.id: compile_workflow(spec.child, registry, default_retention)
        for spec in wf.nodes.values()
        if spec.child is not None
    }
    kept = [node["retention_us"] for node in nodes]
    return CompiledWorkflow(
        input_checks=_input_checks(wf, registry, children),
        children=children,
        retention_us=None if None in kept else max(kept, default=None),
        has_fan_out=any(spec.fan_out_parallel is not None for spec in wf.nodes.values()),
        name=wf.name,
        def_version=wf.def_version,
        result_node=wf.result_node,
        nodes=nodes_text,
        deps=json.dumps(deps, separators=(",", ":")),
        inputs=json.dumps(inputs, separators=(",", ":")),
        queues=frozenset(roots),
        all_queues=frozenset(node["queue"] for node in nodes),
    )


def _input_checks(
    wf: Workflow, registry: Mapping[str, Handler], children: Mapping[str, CompiledWorkflow]
) -> tuple[tuple[str, Codec], ...]:
    """The run-input checks of ``wf`` (:attr:`CompiledWorkflow.input_checks`): its
    nodes that take the run input with a handler that decodes it into a model, and
    those of the child workflow a child node taking the run input starts."""
    checks: list[tuple[str, Codec]] = []
    for spec in wf.nodes.values():
        if not spec.takes_run_input:
            continue
        if spec.id in children:
            checks.extend(
                (f"{what} of child workflow {children[spec.id].name!r} (node {spec.id!r})", c)
                for what, c in children[spec.id].input_checks
            )
            continue
        handler = spec.handler or registry.get(spec.kind)
        if handler is not None and handler.codec.model is not None:
            checks.append((f"node {spec.id!r} (kind {spec.kind!r})", handler.codec))
    return tuple(checks)


_WAIT_KINDS = frozenset({"@sleep", "@signal", "@child"})
"""The kinds of wait nodes, which run no handler. The state each enters when it is
reached is decided in SQL, by cyclone_reached_state_v1 (migration 5)."""


def _node_options(wf: Workflow, spec: NodeSpec, registry: Mapping[str, Handler]) -> JobOptions:
    if spec.kind in _WAIT_KINDS:
        return JobOptions()
    handler = spec.handler or registry.get(spec.kind)
    if handler is None:
        raise WorkflowError(
            f"workflow {wf.name!r}: node {spec.id!r} runs unknown kind {spec.kind!r} "
            "(pass the handler, or register the kind with the client)"
        )
    try:
        return handler.options.override(**spec.overrides)
    except ValidationError as exc:
        raise WorkflowError(f"node {spec.id!r} of workflow {wf.name!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    """One validated submit: the compiled workflow and the run's parameters."""

    workflow: CompiledWorkflow
    params: dict[str, Any]
    submit_key: str | None

    @classmethod
    def build(
        cls,
        compiled: CompiledWorkflow,
        input: Any,
        *,
        submit_key: str | None = None,
        deadline: Duration | None = None,
        parent: tuple[int, str] | None = None,
    ) -> SubmitRequest:
        """Validate the run input and options.

        The run input is decoded as a worker will for each node that takes it whose
        handler's input is annotated with a dataclass or a pydantic model
        (:attr:`CompiledWorkflow.input_checks`; the child workflow's nodes for a child
        node that takes it), so that a wrong shape is refused before anything is
        written; not for a child run (``parent`` given), whose input the engine
        assembled from upstream outputs: a wrong shape fails its steps.

        Raises:
            ValidationError: a non-JSON input, an input that does not fit a node's
                model (naming the workflow, the node, its kind, the model and the
                problem), a bad ``submit_key`` or ``deadline``.
        """
        what = f"input of workflow {compiled.name!r}"
        encoded = encode_json(PLAIN.encode(input), what)
        if parent is None:
            for node, codec in compiled.input_checks:
                check_decodes(codec, encoded, f"{what}, taken by {node},")
        if submit_key is not None:
            check_text(submit_key, "submit_key")
        limit = seconds(deadline, "deadline")
        params = {
            "workflow": compiled.name,
            "def_version": compiled.def_version,
            "input": encoded,
            "result_node": compiled.result_node,
            "has_fan_out": compiled.has_fan_out,
            "run_retention_us": compiled.retention_us,
            "parent_run_id": parent[0] if parent else None,
            "parent_node_id": parent[1] if parent else None,
            "submit_key": submit_key,
            "deadline_us": micros(limit),
            "nodes": compiled.nodes,
            "deps": compiled.deps,
            "inputs": compiled.inputs,
            "traceparent": None,
        }
        return cls(workflow=compiled, params=params, submit_key=submit_key)

    def traced(self, traceparent: str | None) -> SubmitRequest:
        """This request with the run's trace context (a W3C ``traceparent``, or
        ``None``: this request unchanged)."""
        if traceparent is None:
            return self
        return replace(self, params={**self.params, "traceparent": traceparent})


def check_submit_options(options: Mapping[str, Any]) -> None:
    """Refuse unknown keyword options of ``submit``.

    Raises:
        ValidationError: naming the unknown options.
    """
    unknown = set(options) - SUBMIT_OPTIONS
    if unknown:
        raise ValidationError(
            f"unknown option(s) {sorted(unknown)}; the options are {sorted(SUBMIT_OPTIONS)}"
        )


def submit_plan(request: SubmitRequest) -> Plan[Submitted]:
    """Insert the run and its graph, or find the run that holds its ``submit_key``.

    Raises:
        StateError: the key kept changing hands (purged between insert and lookup).
    """
    for _ in range(_KEY_RETRIES):
        inserted: list[IdRow] = yield Stmt(Q.runs_submit, request.params)
        if inserted:
            return Submitted(run_id=inserted[0].id)
        if request.submit_key is None:  # pragma: no cover - an insert without a key
            break
        holders: list[RunVersionRow] = yield Stmt(
            Q.runs_find_submit_key,
            {"workflow": request.workflow.name, "submit_key": request.submit_key},
        )
        if holders:
            run_id, def_version = holders[0].id, holders[0].def_version
            if def_version == "job":
                raise StateError(
                    f"submit_key {request.submit_key!r} is held by run {run_id}, a job of "
                    f"kind {request.workflow.name!r}, not a run of that workflow"
                )
            return Submitted(run_id=run_id, duplicate=True)
    raise StateError(
        f"submit_key {request.submit_key!r} of workflow {request.workflow.name!r} kept changing"
    )
