"""Configuration shared by ``Client`` and ``SyncClient``: kinds, defaults, checks.

Pure code (no I/O): the registry of kinds whose defaults an enqueue by name applies, the
default retention, the validation of a caller's connection for ``*_tx`` calls, the
tracking of caller transactions for wakeups, the parameters of run listings, and the
validation of schedules.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from psycopg import pq

from cyclone.errors import ValidationError, WorkflowError
from cyclone.handlers import Handler
from cyclone.options import Duration, JobOptions, check_int, check_kind, check_text, seconds
from cyclone.producer import EnqueueRequest, KindTarget
from cyclone.schedules import ScheduleSpec
from cyclone.states import RunState
from cyclone.submit import CompiledWorkflow, SubmitRequest, check_submit_options, compile_workflow
from cyclone.workflow import Workflow

__all__ = [
    "ENQUEUE_OPTIONS",
    "KEEP",
    "MANY_OPTIONS",
    "ClientConfig",
    "WakeupTracker",
    "list_runs_params",
]


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "KEEP"


KEEP = Keep.KEEP
"""``update_schedule``'s default for ``input``: keep the stored input (``None`` is a
valid input)."""

_SHARED_OPTIONS = frozenset(
    {
        "queue",
        "priority",
        "scheduled_at",
        "max_attempts",
        "timeout",
        "sequence_key",
        "retention",
        "concurrency_key",
        "rate_key",
        "fairness_key",
    }
)
ENQUEUE_OPTIONS = _SHARED_OPTIONS | {"unique_key", "submit_key"}
"""The keyword options of ``enqueue`` (:class:`cyclone.producer.EnqueueOptions`)."""
MANY_OPTIONS = _SHARED_OPTIONS | {"submit_keys"}
"""The keyword options of ``enqueue_many`` (:class:`cyclone.producer.ManyOptions`)."""


class WakeupTracker:
    """Queues that received work in a caller's transaction, to announce after commit.

    Returned by ``track_wakeups(conn)``; every ``enqueue_tx`` on that connection records
    its queue here. After the caller commits, ``publish_wakeups(tracker)`` sends them.
    """

    __module__ = "cyclone"

    def __init__(self) -> None:
        self.queues: set[str] = set()

    def __repr__(self) -> str:
        return f"<cyclone.WakeupTracker queues={sorted(self.queues)}>"


class ClientConfig:
    """The validated, shared configuration of ``Client`` and ``SyncClient``.

    Holds the registry of kinds (for their default options), the default retention,
    the schema, and the tracking of caller transactions. Pure: no I/O.
    """

    def __init__(
        self,
        *,
        handlers: Iterable[Handler],
        schema: str,
        retention: Duration | None,
        notify: bool,
        workflows: Iterable[Workflow] = (),
    ) -> None:
        registry: dict[str, Handler] = {}
        if isinstance(workflows, Workflow) or not isinstance(workflows, Iterable):
            raise ValidationError(f"workflows must be a list of workflows, got {workflows!r}")
        workflow_list = list(workflows)
        for wf in workflow_list:
            if not isinstance(wf, Workflow):
                raise ValidationError(f"workflows must be cyclone.Workflow objects, got {wf!r}")
        for wf in workflow_list:  # child workflows run here too (appended while iterating)
            for child in wf.children():
                if all(child is not known for known in workflow_list):
                    workflow_list.append(child)
        node_handlers = [
            handler
            for wf in workflow_list
            for handler in wf.kinds().values()
            if handler is not None
        ]
        for handler in [*handlers, *node_handlers]:
            if not isinstance(handler, Handler):
                raise ValidationError(
                    f"handlers must be kinds made with @cyclone.step or @cyclone.action, "
                    f"got {handler!r}"
                )
            if handler.kind in registry and registry[handler.kind] is not handler:
                raise ValidationError(f"kind {handler.kind!r} is registered twice")
            registry[handler.kind] = handler
        self.handlers = registry
        self.schema = schema
        self.retention = seconds(retention, "retention", allow_zero=True)
        if not isinstance(notify, bool):
            raise ValidationError(f"notify must be True or False, got {notify!r}")
        self.notify = notify
        self.trackers: weakref.WeakKeyDictionary[Any, WakeupTracker] = weakref.WeakKeyDictionary()
        self._compiled: weakref.WeakKeyDictionary[Workflow, tuple[int, CompiledWorkflow]] = (
            weakref.WeakKeyDictionary()
        )
        self.workflows: dict[str, list[str]] = {}
        """Registered workflow name -> the def_versions this client runs."""
        self.workflow_queues: set[str] = set()
        """The queues of every node of the registered workflows."""
        self.definitions: dict[str, CompiledWorkflow] = {}
        """Registered workflows (children included) by def_version."""
        self.parents: frozenset[str] = frozenset()
        """The def_versions of :attr:`definitions` that have child nodes."""
        for wf in workflow_list:
            compiled = self.compile(wf)
            self.definitions[compiled.def_version] = compiled
            self.workflow_queues.update(compiled.all_queues)
            versions = self.workflows.setdefault(wf.name, [])
            if compiled.def_version not in versions:
                versions.append(compiled.def_version)
        self.parents = frozenset(v for v, d in self.definitions.items() if d.children)

    def compile(self, wf: Workflow) -> CompiledWorkflow:
        """``wf`` validated against this client's kinds and laid out as rows (cached
        until the workflow changes).

        Raises:
            WorkflowError: an invalid graph, an unknown kind or a bad option.
        """
        if not isinstance(wf, Workflow):
            raise WorkflowError(f"expected a cyclone.Workflow, got {wf!r}")
        cached = self._compiled.get(wf)
        if cached is not None and cached[0] == wf.revision:
            return cached[1]
        compiled = compile_workflow(wf, self.handlers, self.retention)
        self._compiled[wf] = (wf.revision, compiled)
        return compiled

    def submit_request(self, wf: Workflow, input: Any = None, **options: Any) -> SubmitRequest:
        """Validate one submit.

        Raises:
            WorkflowError: an invalid workflow.
            ValidationError: a bad input or option, or an unknown option name.
        """
        check_submit_options(options)
        return SubmitRequest.build(self.compile(wf), input, **options)

    def request(
        self, target: KindTarget, input: Any = None, *, many: bool = False, **options: Any
    ) -> EnqueueRequest:
        """Validate one enqueue (or many, with ``many=True``).

        Raises:
            ValidationError: a bad kind, input or option, or an unknown option name.
        """
        allowed = MANY_OPTIONS if many else ENQUEUE_OPTIONS
        unknown = set(options) - allowed
        if unknown:
            raise ValidationError(
                f"unknown option(s) {sorted(unknown)}; the options are {sorted(allowed)}"
            )
        return EnqueueRequest.build(
            target,
            input,
            registry=self.handlers,
            default_retention=self.retention,
            many=many,
            **options,
        )

    def schedule_target(self, target: Any) -> tuple[str, str | None, Handler | None]:
        """``(kind, def_version, handler)`` of a schedule's target.

        A workflow pins its current definition; a kind given by name takes the
        registered kind's defaults, if any.

        Raises:
            WorkflowError: an invalid workflow.
            ValidationError: not a kind, a kind name nor a workflow.
        """
        if isinstance(target, Workflow):
            return target.name, self.compile(target).def_version, None
        if isinstance(target, Handler):
            return target.kind, None, target
        kind = check_kind(target)
        return kind, None, self.handlers.get(kind)

    def schedule_spec(
        self,
        schedule_id: Any,
        target: Any,
        input: Any,
        *,
        cron: Any,
        location: Any,
        options: Mapping[str, Any],
    ) -> ScheduleSpec:
        """Validate a new schedule (``create_schedule``).

        Raises:
            ValidationError: naming the first bad value; WorkflowError: a bad workflow.
        """
        kind, def_version, handler = self.schedule_target(target)
        return ScheduleSpec.build(
            schedule_id,
            kind=kind,
            def_version=def_version,
            input=input,
            cron=cron,
            location=location,
            handler=handler,
            default_retention=self.retention,
            options=options,
        )

    def schedule_rebuild(
        self,
        *,
        target: Any,
        input: Any,
        cron: Any,
        location: Any,
        options: Mapping[str, Any],
    ) -> Callable[[dict[str, Any]], ScheduleSpec]:
        """How ``update_schedule`` turns the stored row into the new definition.

        ``None`` for ``target``, ``cron``, ``location`` or an option keeps the stored
        value, :data:`KEEP` for ``input`` keeps the stored input. A kind schedule keeps
        its stored step options (also when its target changes to another kind) and the
        given ones override them; a workflow schedule turned into a kind schedule takes
        the kind's defaults.
        """

        def rebuild(row: dict[str, Any]) -> ScheduleSpec:
            if target is None:
                kind, def_version = row["kind"], row["def_version"]
                handler = self.handlers.get(kind) if def_version is None else None
            else:
                kind, def_version, handler = self.schedule_target(target)
            defaults: JobOptions | None = None
            if def_version is None and row["def_version"] is None:  # a kind stays a kind
                defaults = JobOptions(
                    queue=row["queue"],
                    priority=row["priority"],
                    max_attempts=row["max_attempts"],
                    timeout=row["timeout_s"],
                    retention=row["retention_s"],
                )
            kept = input is KEEP
            return ScheduleSpec.build(
                row["id"],
                kind=kind,
                def_version=def_version,
                input=row["input"] if kept else input,
                input_is_json=kept,
                cron=row["cron_spec"] if cron is None else cron,
                location=row["location"] if location is None else location,
                handler=handler,
                default_retention=self.retention,
                options=options,
                defaults=defaults,
            )

        return rebuild

    def check_tx_conn(self, conn: Any, expected: type[Any]) -> None:
        """Refuse a connection a ``*_tx`` call cannot join; record nothing.

        Raises:
            ValidationError: not a ``expected`` connection, closed, in autocommit mode,
                or in a failed transaction.
        """
        if not isinstance(conn, expected):
            raise ValidationError(
                f"expected a {expected.__module__}.{expected.__qualname__} inside a transaction, "
                f"got {conn!r}"
            )
        if conn.closed:
            raise ValidationError(f"connection {conn!r} is closed")
        status = conn.info.transaction_status
        if status == pq.TransactionStatus.INERROR:
            raise ValidationError(f"connection {conn!r} is in a failed transaction")
        if conn.autocommit and status == pq.TransactionStatus.IDLE:
            raise ValidationError(
                f"connection {conn!r} is in autocommit mode outside a transaction; "
                "*_tx calls join a transaction"
            )

    def tracker_for(self, conn: Any) -> WakeupTracker:
        """The tracker of ``conn``, made on first use.

        Raises:
            ValidationError: ``conn`` cannot be tracked (it cannot be a weak dictionary
                key, as ``django.db.connection``, whose wakeups go out at its commit
                anyway, or a value such as a string or ``None``).
        """
        try:
            tracker = self.trackers.get(conn)
            if tracker is None:
                tracker = self.trackers[conn] = WakeupTracker()
        except TypeError:
            raise ValidationError(
                f"cannot track wakeups of {conn!r}: expected the connection (or session) "
                "that *_tx calls are given"
            ) from None
        return tracker

    def track(self, conn: Any, queues: Iterable[str]) -> bool:
        """Record queues for the tracker of ``conn``, if it is tracked; whether it is."""
        try:
            tracker = self.trackers.get(conn)
        except TypeError:  # unhashable (django.db.connection): cannot have been tracked
            return False
        if tracker is None:
            return False
        tracker.queues.update(queues)
        return True


def list_runs_params(
    state: RunState | str | None, workflow: str | None, limit: int, before: int | None
) -> dict[str, Any]:
    """Validated parameters of ``runs_list``.

    Raises:
        ValidationError: an unknown state, a bad limit, ``before`` or workflow.
    """
    if state is not None:
        try:
            state = RunState(state).value
        except ValueError:
            raise ValidationError(
                f"state must be one of {[s.value for s in RunState]}, got {state!r}"
            ) from None
    check_int(limit, "limit", 1, 100_000)
    if before is not None:
        check_int(before, "before", 1, 2**63 - 1)
    if workflow is not None:
        check_text(workflow, "workflow")
    return {"state": state, "workflow": workflow, "limit": limit, "before_id": before}
