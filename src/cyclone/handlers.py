"""Kinds: the ``@cyclone.step`` and ``@cyclone.action`` decorators.

A kind is a named handler. A *step* has an output, stored as
JSON; an *action* has none. The handler is a plain ``def`` (run in a worker thread) or
an ``async def``, called as ``handler(ctx, inp)``; raising an exception fails the
attempt, raising :class:`cyclone.Discard` (or a class listed in ``no_retry``) discards
the step at once.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict, Unpack

from cyclone.errors import ValidationError
from cyclone.flow import DEFAULT_MAX_SNOOZES, KindLimits, RateLimit
from cyclone.options import Duration, JobOptions, check_kind
from cyclone.payloads import Codec, codec_for
from cyclone.retry import DEFAULT_RETRY, RetryPolicy

__all__ = ["Handler", "KindOptions", "action", "step"]


@dataclass(frozen=True, slots=True, eq=False)
class Handler:
    """A registered kind. Calling it calls the function it wraps.

    Attributes:
        kind: the kind name stored in ``cyclone_steps.kind``.
        fn: the function, ``fn(ctx, inp)``.
        has_output: true for ``@step``, false for ``@action``.
        is_async: true for an ``async def``.
        options: the kind's default queue, priority, max_attempts, timeout, retention.
        retry: the backoff between failed attempts.
        no_retry: exception classes that discard the step at once.
        codec: decodes the input and encodes the output (dataclass, pydantic, JSON).
        limits: the kind's flow control (max_concurrency, rate_limit, max_snoozes).
    """

    __module__ = "cyclone"

    kind: str
    fn: Callable[..., Any]
    has_output: bool
    is_async: bool
    options: JobOptions
    retry: RetryPolicy = DEFAULT_RETRY
    no_retry: tuple[type[BaseException], ...] = ()
    codec: Codec = field(default_factory=lambda: codec_for(None))
    limits: KindLimits = field(default_factory=KindLimits)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        flavour = "step" if self.has_output else "action"
        return f"<cyclone {flavour} {self.kind!r}>"


def _is_async(fn: Callable[..., Any]) -> bool:
    """True for an ``async def`` function, a partial of one, or an object whose
    ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - the call method, not callability
    )


def _input_annotation(fn: Callable[..., Any]) -> Any:
    parameters = list(inspect.signature(fn).parameters.values())
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in positional):
        raise ValidationError(
            f"handler {getattr(fn, '__qualname__', fn)!r} must take (ctx, inp), "
            f"it takes {[p.name for p in parameters]}"
        )
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: pass the JSON through
        return None
    return hints.get(positional[1].name) if len(positional) > 1 else None


def step(
    kind: str,
    *,
    queue: str = "default",
    priority: int = 0,
    max_attempts: int = 5,
    timeout: Duration | None = None,
    retention: Duration | None = None,
    retry: RetryPolicy | None = None,
    no_retry: Iterable[type[BaseException]] = (),
    max_concurrency: int | None = None,
    rate_limit: RateLimit | str | None = None,
    max_snoozes: int = DEFAULT_MAX_SNOOZES,
) -> Callable[[Callable[..., Any]], Handler]:
    """Declare a kind whose handler returns an output (a JSON value).

    Args:
        kind: the kind name (non-empty, no NUL, at most 1,024 bytes).
        queue: default queue of its steps (at most 256 bytes).
        priority: default priority; higher claims first.
        max_attempts: failed executions before the step is discarded (>= 1).
        timeout: default limit of one execution (``timedelta`` or seconds, > 0).
        retention: how long a finished run is kept (``timedelta`` or seconds);
            ``None`` uses the client's default.
        retry: backoff between failed attempts.
        no_retry: exception classes that discard the step at once, like ``Discard``.
        max_concurrency: at most this many steps of the kind with one
            ``concurrency_key`` run at once on all workers (>= 1); ``None``: no limit.
        rate_limit: at most ``count + burst`` steps of the kind with one ``rate_key``
            start in any window of ``per`` seconds: a :class:`cyclone.RateLimit` or
            ``"100/s"``, ``"100/m"``, ``"100/h"``; ``None``: no limit.
        max_snoozes: times a handler may raise :class:`cyclone.Snooze` for one step
            before it is discarded with ``error_kind = 'snooze_limit'`` (>= 0).

    Returns:
        A decorator that turns ``fn(ctx, inp)`` into a :class:`Handler`.

    Raises:
        ValidationError: a bad kind name or option, or a function that does not take
            ``(ctx, inp)``.
    """
    check_kind(kind)
    if kind.startswith("@"):
        raise ValidationError(f"kind names starting with '@' are the engine's, got {kind!r}")
    options = JobOptions.build(
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        timeout=timeout,
        retention=retention,
    )
    limits = KindLimits.build(
        max_concurrency=max_concurrency, rate_limit=rate_limit, max_snoozes=max_snoozes
    )
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ValidationError(f"retry must be a cyclone.RetryPolicy, got {retry!r}")
    errors = tuple(no_retry)
    for cls in errors:
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ValidationError(f"no_retry must list exception classes, got {cls!r}")

    def decorate(fn: Callable[..., Any]) -> Handler:
        if isinstance(fn, Handler):
            raise ValidationError(f"{fn!r} is already a kind")
        if not callable(fn):
            raise ValidationError(f"a kind needs a function, got {fn!r}")
        return Handler(
            kind=kind,
            fn=fn,
            has_output=True,
            is_async=_is_async(fn),
            options=options,
            retry=retry or DEFAULT_RETRY,
            no_retry=errors,
            codec=codec_for(_input_annotation(fn)),
            limits=limits,
        )

    return decorate


class KindOptions(TypedDict, total=False):
    """The keyword arguments of :func:`step` and :func:`action` after the kind."""

    queue: str
    priority: int
    max_attempts: int
    timeout: Duration | None
    retention: Duration | None
    retry: RetryPolicy | None
    no_retry: Iterable[type[BaseException]]
    max_concurrency: int | None
    rate_limit: RateLimit | str | None
    max_snoozes: int


def action(kind: str, **options: Unpack[KindOptions]) -> Callable[[Callable[..., Any]], Handler]:
    """Declare a kind whose handler has no output (its return value is ignored).

    Takes the same arguments as :func:`step` and raises the same errors.
    """
    declare = step(kind, **options)

    def decorate(fn: Callable[..., Any]) -> Handler:
        return replace(declare(fn), has_output=False)

    return decorate
