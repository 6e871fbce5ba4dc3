"""Cyclone: durable jobs and static DAG workflows with PostgreSQL as the only dependency.

The public API: kinds (:func:`step`, :func:`action`), the
:class:`Client` (asyncio) and :class:`SyncClient`, the handler :class:`Context`, the
records :class:`Run`, :class:`Step`, :class:`Schedule`, :class:`Enqueued` and
:class:`Submitted`, the :class:`Workflow` builder, :func:`migrate`, and the exceptions
of :mod:`cyclone.errors`.
"""

from importlib import metadata as _metadata

from cyclone.client import Client
from cyclone.config import WakeupTracker
from cyclone.context import Context
from cyclone.errors import (
    ConfigurationError,
    CycloneError,
    DatabaseUnavailable,
    Discard,
    LeaseLost,
    NotFoundError,
    PoolTooSmallError,
    Snooze,
    StateError,
    StepInterrupted,
    ValidationError,
    WaitTimeout,
    WorkflowError,
)
from cyclone.flow import ItemKey, KindLimits, RateLimit
from cyclone.handlers import Handler, action, step
from cyclone.migrate import migrate, migrate_async
from cyclone.records import Enqueued, QueueStats, Run, Schedule, Step, Submitted
from cyclone.retry import RetryPolicy
from cyclone.states import RunState, StepState
from cyclone.sync_client import SyncClient
from cyclone.workflow import Node, Workflow

__all__ = [
    "Client",
    "ConfigurationError",
    "Context",
    "CycloneError",
    "DatabaseUnavailable",
    "Discard",
    "Enqueued",
    "Handler",
    "ItemKey",
    "KindLimits",
    "LeaseLost",
    "Node",
    "NotFoundError",
    "PoolTooSmallError",
    "QueueStats",
    "RateLimit",
    "RetryPolicy",
    "Run",
    "RunState",
    "Schedule",
    "Snooze",
    "StateError",
    "Step",
    "StepInterrupted",
    "StepState",
    "Submitted",
    "SyncClient",
    "ValidationError",
    "WaitTimeout",
    "WakeupTracker",
    "Workflow",
    "WorkflowError",
    "__version__",
    "action",
    "migrate",
    "migrate_async",
    "step",
]

try:
    __version__: str = _metadata.version("cyclone")
except _metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
"""The installed version (PEP 440), read from the package's metadata, whose one source is
``version`` in pyproject.toml; ``cyclone --version`` prints the same."""
