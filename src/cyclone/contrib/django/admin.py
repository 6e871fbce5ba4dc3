"""Read-only admin pages of runs and steps: lists with filters, and detail pages.

Nothing can be added, changed or deleted here (the models are views); act on runs
through a ``cyclone.Client`` or the ``cyclone`` command (``manage.py cyclone cancel``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from cyclone.contrib.django.models import Run, Step

__all__ = ["RunAdmin", "StepAdmin", "StepInline"]


class _ReadOnly:
    """No add, change or delete permission: the change page shows the row read only."""

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class StepInline(_ReadOnly, admin.TabularInline):
    """A run's steps on its detail page."""

    model = Step
    fields = ("id", "node", "kind", "state", "attempt", "max_attempts", "error", "completed_at")
    readonly_fields = fields
    extra = 0
    show_change_link = True
    ordering = ("id",)


@admin.register(Run)
class RunAdmin(_ReadOnly, admin.ModelAdmin):
    """Runs: newest first, filtered by state, searched by workflow (or kind)."""

    list_display = (
        "id",
        "workflow",
        "state",
        "steps_completed",
        "steps_total",
        "created_at",
        "finished_at",
    )
    list_filter = ("state",)
    search_fields = ("workflow",)
    inlines = (StepInline,)


@admin.register(Step)
class StepAdmin(_ReadOnly, admin.ModelAdmin):
    """Steps: newest first, filtered by state and queue, searched by kind or node."""

    list_display = ("id", "run_id", "node", "kind", "state", "queue", "attempt", "created_at")
    list_filter = ("state", "queue")
    search_fields = ("kind", "node")
