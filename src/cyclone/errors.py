"""Every exception Cyclone raises, under one root.

Grouped by role:

* bad input or configuration: :class:`ValidationError`, :class:`WorkflowError`,
  :class:`PoolTooSmallError` (all :class:`ConfigurationError` or ``ValueError``);
* lookups: :class:`NotFoundError`;
* state conflicts: :class:`StateError`;
* waiting: :class:`WaitTimeout`;
* the database out of reach: :class:`DatabaseUnavailable`;
* raised by handlers to steer the engine: :class:`Discard`;
* interrupts delivered into handler code, derived from ``BaseException`` so that a
  broad ``except Exception`` in user code does not swallow them:
  :class:`StepInterrupted` and its subclasses.

A rejected call writes nothing.
"""

from __future__ import annotations

import math
from datetime import timedelta

import psycopg

__all__ = [
    "ConfigurationError",
    "CycloneError",
    "DatabaseUnavailable",
    "Discard",
    "LeaseLost",
    "NotFoundError",
    "PoolTooSmallError",
    "Snooze",
    "StateError",
    "StepInterrupted",
    "ValidationError",
    "WaitTimeout",
    "WorkflowError",
]


class CycloneError(Exception):
    """Root of every exception Cyclone raises on purpose."""

    __module__ = "cyclone"


class ValidationError(CycloneError, ValueError):
    """A value given to Cyclone is not acceptable; the message names it.

    Raised before anything is written: a queue name over 256 bytes, input that is not
    JSON, a string holding NUL, an empty kind, ``max_attempts < 1``, a negative
    timeout, a naive datetime, an autocommit or closed connection in a ``*_tx`` call.
    """

    __module__ = "cyclone"


class ConfigurationError(CycloneError):
    """A client or handler is configured in a way that cannot work."""

    __module__ = "cyclone"


class PoolTooSmallError(ConfigurationError):
    """The connection budget is below ``tx_slots + 6`` (the engine's own six connections)."""

    __module__ = "cyclone"


class WorkflowError(ValidationError):
    """A workflow definition is invalid (duplicate node, cycle, unknown kind, ...)."""

    __module__ = "cyclone"


class NotFoundError(CycloneError, LookupError):
    """No run (or step, or schedule) has the given id."""

    __module__ = "cyclone"


class StateError(CycloneError):
    """The operation is not allowed in the current state of the run."""

    __module__ = "cyclone"


class WaitTimeout(CycloneError, TimeoutError):
    """``wait`` gave up: the run was not terminal within the timeout."""

    __module__ = "cyclone"


class DatabaseUnavailable(CycloneError, psycopg.OperationalError):
    """A producer or inspection call could not get a connection in time.

    Raised after the client's ``connect_timeout`` (a few seconds) when the server is
    down, unreachable or refusing connections, instead of waiting for the pool without
    end. Nothing was sent, so nothing was written: the call is safe to retry. Also a
    ``psycopg.OperationalError``, so code catching that keeps working.
    """

    __module__ = "cyclone"


class Discard(CycloneError):
    """Raise from a handler to fail the step at once, without further attempts.

    The step becomes ``discarded`` with ``error_kind = 'discard'`` and the message of
    the exception as its ``error``.
    """

    __module__ = "cyclone"


class Snooze(CycloneError):
    """Raise from a handler to run the step again later without using an attempt.

    ``raise cyclone.Snooze(30)`` (seconds, or a ``timedelta``; zero or more) puts the
    step back to ``available`` at ``now() + delay`` on the database clock: its attempt
    count is unchanged and its ``snoozes`` count goes up by one. Past the kind's
    ``max_snoozes`` (default 100) the step is discarded with ``error_kind =
    'snooze_limit'``. Work the handler wrote in ``ctx.completion_tx()`` is rolled back.

    Attributes:
        delay: seconds until the step is due again.

    Raises:
        ValidationError: a delay that is not a duration of zero or more seconds.
    """

    __module__ = "cyclone"

    def __init__(self, delay: timedelta | float | int) -> None:
        if isinstance(delay, timedelta):
            value = delay.total_seconds()
        elif isinstance(delay, int | float) and not isinstance(delay, bool):
            value = float(delay)
        else:
            raise ValidationError(f"Snooze delay must be a timedelta or seconds, got {delay!r}")
        if not math.isfinite(value) or value < 0 or value > 100 * 365.25 * 86400:
            raise ValidationError(
                f"Snooze delay must be zero or more seconds, at most a century, got {delay!r}"
            )
        super().__init__(f"snoozed for {value + 0.0:g} s")
        self.delay: float = value + 0.0  # never -0.0


class StepInterrupted(BaseException):
    """The worker no longer holds this step; the handler should stop.

    Derived from ``BaseException`` so that ``except Exception`` in handler code does not
    swallow it. Raised by :meth:`cyclone.Context.raise_if_cancelled`.
    """

    __module__ = "cyclone"


class LeaseLost(StepInterrupted):
    """A heartbeat found the lease gone: the step was reclaimed, cancelled or timed out."""

    __module__ = "cyclone"
