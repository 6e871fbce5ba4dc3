"""Running one held step's handler, and deciding what its return or exception becomes.

:func:`decide_outcome` is the one decision shared by the two ways a handler runs (an
``async def`` on the event loop, a plain ``def`` in a handler thread): a return is
an output, encoded as JSON text (or a failure when it cannot be encoded); an exception
is a :class:`cyclone.transitions.Failure` (retry with backoff, or discard), a timeout
recorded as ``error_kind = 'timeout'``; a ``Snooze`` is a
:class:`cyclone.snoozing.Snoozed` (the step given back for later, no attempt used);
an interruption of a step no longer held
(lease lost, released at shutdown, cancelled) is dropped: nothing is written for it.
The worker records the outcome (:mod:`cyclone.worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from cyclone.completion import CompletionTx
from cyclone.context import Context
from cyclone.dbio import batch_sync
from cyclone.errors import Discard, Snooze, StepInterrupted
from cyclone.graph import Advanced, parse_advanced
from cyclone.handlers import Handler
from cyclone.observability.hooks import Observers, Outcome
from cyclone.observability.logs import StepLog, step_log
from cyclone.observability.tracing import StepSpan, engine_span
from cyclone.payloads import encode_json
from cyclone.snoozing import Snoozed, snoozed_of
from cyclone.transitions import Claimed, Failure, complete_stmts, decide_failure

__all__ = [
    "Held",
    "StepOutcome",
    "decide_outcome",
    "failure_of",
    "run_async_handler",
    "run_sync_handler",
]

log = logging.getLogger("cyclone.worker")


@dataclass(slots=True, eq=False)
class Held:
    """A step this worker holds, from claim until its outcome is written.

    ``span`` is the attempt's trace span (``None`` when tracing is off); ``outcome``,
    once known, how the attempt ended; ``duration`` the seconds its handler ran;
    ``error`` the exception it raised and ``failure`` the error recorded for it.
    """

    step: Claimed
    ctx: Context
    span: StepSpan | None = None
    outcome: Outcome | None = None
    duration: float | None = None
    error: BaseException | None = None
    failure: str | None = None
    reported: bool = False  # its span ended and the observers were told
    started: float = field(default=0.0)
    _log: StepLog | None = None
    task: asyncio.Task[None] | None = None
    in_handler: bool = False
    completing: bool = False  # the handler returned; its outcome is being written
    lost: bool = False  # a heartbeat found the lease gone
    released: bool = False  # given back at shutdown
    finished: bool = False  # its outcome is written (or given up)

    @property
    def gone(self) -> bool:
        """The step is no longer this worker's: its lease was lost, or it was given
        back at shutdown."""
        return self.lost or self.released

    @property
    def log(self) -> StepLog:
        """The logger of lines about this step (made when first needed)."""
        if self._log is None:
            self._log = step_log(log, self.step)
        return self._log

    @property
    def gone_as(self) -> Outcome:
        """The outcome of an attempt whose step is no longer held."""
        return "released" if self.released else "lost"

    def handler_started(self) -> None:
        """The handler starts now (its duration is measured from here)."""
        self.in_handler = True
        self.started = time.perf_counter()

    def handler_returned(self, error: BaseException | None = None, *, ran: bool = True) -> None:
        """The handler returned (or raised ``error``): its duration is known (unless it
        did not run to its end: ``ran=False``, cancelled because the step was no longer
        held). An error recorded before (a timeout) is kept."""
        self.in_handler = False
        self.completing = True
        if ran:
            self.duration = time.perf_counter() - self.started
        if error is not None and self.error is None:
            self.error = error

    def report(self, observers: Observers) -> None:
        """The attempt is over: end its span and tell ``observers`` how it ended (its
        ``outcome``, else ``released`` or ``lost``); once, later calls do nothing."""
        if self.reported:
            return
        self.reported = True
        outcome = self.outcome or self.gone_as
        if self.span is not None:
            if self.error is not None and outcome in ("failed", "discarded"):
                self.span.record_error(self.error)
            self.span.end(outcome, error=self.failure)
        if observers:
            observers.step_ended(self.step, outcome, self.duration)

    def active(self) -> contextlib.AbstractContextManager[None]:
        """The attempt's span current in this block (nothing when tracing is off)."""
        return self.span.active() if self.span is not None else contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one execution of a handler came to.

    Exactly one of: ``failure`` set (record it: a failed attempt, or a handler's
    ``Snooze`` as :class:`cyclone.snoozing.Snoozed`); ``dropped`` (write nothing: the step
    is no longer held); else ``output``, the JSON text to complete with (``None`` for
    an action, stored as NULL).
    """

    output: str | None = None
    failure: Failure | Snoozed | None = None
    dropped: bool = False


DROPPED = StepOutcome(dropped=True)


def decide_outcome(
    handler: Handler,
    step: Claimed,
    *,
    value: Any = None,
    error: BaseException | None = None,
    not_held: bool = False,
    timed_out: bool = False,
) -> StepOutcome:
    """What a handler that returned ``value`` or raised ``error`` comes to.

    ``not_held`` says the step is no longer held (lease lost, released, cancelled):
    a ``StepInterrupted`` raised then is dropped. ``timed_out`` says the step's
    timeout (seconds, ``step.timeout``) cut the handler short: the failure is a
    ``TimeoutError`` with ``error_kind = 'timeout'``. A ``Snooze`` (outside a timeout)
    gives the step back under the kind's ``max_snoozes``. A value that cannot be encoded
    as JSON is a failure like any exception.
    """
    if error is None:
        try:
            output = (
                encode_json(handler.codec.encode(value), f"output of kind {handler.kind!r}")
                if handler.has_output
                else None
            )
        except Exception as exc:
            error = exc
        else:
            return StepOutcome(output=output)
    if isinstance(error, StepInterrupted) and not_held:
        return DROPPED
    if isinstance(error, Snooze) and not timed_out:
        return StepOutcome(failure=snoozed_of(error, handler.limits.max_snoozes))
    return StepOutcome(failure=failure_of(handler, step, error, timed_out=timed_out))


def failure_of(
    handler: Handler, step: Claimed, error: BaseException, *, timed_out: bool = False
) -> Failure:
    """The failure ``error`` makes of an execution of ``step`` under its kind's retry
    policy; with ``timed_out``, a ``TimeoutError`` naming the step's timeout, recorded
    with ``error_kind = 'timeout'``."""
    kind = None
    if timed_out:
        error, kind = TimeoutError(f"step exceeded its timeout of {step.timeout} s"), "timeout"
    return decide_failure(
        step, error, retry=handler.retry, no_retry=handler.no_retry, error_kind=kind
    )


async def run_async_handler(handler: Handler, held: Held) -> StepOutcome | None:
    """On the event loop: run an ``async def`` handler under the step's timeout.

    Returns its :class:`StepOutcome`, or ``None`` when the worker cancelled it because
    the step is no longer held (lease lost, released at shutdown).
    """
    step, ctx = held.step, held.ctx
    timeout_cm = asyncio.timeout(step.timeout) if step.timeout is not None else None
    held.handler_started()
    error: BaseException | None = None
    ran = True
    try:
        if step.input_error is not None:
            raise Discard(step.input_error)
        if timeout_cm is None:
            value = await handler.fn(ctx, handler.codec.decode(step.input))
            if not held.gone:
                await ctx._tx.finish_async()  # its completion session's writes: still its own
        else:
            async with timeout_cm:
                value = await handler.fn(ctx, handler.codec.decode(step.input))
                if not held.gone:
                    await ctx._tx.finish_async()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not held.gone or task is None:
            raise
        task.uncancel()
        ran = False
        why = "released at shutdown" if held.released else "lease lost"
        held.log.info("%s, handler cancelled", why)
        return None
    except (Exception, StepInterrupted) as exc:  # LeaseLost from ctx.raise_if_cancelled()
        error = exc
        timed_out = (
            not isinstance(exc, StepInterrupted) and timeout_cm is not None and timeout_cm.expired()
        )
        return decide_outcome(
            handler, step, error=exc, not_held=held.gone or ctx.cancelled, timed_out=timed_out
        )
    finally:
        held.handler_returned(error, ran=ran)
    return decide_outcome(handler, step, value=value)


def run_sync_handler(
    handler: Handler, held: Held, tx: CompletionTx
) -> StepOutcome | Advanced | None:
    """In a handler thread: run a plain ``def`` handler; complete the step inside its
    completion transaction when the handler opened one.

    Returns the :class:`StepOutcome` for the worker to record, the ``Advanced`` of a
    completion committed in the transaction, or ``None`` when there is nothing to
    record (a stale completion, a transaction the engine ended).
    """
    with held.active():
        return _run_sync_handler(handler, held, tx)


def _run_sync_handler(
    handler: Handler, held: Held, tx: CompletionTx
) -> StepOutcome | Advanced | None:
    step, ctx, slog = held.step, held.ctx, held.log
    held.handler_started()
    try:
        error: BaseException | None = None
        try:
            if step.input_error is not None:
                raise Discard(step.input_error)
            value = handler.fn(ctx, handler.codec.decode(step.input))
            if not (held.gone or ctx.cancelled):
                tx.finish_sync()  # its completion session's writes: still its own
        except (Exception, StepInterrupted) as exc:  # LeaseLost: ctx.raise_if_cancelled()
            error = exc
            outcome = decide_outcome(handler, step, error=exc, not_held=held.gone or ctx.cancelled)
        else:
            outcome = decide_outcome(handler, step, value=value)
        finally:
            held.handler_returned(error)
        if outcome.failure is not None or not tx.opened:
            return None if outcome.dropped else outcome
        if held.gone or ctx.cancelled:
            return None
        assert tx.sync_conn is not None
        try:
            with engine_span("cyclone.completion_tx.commit", root=False):
                stmts = complete_stmts([(step, outcome.output)])
                advanced = parse_advanced(batch_sync(tx.sync_conn, stmts, transaction=False))
                if step.id not in advanced.done:
                    slog.info("stale completion rolled back")
                    return None
                tx.close_sync(commit=True)
        except StepInterrupted:  # the engine ended the transaction: nothing committed
            slog.info("timed out before its commit")
            return None
        except Exception as exc:
            slog.warning("completion transaction failed: %s", exc)
            held.error = exc
            return decide_outcome(handler, step, error=exc)
        return advanced
    finally:
        tx.close_sync(commit=False)  # whatever happened: never leak a slot
