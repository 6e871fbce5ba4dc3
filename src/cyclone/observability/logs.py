"""Log lines that name the run and the step they are about.

Every engine log line about a step goes through :func:`step_log`: its message starts
with ``run R step S (node N, kind K)`` and the record carries the fields
:data:`STEP_FIELDS` as attributes (``record.run_id``, ``record.step_id``, ...), which a
JSON formatter (``cyclone worker --log-format json``) prints as keys.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import MutableMapping
from typing import Any, Protocol

__all__ = [
    "LOG_FORMATS",
    "STEP_FIELDS",
    "TEXT_FORMAT",
    "StepLike",
    "StepLog",
    "configure_logging",
    "json_formatter",
    "step_fields",
    "step_log",
]

LOG_FORMATS = ("text", "json")
"""The formats of :func:`configure_logging`."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The line of the ``text`` format."""

STEP_FIELDS = ("run_id", "step_id", "node", "kind", "queue", "attempt")
"""The attributes a log record about a step carries (``attempt``: the execution's
number, 1 on the first try)."""


class StepLike(Protocol):
    """What a log line needs of a step: a claimed step, or a row that names one (one
    that also has ``queue`` and ``attempt`` gives those too)."""

    @property
    def id(self) -> int: ...

    @property
    def run_id(self) -> int: ...

    @property
    def node(self) -> str: ...

    @property
    def kind(self) -> str: ...


def step_fields(step: StepLike) -> dict[str, Any]:
    """The :data:`STEP_FIELDS` of ``step`` it has, as a logging ``extra`` mapping."""
    fields: dict[str, Any] = {
        "run_id": step.run_id,
        "step_id": step.id,
        "node": step.node,
        "kind": step.kind,
    }
    queue = getattr(step, "queue", None)
    if queue is not None:
        fields["queue"] = queue
    attempt = getattr(step, "attempt", None)
    if attempt is not None:
        fields["attempt"] = attempt + 1
    return fields


class StepLog(logging.LoggerAdapter[logging.Logger]):
    """A logger for lines about one step: the prefix in the message, the fields in
    the record."""

    def __init__(self, logger: logging.Logger, step: StepLike) -> None:
        super().__init__(logger, step_fields(step))
        self._prefix = f"run {step.run_id} step {step.id} (node {step.node}, kind {step.kind})"

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        """Prefix ``msg`` with the step and add its fields to the record's ``extra``
        (fields the call gives win)."""
        extra = kwargs.get("extra")
        kwargs["extra"] = (
            dict(self.extra or {}) if extra is None else {**(self.extra or {}), **extra}
        )
        return f"{self._prefix}: {msg}", kwargs


def step_log(logger: logging.Logger, step: StepLike) -> StepLog:
    """``logger`` for lines about ``step`` (see :class:`StepLog`)."""
    return StepLog(logger, step)


def json_formatter() -> logging.Formatter:
    """A formatter that prints each record as one JSON object on one line:
    ``level``, ``logger``, ``message``, the :data:`STEP_FIELDS` a record about a step
    carries, any other ``extra`` field, ``exc_info`` for an exception, and ``time``
    (ISO 8601 in UTC, to the microsecond)."""
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(levelname)s %(name)s %(message)s",
        rename_fields={"levelname": "level", "name": "logger"},
        timestamp="time",
        json_ensure_ascii=False,
    )


def configure_logging(level: str = "info", fmt: str = "text") -> None:
    """Send log records of ``level`` and above to stderr, as text lines
    (:data:`TEXT_FORMAT`) or as JSON objects (:func:`json_formatter`), replacing the
    root logger's handlers.

    Warnings (``warnings.warn``) and exceptions that end a thread are logged through
    the same handler.

    Raises:
        ValidationError: ``fmt`` is not one of :data:`LOG_FORMATS`.
    """
    from cyclone.errors import ValidationError

    if fmt not in LOG_FORMATS:
        raise ValidationError(f"log format must be one of {list(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(json_formatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # what else reaches stderr goes through the same format: warnings, and exceptions
    # that end a thread (one a handler started)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logging.getLogger("cyclone").error(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),  # type: ignore[arg-type]
    )
