"""The ``Context`` a handler receives with its input.

The ids of the step being run, its attempt, the completion
transaction, ``enqueue_completion``, and ``cancelled``, which turns true when a
heartbeat finds that the worker no longer holds the step (it was reclaimed, cancelled,
or passed its timeout). For an ``async def`` handler the worker also cancels the
handler's task at that moment; a plain ``def`` handler should poll ``cancelled`` or call
:meth:`Context.raise_if_cancelled` in long loops.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Unpack

from cyclone.completion import CompletionTx
from cyclone.dbio import run_plan_async, run_plan_sync
from cyclone.errors import ConfigurationError, LeaseLost
from cyclone.observability.tracing import enqueue_attributes, producer_span, submit_attributes
from cyclone.producer import EnqueueOptions, EnqueueRequest, KindTarget, enqueue_plan
from cyclone.records import Enqueued, Submitted
from cyclone.submit import SubmitOptions, SubmitRequest, submit_plan
from cyclone.workflow import Workflow

if TYPE_CHECKING:
    from cyclone.transitions import Claimed

__all__ = ["Context"]


class Context:
    """What a handler knows about the step it runs, and its completion transaction.

    The worker makes one per execution from the claimed ``step``; handlers never build
    one.

    Attributes:
        run_id: id of the run (``cyclone_runs.id``).
        step_id: id of the step (``cyclone_steps.id``).
        node: node id within the run (the kind, for a standalone run).
        kind: the handler's kind.
        workflow: the run's workflow name (the kind, for a standalone run).
        queue: the queue the step was claimed from.
        attempt: failed executions before this one (0 on the first try).
        max_attempts: executions allowed before the step is discarded.
        lease_generation: the claim's fencing token.
        trace_context: the W3C ``traceparent`` stored with the run (the trace context
            current when it was enqueued or submitted, or of its parent run or schedule
            fire), or ``None`` when none was; the step's own span, when tracing is on,
            is a child of it and current while the handler runs.
    """

    __module__ = "cyclone"
    __slots__ = (
        "_build_request",
        "_build_submit",
        "_cancelled",
        "_is_async",
        "_run_input",
        "_run_input_json",
        "_tx",
        "_wakeups",
        "attempt",
        "kind",
        "lease_generation",
        "max_attempts",
        "node",
        "queue",
        "run_id",
        "step_id",
        "trace_context",
        "workflow",
    )

    def __init__(
        self,
        step: Claimed,
        *,
        is_async: bool,
        tx: CompletionTx,
        build_request: Callable[..., EnqueueRequest],
        build_submit: Callable[..., SubmitRequest] | None = None,
    ) -> None:
        self.run_id, self.step_id, self.node = step.run_id, step.id, step.node
        self.kind, self.workflow, self.queue = step.kind, step.workflow, step.queue
        self.attempt, self.max_attempts = step.attempt, step.max_attempts
        self.lease_generation = step.generation
        self.trace_context = step.traceparent
        self._is_async, self._tx = is_async, tx
        self._build_request, self._build_submit = build_request, build_submit
        self._cancelled = False
        self._wakeups: set[str] = set()
        self._run_input: Any = step.input if step.run_input_json is None else None
        self._run_input_json = step.run_input_json

    @property
    def run_input(self) -> Any:
        """The input of this step's run: the value given to ``enqueue`` or ``submit``
        (or the child node's input, in a child run), as the JSON value stored (dict,
        list, str, int, float, bool or ``None``; never decoded into a dataclass or a
        pydantic model), whatever this node's own input is (a data edge, a fan-in, a
        constant, a fan-out item).

        For a standalone run, and a workflow step that takes the run input, it is the
        value the handler received before any decoding (the same object: a change the
        handler makes to one shows in the other). Otherwise the claim carries it as
        JSON text, parsed on the first read.
        """
        if self._run_input_json is not None:
            self._run_input = json.loads(self._run_input_json)
            self._run_input_json = None
        return self._run_input

    @property
    def cancelled(self) -> bool:
        """True once the worker no longer holds this step; its completion will be ignored."""
        return self._cancelled

    def raise_if_cancelled(self) -> None:
        """Raise :class:`cyclone.LeaseLost` if :attr:`cancelled` is true."""
        if self._cancelled:
            raise LeaseLost(f"step {self.step_id} of run {self.run_id} is no longer held")

    def completion_tx(self) -> Any:
        """The connection inside this step's completion transaction.

        In a plain ``def`` handler this returns a ``psycopg.Connection``; in an
        ``async def`` handler it returns an awaitable of a ``psycopg.AsyncConnection``
        (``tx = await ctx.completion_tx()``). The transaction is opened on the first
        call (waiting for one of the client's ``tx_slots``) and committed by the worker
        together with the step's completion when the handler returns; if the handler
        raises, or the step was reclaimed meanwhile, it rolls back. Do not commit or
        roll it back yourself.
        """
        if self._is_async:
            return self._tx.open_async()
        return self._tx.open_sync()

    def completion_session(self) -> Any:
        """A SQLAlchemy session on this step's completion transaction (extra
        ``sqlalchemy``).

        In a plain ``def`` handler this returns a ``sqlalchemy.orm.Session``; in an
        ``async def`` handler an awaitable of a ``sqlalchemy.ext.asyncio.AsyncSession``
        (``session = await ctx.completion_session()``); the same session on every call.
        It works with any mapped classes and runs on the connection of
        :meth:`completion_tx`, so ORM writes commit together with the step's completion,
        or not at all: when the handler returns, the worker flushes the session (an
        error there fails the attempt as if the handler had raised it), completes the
        step and commits; when the handler raises, everything rolls back. The session
        is closed when the transaction ends.

        Its transaction is a savepoint of the completion transaction:
        ``session.rollback()`` undoes the session's writes only, and
        ``begin_nested()`` works as usual.

        Raises:
            StateError: from the session's ``commit()`` (the worker commits).
            ConfigurationError: SQLAlchemy is not installed.
            LeaseLost: the step timed out and its transaction was ended.
        """
        try:
            from cyclone.contrib import sqlalchemy as adapter
        except ImportError as exc:
            raise ConfigurationError(
                "ctx.completion_session() needs SQLAlchemy: pip install -e '.[sqlalchemy]'"
            ) from exc
        if self._is_async:
            return adapter.completion_session_async(self._tx)
        return adapter.completion_session_sync(self._tx)

    def enqueue_completion(
        self, kind: KindTarget, input: Any = None, **options: Unpack[EnqueueOptions]
    ) -> Any:
        """Enqueue a standalone run in this step's completion transaction.

        Takes the arguments of ``Client.enqueue``. The run exists only if this step
        completes; its wakeup is published after that commit. With ``submit_key``, a run
        of the kind that holds the key is returned with ``duplicate=True`` instead (a
        retried attempt of this step finds the run its own earlier attempt could not
        commit: none). Returns an :class:`cyclone.Enqueued` (an awaitable of one in an
        ``async def`` handler).

        Raises:
            ValidationError: a bad kind, input or option; nothing is written.
            StateError: the key kept changing hands.
        """
        request = self._build_request(kind, input, **options)
        if self._is_async:
            return self._enqueue_async(request)
        with producer_span(f"cyclone.enqueue {request.kind}", enqueue_attributes(request)) as span:
            result = run_plan_sync(
                self._tx.open_sync(), enqueue_plan(request.traced(span.traceparent))
            )
            span.set("cyclone.run_id", result.run_id)
        if not result.duplicate:
            self._wakeups.add(request.queue)
        return result

    async def _enqueue_async(self, request: EnqueueRequest) -> Enqueued:
        with producer_span(f"cyclone.enqueue {request.kind}", enqueue_attributes(request)) as span:
            conn = await self._tx.open_async()
            result = await run_plan_async(conn, enqueue_plan(request.traced(span.traceparent)))
            span.set("cyclone.run_id", result.run_id)
        if not result.duplicate:
            self._wakeups.add(request.queue)
        return result

    def submit_completion(
        self, workflow: Workflow, input: Any = None, **options: Unpack[SubmitOptions]
    ) -> Any:
        """Submit a workflow run in this step's completion transaction.

        Takes the arguments of ``Client.submit``. The run exists only if this step
        completes; its wakeup is published after that commit. Returns a
        :class:`cyclone.Submitted` (an awaitable of one in an ``async def`` handler).

        Raises:
            WorkflowError: an invalid workflow; nothing is written.
            ValidationError: a bad input or option; nothing is written.
        """
        assert self._build_submit is not None
        request: SubmitRequest = self._build_submit(workflow, input, **options)
        self._wakeups.update(request.workflow.queues)
        if self._is_async:
            return self._submit_async(request)
        with producer_span(
            f"cyclone.submit {request.workflow.name}", submit_attributes(request)
        ) as span:
            result = run_plan_sync(
                self._tx.open_sync(), submit_plan(request.traced(span.traceparent))
            )
            span.set("cyclone.run_id", result.run_id)
        return result

    async def _submit_async(self, request: SubmitRequest) -> Submitted:
        with producer_span(
            f"cyclone.submit {request.workflow.name}", submit_attributes(request)
        ) as span:
            conn = await self._tx.open_async()
            result = await run_plan_async(conn, submit_plan(request.traced(span.traceparent)))
            span.set("cyclone.run_id", result.run_id)
        return result

    def __repr__(self) -> str:
        return (
            f"<cyclone.Context run={self.run_id} step={self.step_id} node={self.node!r} "
            f"attempt={self.attempt}>"
        )
