"""The dashboard's forms: each action first shows a confirmation page (GET), whose
form POSTs with the page's CSRF token; the POST runs the action through
:mod:`cyclone.dashboard.actions` (the CLI's client calls) and goes back to the run
with a message, or shows the confirmation page again with the error.

Routes: ``/runs/{id}/actions/{cancel|pause|resume|retry|signal}``,
``/schedules/actions/{enable|disable}?id=ID``, ``/queues/actions/{pause|resume}?name=NAME``
(the queues tables post to it from a button, with the page's CSRF token), ``/purge``,
``/logout``. In read-only mode every one answers 403.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from cyclone.dashboard import actions
from cyclone.dashboard.rendering import FLASH_COOKIE, render, root
from cyclone.dashboard.security import CSRF_COOKIE, SESSION_COOKIE, SecurityConfig, check_csrf
from cyclone.errors import CycloneError, NotFoundError

__all__ = ["MAX_BODY", "read_form", "routes", "status_of"]

MAX_BODY = 64 * 1024
"""Bytes a form or JSON body may have (413 above)."""

status_of = actions.status_of

_EXPLAIN = {
    "cancel": "Cancel the run and its active steps (its child runs too). Running steps "
    "learn it at their next heartbeat.",
    "pause": "Pause the run: running steps finish, nothing new starts until it is resumed.",
    "resume": "Resume the run: its paused steps become claimable again.",
    "retry": "Reset the run's discarded and cancelled steps (all of them, or one node and "
    "the nodes below it) and reopen the run.",
    "signal": "Send a signal to the run's mailbox; a wait for that name takes it.",
}


async def read_body(request: Request) -> bytes:
    """The request body, at most :data:`MAX_BODY` bytes.

    Raises:
        HTTPException: 413 for a longer body.
    """
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise HTTPException(413, f"the body is over {MAX_BODY} bytes")
    return body


async def read_form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body as a dict (the last of a name
    wins)."""
    text = (await read_body(request)).decode("utf-8", "replace")
    return dict(parse_qsl(text, keep_blank_values=True))


def _writable(request: Request) -> SecurityConfig:
    security: SecurityConfig = request.app.state.security
    if security.read_only:
        raise HTTPException(403, "the dashboard is read-only (--read-only)")
    return security


def _back(request: Request, url: str, message: str) -> Response:
    response = RedirectResponse(url, status_code=303)
    response.set_cookie(
        FLASH_COOKIE,
        quote(message[:500]),
        httponly=True,
        samesite="strict",
        path=root(request) or "/",
    )
    return response


async def _form(request: Request) -> dict[str, str]:
    security = _writable(request)
    form = await read_form(request)
    if not check_csrf(security, request.cookies.get(CSRF_COOKIE), form.get("csrf")):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    return form


async def run_action(request: Request) -> Response:
    """``/runs/{id}/actions/{action}``: the confirmation page (GET) or the action
    (POST)."""
    _writable(request)
    run_id: int = request.path_params["run_id"]
    action: str = request.path_params["action"]
    if action not in actions.RUN_ACTIONS:
        raise NotFoundError(f"no action {action!r}; the actions are {list(actions.RUN_ACTIONS)}")
    backend = request.app.state.backend
    await backend.open()
    run = await backend.reader.api_run_record(run_id)
    values: dict[str, str] = {
        "node": request.query_params.get("node", ""),
        "name": request.query_params.get("name", ""),
        "payload": "",
    }
    if request.method == "POST":
        form = await _form(request)
        values.update({k: form.get(k, "") for k in ("node", "name", "payload")})
        body: dict[str, Any] = {}
        try:
            if action == "retry" and values["node"].strip():
                body["node"] = values["node"].strip()
            if action == "signal":
                body = {"name": values["name"], "payload": actions.parse_payload(values["payload"])}
            message = await actions.perform(backend.client, run_id, action, body)
        except CycloneError as exc:
            return render(
                request,
                "confirm.html",
                status_of(exc),
                nav="runs",
                run=run,
                action=action,
                explain=_EXPLAIN[action],
                values=values,
                flash=str(exc),
                flash_error=True,
            )
        return _back(request, f"{root(request)}/runs/{run_id}", message)
    return render(
        request,
        "confirm.html",
        nav="runs",
        run=run,
        action=action,
        explain=_EXPLAIN[action],
        values=values,
    )


async def schedule_action(request: Request) -> Response:
    """``/schedules/actions/{enable|disable}?id=ID``: confirmation (GET) or the change
    (POST). The id is a query parameter: a schedule id may hold a ``/``."""
    _writable(request)
    schedule_id = request.query_params.get("id", "")
    action: str = request.path_params["action"]
    if action not in ("enable", "disable"):
        raise NotFoundError(f"no schedule action {action!r}; they are enable and disable")
    backend = request.app.state.backend
    await backend.open()
    if request.method == "POST":
        await _form(request)
        message = await actions.set_schedule(backend.client, schedule_id, action == "enable")
        return _back(request, f"{root(request)}/schedules", message)
    return render(
        request, "confirm_schedule.html", nav="schedules", schedule_id=schedule_id, action=action
    )


async def queue_action(request: Request) -> Response:
    """``/queues/actions/{pause|resume}?name=NAME``: confirmation (GET) or the change
    (POST; the queues tables' buttons post it at once). The name is a query parameter:
    a queue name may hold a ``/``. After it, the page named by the form's ``back``
    (``overview``, else the queues page) says what was done."""
    _writable(request)
    name = request.query_params.get("name", "")
    action: str = request.path_params["action"]
    if action not in ("pause", "resume"):
        raise NotFoundError(f"no queue action {action!r}; they are pause and resume")
    backend = request.app.state.backend
    await backend.open()
    if request.method == "POST":
        form = await _form(request)
        try:
            message = await actions.set_queue_paused(backend.client, name, action == "pause")
        except CycloneError as exc:
            return render(
                request,
                "confirm_queue.html",
                status_of(exc),
                nav="queues",
                name=name,
                action=action,
                flash=str(exc),
                flash_error=True,
            )
        back = "/" if form.get("back") == "overview" else "/queues"
        return _back(request, f"{root(request)}{back}", message)
    return render(request, "confirm_queue.html", nav="queues", name=name, action=action)


async def purge(request: Request) -> Response:
    """``/purge``: confirmation (GET) or the purge (POST, ``older_than`` seconds)."""
    _writable(request)
    backend = request.app.state.backend
    await backend.open()
    if request.method == "POST":
        form = await _form(request)
        try:
            message = await actions.purge(backend.client, form.get("older_than", ""))
        except CycloneError as exc:
            return render(
                request, "purge.html", status_of(exc), nav="runs", flash=str(exc), flash_error=True
            )
        return _back(request, f"{root(request)}/runs", message)
    return render(request, "purge.html", nav="runs")


async def logout(request: Request) -> Response:
    """``/logout`` (POST, with the form's CSRF token): forget the login cookie."""
    form = await read_form(request)
    security: SecurityConfig = request.app.state.security
    if not check_csrf(security, request.cookies.get(CSRF_COOKIE), form.get("csrf")):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    response = RedirectResponse(f"{root(request)}/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=root(request) or "/")
    return response


def routes() -> list[BaseRoute]:
    """The form routes."""
    both = ["GET", "POST"]
    return [
        Route("/runs/{run_id:int}/actions/{action}", run_action, methods=both),
        Route("/schedules/actions/{action}", schedule_action, methods=both),
        Route("/queues/actions/{action}", queue_action, methods=both),
        Route("/purge", purge, methods=both),
        Route("/logout", logout, methods=["POST"]),
    ]
