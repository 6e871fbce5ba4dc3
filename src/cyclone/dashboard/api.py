"""The dashboard's JSON API under ``/api/``, in the shapes of the CLI's ``--json``.

- ``GET /api/runs?state=&workflow=&limit=&before=``: a list of runs (``cyclone runs
  --json``).
- ``GET /api/runs/{id}``: ``{"run": ..., "steps": [...]}``, each step with its
  ``deps`` (``cyclone run ID --json``).
- ``GET /api/queues``: a list of queue stats (``cyclone queues --json``).
- ``GET /api/schedules``: a list of schedules (``cyclone schedules --json``).
- ``POST /api/runs/{id}/cancel | pause | resume | retry | signal`` with a JSON body
  (``{}``; ``{"node": ...}`` to retry below a node; ``{"name": ..., "payload": ...}``
  for a signal): 200 with the run (``cyclone run``'s ``run``; the ``X-Cyclone-Message``
  header says what was done), 404 for an unknown run,
  409 when the run's state forbids the action, 415 without a JSON content type, 422
  for a bad body (``{"error": message}``), 403 in read-only mode.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from cyclone import render
from cyclone.dashboard import actions
from cyclone.dashboard.forms import read_body
from cyclone.dashboard.security import SecurityConfig
from cyclone.errors import ValidationError

__all__ = ["routes"]


def _json(value: Any, status: int = 200) -> Response:
    return Response(render.to_json(value), status_code=status, media_type="application/json")


def _int(request: Request, name: str, default: int | None) -> int | None:
    value = request.query_params.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValidationError(f"{name} must be an integer, got {value!r}") from None


async def list_runs(request: Request) -> Response:
    """``GET /api/runs``."""
    backend = request.app.state.backend
    await backend.open()
    found = await backend.reader.api_runs(
        request.query_params.get("state") or None,
        request.query_params.get("workflow") or None,
        _int(request, "limit", 50),
        _int(request, "before", None),
    )
    return _json(found)


async def get_run(request: Request) -> Response:
    """``GET /api/runs/{id}``."""
    backend = request.app.state.backend
    await backend.open()
    run, steps, deps = await backend.reader.api_run(request.path_params["run_id"])
    after: dict[str, list[str]] = {}
    for node, dep in deps:
        after.setdefault(node, []).append(dep)
    shown = [{**render.as_dict(step), "deps": after.get(step.node, [])} for step in steps]
    return _json({"run": run, "steps": shown})


async def list_queues(request: Request) -> Response:
    """``GET /api/queues``."""
    backend = request.app.state.backend
    await backend.open()
    return _json(await backend.reader.queues())


async def list_schedules(request: Request) -> Response:
    """``GET /api/schedules``."""
    backend = request.app.state.backend
    await backend.open()
    return _json(await backend.reader.api_schedules())


async def act(request: Request) -> Response:
    """``POST /api/runs/{id}/<action>``."""
    security: SecurityConfig = request.app.state.security
    if security.read_only:
        raise HTTPException(403, "the dashboard is read-only (--read-only)")
    action = request.path_params["action"]
    if action not in actions.RUN_ACTIONS:
        raise HTTPException(
            404, f"no action {action!r}; the actions are {list(actions.RUN_ACTIONS)}"
        )
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise HTTPException(415, f"the body must be application/json, got {kind or 'none'!r}")
    raw = await read_body(request)
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValidationError(f"the body is not JSON: {exc}") from None
    except RecursionError:
        raise ValidationError("the body is JSON nested too deep") from None
    backend = request.app.state.backend
    await backend.open()
    run_id: int = request.path_params["run_id"]
    message = await actions.perform(backend.client, run_id, action, body)
    run = await backend.reader.api_run_record(run_id)
    response = _json(run)
    response.headers["x-cyclone-message"] = message.encode("ascii", "replace").decode()
    return response


def routes() -> list[BaseRoute]:
    """The API routes."""
    return [
        Route("/api/runs", list_runs),
        Route("/api/runs/{run_id:int}", get_run),
        Route("/api/queues", list_queues),
        Route("/api/schedules", list_schedules),
        Route("/api/runs/{run_id:int}/{action}", act, methods=["POST"]),
    ]
