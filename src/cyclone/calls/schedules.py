"""Schedule calls of both clients: create, change, enable, disable, delete, read
(scripts: see :mod:`cyclone.calls.effects`)."""

from __future__ import annotations

from typing import Any

from cyclone.calls.effects import CallsCore, Own, Script, fetch, fetch_one, twin
from cyclone.config import KEEP
from cyclone.dbio import Plan, Stmt
from cyclone.errors import NotFoundError
from cyclone.options import check_text
from cyclone.producer import KindTarget
from cyclone.records import Schedule
from cyclone.schedules import create_plan, set_enabled_plan, update_plan
from cyclone.sql import Q
from cyclone.sql.rows import KeyIdRow
from cyclone.workflow import Workflow

__all__ = ["ScheduleCalls"]


def _get_plan(schedule_id: str) -> Plan[Schedule]:
    """Read one schedule.

    Raises:
        NotFoundError: no schedule has that id.
    """
    stmt = Stmt(Q.schedules_list, {"id": schedule_id})
    return fetch_one(stmt, f"schedule {schedule_id!r} does not exist")


def _write(plan: Plan[None], schedule_id: str) -> Script[Schedule]:
    """Run a schedule's plan in one transaction, then read the schedule back."""
    yield Own(plan, atomic=True, engine=True)
    schedule: Schedule = yield Own(_get_plan(schedule_id), engine=True)
    return schedule


class ScheduleCalls(CallsCore):
    """Schedule calls of ``Client``: create, change, enable, disable, delete, read."""

    @twin
    def create_schedule(
        self,
        /,
        id: str,
        target: KindTarget | Workflow,
        input: Any,
        cron: str,
        location: str = "Local",
        **options: Any,
    ) -> Script[Schedule]:
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
        return (yield from _write(create_plan(spec), spec.id))

    @twin
    def update_schedule(
        self,
        /,
        id: str,
        *,
        target: KindTarget | Workflow | None = None,
        input: Any = KEEP,
        cron: str | None = None,
        location: str | None = None,
        **options: Any,
    ) -> Script[Schedule]:
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
        return (yield from _write(update_plan(check_text(id, "schedule id"), rebuild), id))

    @twin
    def enable_schedule(self, id: str) -> Script[Schedule]:
        """Let scanners fire the schedule again, from its next slot after now.

        Raises:
            NotFoundError: no schedule has that id.
        """
        return (yield from _write(set_enabled_plan(check_text(id, "schedule id"), True), id))

    @twin
    def disable_schedule(self, id: str) -> Script[Schedule]:
        """Stop firing the schedule (its definition and history stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        return (yield from _write(set_enabled_plan(check_text(id, "schedule id"), False), id))

    @twin
    def delete_schedule(self, id: str) -> Script[None]:
        """Delete the schedule and its fire records (the fired runs stay).

        Raises:
            NotFoundError: no schedule has that id.
        """
        stmt = Stmt(Q.schedules_delete, {"id": check_text(id, "schedule id")})
        deleted: list[KeyIdRow] = yield Own(fetch(stmt), engine=True)
        if not deleted:
            raise NotFoundError(f"schedule {id!r} does not exist")

    @twin
    def get_schedule(self, id: str) -> Script[Schedule]:
        """The schedule with that id.

        Raises:
            NotFoundError: no schedule has that id.
        """
        schedule: Schedule = yield Own(_get_plan(check_text(id, "schedule id")), engine=True)
        return schedule

    @twin
    def list_schedules(self) -> Script[list[Schedule]]:
        """Every schedule, by id."""
        schedules: list[Schedule] = yield Own(
            fetch(Stmt(Q.schedules_list, {"id": None})), engine=True
        )
        return schedules
