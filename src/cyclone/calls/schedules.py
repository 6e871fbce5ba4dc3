"""Schedule calls of ``Client``: create, change, enable, disable, delete, read."""

from __future__ import annotations

from typing import Any, TypeVar

from cyclone.calls.base import AsyncCalls
from cyclone.config import KEEP
from cyclone.dbio import (
    Stmt,
    fetch_async,
    fetch_dicts_async,
    run_plan_async,
)
from cyclone.errors import (
    NotFoundError,
)
from cyclone.options import check_text
from cyclone.producer import (
    KindTarget,
)
from cyclone.records import Schedule
from cyclone.schedules import create_plan, set_enabled_plan, update_plan
from cyclone.sql import Q
from cyclone.workflow import Workflow

__all__ = ["ScheduleCalls"]

T = TypeVar("T")


class ScheduleCalls(AsyncCalls):
    """Schedule calls of ``Client``: create, change, enable, disable, delete, read."""

    async def create_schedule(
        self,
        id: str,
        target: KindTarget | Workflow,
        input: Any,
        cron: str,
        location: str = "Local",
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule that fires ``target`` with ``input`` at each slot.

        Args:
            id: the schedule's id (text, at most 256 bytes).
            target: a kind (handler or name) or a :class:`cyclone.Workflow`; a workflow
                schedule pins the workflow's current ``def_version``, and only a client
                that registers that definition fires it.
            input: the fired run's input, a JSON value.
            cron: five cron fields, six with a leading seconds field, or a macro
                (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``).
            location: an IANA time zone; ``"Local"`` is resolved to this machine's zone
                and stored.
            **options: for a kind: ``queue``, ``priority``, ``max_attempts``,
                ``timeout``, ``retention`` (default: the kind's, then the client's
                retention).

        Returns:
            The stored :class:`Schedule`; its first slot is the first after now.

        Raises:
            ValidationError: a bad id, cron expression, zone, input or option, or the
                id is taken; nothing is written.
            WorkflowError: an invalid workflow.
        """
        spec = self.config.schedule_spec(
            id, target, input, cron=cron, location=location, options=options
        )
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, create_plan(spec))
        return await self.get_schedule(spec.id)

    async def update_schedule(
        self,
        id: str,
        *,
        target: KindTarget | Workflow | None = None,
        input: Any = KEEP,
        cron: str | None = None,
        location: str | None = None,
        **options: Any,
    ) -> Schedule:
        """Change a schedule; what is not given stays as stored.

        A new cron expression or zone starts at the first slot after now; a new
        workflow target pins that workflow's current definition. The failure count and
        back-off are cleared.

        Raises:
            NotFoundError: no schedule has that id.
            ValidationError, WorkflowError: as :meth:`create_schedule`; nothing is
                written. An option given as ``None`` keeps its stored value.
        """
        rebuild = self.config.schedule_rebuild(
            target=target, input=input, cron=cron, location=location, options=options
        )
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, update_plan(check_text(id, "schedule id"), rebuild))
        return await self.get_schedule(id)

    async def enable_schedule(self, id: str) -> Schedule:
        """Let scanners fire the schedule again, from its next slot after now.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return await self._set_enabled(id, True)

    async def disable_schedule(self, id: str) -> Schedule:
        """Stop firing the schedule (its definition and history stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        return await self._set_enabled(id, False)

    async def _set_enabled(self, id: str, enabled: bool) -> Schedule:
        async with self._engine_connection() as conn, conn.transaction():
            await run_plan_async(conn, set_enabled_plan(check_text(id, "schedule id"), enabled))
        return await self.get_schedule(id)

    async def delete_schedule(self, id: str) -> None:
        """Delete the schedule and its fire records (the fired runs stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        async with self._engine_connection() as conn:
            stmt = Stmt(Q.schedules_delete, {"id": check_text(id, "schedule id")})
            if not await fetch_async(conn, stmt):
                raise NotFoundError(f"schedule {id!r} does not exist")

    async def get_schedule(self, id: str) -> Schedule:
        """The schedule with that id.

        Raises:
            NotFoundError: no schedule has that id.
        """
        async with self._engine_connection() as conn:
            stmt = Stmt(Q.schedules_list, {"id": check_text(id, "schedule id")})
            rows = await fetch_dicts_async(conn, stmt)
        if not rows:
            raise NotFoundError(f"schedule {id!r} does not exist")
        return Schedule.from_row(rows[0])

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule, by id."""
        async with self._engine_connection() as conn:
            rows = await fetch_dicts_async(conn, Stmt(Q.schedules_list, {"id": None}))
        return [Schedule.from_row(row) for row in rows]
