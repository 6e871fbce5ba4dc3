"""Cyclone's web dashboard: every run, its DAG and its steps, and the actions on them.

Needs the ``dashboard`` extra (``pip install -e '.[dashboard]'`` in a checkout: Starlette,
Jinja2, uvicorn). Serve it with ``cyclone dashboard``, or mount the ASGI application
of :func:`create_app` in your own (FastAPI, Starlette, any ASGI server) under a path
prefix. Importing :mod:`cyclone` never imports this package. See docs/dashboard.md.
"""

from __future__ import annotations

from cyclone.dashboard.app import create_app

__all__ = ["create_app"]
