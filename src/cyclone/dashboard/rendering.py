"""How a page is rendered: its template, with what every page needs."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from starlette.requests import Request
from starlette.responses import Response

from cyclone.dashboard.security import SecurityConfig, csrf_token

__all__ = ["FLASH_COOKIE", "render", "root"]

FLASH_COOKIE = "cyclone_flash"
"""A one-shot message shown by the next page (set after an action)."""


def root(request: Request) -> str:
    """The path the dashboard is mounted at (empty when served alone)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """``template`` rendered with ``context`` and what every page needs: the root
    path, the CSRF token of its forms, read-only mode, and a pending flash message
    (cleared by this response)."""
    security: SecurityConfig = request.app.state.security
    flash = request.cookies.get(FLASH_COOKIE)
    page: Response = request.app.state.templates.TemplateResponse(
        request,
        template,
        {
            "root": root(request),
            "csrf": csrf_token(security, request.state.csrf_cookie),
            "read_only": security.read_only,
            "with_token": security.token is not None,
            "flash": unquote(flash) if flash else None,
            "flash_error": False,
            **context,
        },
        status_code=status_code,
    )
    if flash:
        page.delete_cookie(FLASH_COOKIE, path=root(request) or "/")
    return page
