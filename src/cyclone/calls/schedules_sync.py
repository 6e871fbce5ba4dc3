"""Schedule calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.schedules`."""

from __future__ import annotations

from typing import Any, TypeVar

from cyclone.calls.base import SyncCalls
from cyclone.config import KEEP
from cyclone.dbio import Stmt, fetch_dicts_sync, fetch_sync, run_plan_sync
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

__all__ = ["SyncScheduleCalls"]

T = TypeVar("T")


class SyncScheduleCalls(SyncCalls):
    """Schedule calls of ``SyncClient``: the synchronous twins of :mod:`cyclone.calls.schedules`."""

    def create_schedule(
        self,
        id: str,
        target: KindTarget | Workflow,
        input: Any,
        cron: str,
        location: str = "Local",
        **options: Any,
    ) -> Schedule:
        """Create a cron schedule (see ``Client.create_schedule``).

        Raises:
            ValidationError: a bad id, cron expression, zone, input or option, or the
                id is taken; nothing is written.
            WorkflowError: an invalid workflow.
        """
        spec = self.config.schedule_spec(
            id, target, input, cron=cron, location=location, options=options
        )
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, create_plan(spec))
        return self.get_schedule(spec.id)

    def update_schedule(
        self,
        id: str,
        *,
        target: KindTarget | Workflow | None = None,
        input: Any = KEEP,
        cron: str | None = None,
        location: str | None = None,
        **options: Any,
    ) -> Schedule:
        """Change a schedule; what is not given stays (see ``Client.update_schedule``).

        Raises:
            NotFoundError: no schedule has that id.
            ValidationError, WorkflowError: a bad value; nothing is written.
        """
        rebuild = self.config.schedule_rebuild(
            target=target, input=input, cron=cron, location=location, options=options
        )
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, update_plan(check_text(id, "schedule id"), rebuild))
        return self.get_schedule(id)

    def enable_schedule(self, id: str) -> Schedule:
        """Fire the schedule again, from its next slot after now.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return self._set_enabled(id, True)

    def disable_schedule(self, id: str) -> Schedule:
        """Stop firing the schedule.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return self._set_enabled(id, False)

    def _set_enabled(self, id: str, enabled: bool) -> Schedule:
        with self._connection() as conn, conn.transaction():
            run_plan_sync(conn, set_enabled_plan(check_text(id, "schedule id"), enabled))
        return self.get_schedule(id)

    def delete_schedule(self, id: str) -> None:
        """Delete the schedule and its fire records (the fired runs stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        with self._connection() as conn, conn.transaction():
            stmt = Stmt(Q.schedules_delete, {"id": check_text(id, "schedule id")})
            if not fetch_sync(conn, stmt):
                raise NotFoundError(f"schedule {id!r} does not exist")

    def get_schedule(self, id: str) -> Schedule:
        """The schedule with that id.

        Raises:
            NotFoundError: no schedule has that id.
        """
        with self._connection() as conn:
            rows = fetch_dicts_sync(
                conn, Stmt(Q.schedules_list, {"id": check_text(id, "schedule id")})
            )
        if not rows:
            raise NotFoundError(f"schedule {id!r} does not exist")
        return Schedule.from_row(rows[0])

    def list_schedules(self) -> list[Schedule]:
        """Every schedule, by id."""
        with self._connection() as conn:
            rows = fetch_dicts_sync(conn, Stmt(Q.schedules_list, {"id": None}))
        return [Schedule.from_row(row) for row in rows]
