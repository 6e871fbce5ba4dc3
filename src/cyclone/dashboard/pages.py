"""The dashboard's HTML pages: overview, runs, a run and its steps, queues, kinds,
schedules, workers, and the login page. Each has a stable URL; its query parameters
are documented in docs/dashboard.md.

Pages only read (through :class:`cyclone.dashboard.queries.Reader`); the forms that
act live in :mod:`cyclone.dashboard.forms`. Every value reaches the page through a
Jinja2 template with autoescaping on.
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg_pool import PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from cyclone.dashboard import forms
from cyclone.dashboard.queries import (
    MAX_PAGE,
    VALUE_CHARS,
    VALUE_FIELDS,
    RunFilters,
    parse_time,
)
from cyclone.dashboard.rendering import render, root
from cyclone.dashboard.runview import ROWS_SHOWN, TIMELINE_W, cards, rows, timeline
from cyclone.dashboard.security import SESSION_COOKIE, SecurityConfig, safe_next
from cyclone.errors import CycloneError, NotFoundError, ValidationError
from cyclone.schedules import next_slot
from cyclone.states import RunState

__all__ = ["exception_handlers", "routes"]


def _int(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValidationError(f"{name} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise ValidationError(f"{name} must be from {low} to {high}, got {number}")
    return number


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip()
    return value or None


async def overview(request: Request) -> Response:
    """``/``: queues, active runs, the last hour's completions and failures, kinds no
    worker serves, recent failed runs."""
    backend = request.app.state.backend
    await backend.open()
    data = await backend.reader.overview()
    peak = max([1] + [done + failed for _, done, failed in data.minutes])
    return render(request, "overview.html", nav="overview", data=data, peak=peak)


async def runs(request: Request) -> Response:
    """``/runs``: runs newest first; ``state``, ``workflow``, ``since``, ``until``,
    ``q`` (a run id or a submit key), ``before`` (the next page), ``limit``."""
    backend = request.app.state.backend
    await backend.open()
    search = _text(request, "q")
    numeric = search is not None and search.isascii() and search.isdigit()
    if numeric and search is not None and await backend.reader.run_exists(int(search)):
        return RedirectResponse(f"{root(request)}/runs/{int(search)}", status_code=303)
    since, until = _text(request, "since"), _text(request, "until")
    filters = RunFilters(
        state=_text(request, "state"),
        workflow=_text(request, "workflow"),
        since=parse_time(since, "since") if since else None,
        until=parse_time(until, "until") if until else None,
        submit_key=search,
        before=_int(request, "before", None, 1, 2**63 - 1),
        limit=_int(request, "limit", 50, 1, MAX_PAGE) or 50,
    )
    page = await backend.reader.runs_page(filters)
    kept = {
        k: v
        for k, v in request.query_params.items()
        if k in ("state", "workflow", "since", "until", "q", "limit") and v
    }
    return render(
        request,
        "runs.html",
        nav="runs",
        page=page,
        filters=filters,
        query=kept,
        states=[s.value for s in RunState],
        next_query="&".join(
            f"{k}={quote(v, safe='')}" for k, v in {**kept, "before": str(page.next_before)}.items()
        ),
    )


async def run(request: Request) -> Response:
    """``/runs/{id}``: the run's DAG, steps table (the first :data:`ROWS_SHOWN` steps;
    ``?steps=all``: every one) and timeline; refreshes itself while the run is not
    finished."""
    backend = request.app.state.backend
    await backend.open()
    view = await backend.reader.run_view(request.path_params["run_id"])
    all_steps = request.query_params.get("steps") == "all"
    drawn, nodes = cards(view, root(request))
    bars, span = timeline(view, view.run["db_now"])
    return render(
        request,
        "run.html",
        nav="runs",
        view=view,
        r=view.run,
        drawn=drawn,
        nodes=nodes,
        bars=bars,
        rows=rows(view, root(request), None if all_steps else ROWS_SHOWN),
        all_steps=all_steps,
        span=span,
        timeline_w=TIMELINE_W,
        live=view.run["state"] in ("running", "paused"),
        items_total=sum(sum(counts.values()) for counts in view.items.values()),
        retryable=any(s["state"] in ("discarded", "cancelled") for s in view.steps),
    )


async def run_states(request: Request) -> Response:
    """``/runs/{id}/states``: what the run page polls (JSON: ``run_state``, ``nodes``,
    ``items``)."""
    backend = request.app.state.backend
    await backend.open()
    found = await backend.reader.run_states(request.path_params["run_id"])
    if found is None:
        raise NotFoundError(f"run {request.path_params['run_id']} does not exist")
    return JSONResponse(found)


async def step(request: Request) -> Response:
    """``/runs/{id}/step?node=N``: one step's input, output, error and traceback."""
    backend = request.app.state.backend
    await backend.open()
    node = request.query_params.get("node", "")
    found = await backend.reader.step(request.path_params["run_id"], node)
    items = None
    if found["item_of"] is None:
        start = _int(request, "from", 0, 0, 2**31 - 1) or 0
        items = await backend.reader.items_page(found["run_id"], node, start, 100)
    return render(
        request,
        "step.html",
        nav="runs",
        s=found,
        fields=VALUE_FIELDS,
        limit=VALUE_CHARS,
        items=items,
    )


async def step_value(request: Request) -> Response:
    """``/runs/{id}/step/value?node=N&field=F``: one value in full, as plain text."""
    backend = request.app.state.backend
    await backend.open()
    value = await backend.reader.step_value(
        request.path_params["run_id"],
        request.query_params.get("node", ""),
        request.query_params.get("field", ""),
    )
    return PlainTextResponse("" if value is None else value)


async def queues(request: Request) -> Response:
    """``/queues``: unfinished work per queue."""
    backend = request.app.state.backend
    await backend.open()
    return render(request, "queues.html", nav="queues", queues=await backend.reader.queues())


async def kinds(request: Request) -> Response:
    """``/kinds``: unfinished steps per kind and state, the last hour's outcomes."""
    backend = request.app.state.backend
    await backend.open()
    active, finished, unserved = await backend.reader.kinds()
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in finished}
    for row in active:
        by_kind.setdefault(row["kind"], []).append(row)
    shown = [
        {
            "kind": kind,
            "rows": rows,
            "oldest": next(
                (r["oldest_available_age"] for r in rows if r["state"] == "available"), None
            ),
            "expired": sum(r["expired_leases"] for r in rows),
            "completed": finished.get(kind, {}).get("completed", 0),
            "failed": finished.get(kind, {}).get("failed", 0),
            "unserved": kind in unserved,
        }
        for kind, rows in sorted(by_kind.items())
    ]
    return render(request, "kinds.html", nav="kinds", kinds=shown)


def _next_fires(row: dict[str, Any], now: Any, count: int = 3) -> list[Any]:
    fires = []
    at = row["next_run_at"]
    try:
        for _ in range(count):
            fires.append(at)
            at = next_slot(row["cron"], row["location"], at)
    except CycloneError:  # a zone this host lacks: the stored next fire only
        pass
    return fires


async def schedules(request: Request) -> Response:
    """``/schedules``: each schedule's next fires in its zone, last run, failures."""
    backend = request.app.state.backend
    await backend.open()
    now, rows = await backend.reader.schedules()
    shown = [{**row, "fires": _next_fires(row, now)} for row in rows]
    return render(request, "schedules.html", nav="schedules", schedules=shown, now=now)


async def workers(request: Request) -> Response:
    """``/workers``: lease owners of running steps, their queues and heartbeats."""
    backend = request.app.state.backend
    await backend.open()
    return render(request, "workers.html", nav="workers", workers=await backend.reader.workers())


async def login(request: Request) -> Response:
    """``/login``: the token form (GET), or the check that sets the login cookie
    (POST)."""
    security: SecurityConfig = request.app.state.security
    target = safe_next(request.query_params.get("next"), root(request))
    if request.method == "GET" or security.token is None:
        return render(
            request, "login.html", nav="", target=target, error=None, open=security.token is None
        )
    body = await forms.read_form(request)
    if not hmac.compare_digest(body.get("token", "").encode(), security.token.encode()):
        return render(
            request,
            "login.html",
            401,
            nav="",
            target=target,
            error="That token is not right.",
            open=False,
        )
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        security.session_value(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=root(request) or "/",
    )
    return response


def routes() -> list[BaseRoute]:
    """The page routes (and the forms' routes of :mod:`cyclone.dashboard.forms`)."""
    return [
        Route("/", overview, name="overview"),
        Route("/runs", runs, name="runs"),
        Route("/runs/{run_id:int}", run, name="run"),
        Route("/runs/{run_id:int}/states", run_states, name="run_states"),
        Route("/runs/{run_id:int}/step", step, name="step"),
        Route("/runs/{run_id:int}/step/value", step_value, name="step_value"),
        Route("/queues", queues, name="queues"),
        Route("/kinds", kinds, name="kinds"),
        Route("/schedules", schedules, name="schedules"),
        Route("/workers", workers, name="workers"),
        Route("/login", login, methods=["GET", "POST"], name="login"),
        *forms.routes(),
    ]


async def _error_page(request: Request, exc: Exception) -> Response:
    if isinstance(exc, CycloneError):
        status = forms.status_of(exc)
        message = str(exc)
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    elif isinstance(exc, psycopg.OperationalError | PoolTimeout):
        status = 503
        message = f"the database is out of reach: {str(exc).strip().splitlines()[0]}"
    else:  # pragma: no cover - registered for the two types above only
        raise exc
    if request.url.path.startswith(f"{root(request)}/api/") or request.url.path.endswith("/states"):
        return JSONResponse({"error": message}, status_code=status)
    return render(request, "error.html", status, nav="", status=status, message=message)


def exception_handlers() -> dict[Any, Any]:
    """Cyclone's errors, HTTP errors and an unreachable database (503) as a page (JSON
    under ``/api/``)."""
    return {
        CycloneError: _error_page,
        HTTPException: _error_page,
        psycopg.OperationalError: _error_page,
        PoolTimeout: _error_page,
    }
