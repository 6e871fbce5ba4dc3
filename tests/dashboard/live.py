"""What the browser tests run beside the browser: the dashboard served by uvicorn on a
free loopback port, a worker client on its own event loop, and the browser itself
(Debian's Chromium driven by Playwright, never a browser Playwright downloads)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import uvicorn
from starlette.types import ASGIApp

import cyclone
from tests.helpers import poll_until

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LiveServer:
    """An ASGI application served by uvicorn in a thread, on 127.0.0.1."""

    def __init__(self, app: ASGIApp) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        poll_until(lambda: self.server.started or not self.thread.is_alive(), what="uvicorn")
        if not self.server.started:
            raise RuntimeError("uvicorn did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class Worker:
    """A started :class:`cyclone.Client` with handlers, on an event loop of its own
    thread; :meth:`call` runs a coroutine of it from the test's thread."""

    def __init__(
        self,
        dsn: str,
        handlers: Iterable[cyclone.Handler] = (),
        workflows: Iterable[cyclone.Workflow] = (),
    ) -> None:
        self.client = cyclone.Client(dsn, handlers=handlers, workflows=workflows, poll_interval=0.2)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        self.call(lambda c: c.start())
        return self

    def call(self, what: Callable[[cyclone.Client], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``what(client)`` on the worker's loop; its result (60 s at most)."""
        return asyncio.run_coroutine_threadsafe(what(self.client), self.loop).result(60)

    def __exit__(self, *exc: object) -> None:
        self.call(lambda c: c.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
