"""Read-only models over Cyclone's views, for the admin and for queries.

Unmanaged (Django neither creates nor alters them): :class:`Run` reads the runs view
(``cyclone_v_runs``: a run and its steps counted by state), :class:`Step` the steps
view (``cyclone_v_steps``). Change runs through a ``cyclone.Client`` (cancel, retry,
signal), never through these models.
"""

from __future__ import annotations

from django.db import models

__all__ = ["Run", "Step"]


class Run(models.Model):
    """One run: a standalone job or a workflow run (``cyclone_v_runs``)."""

    id = models.BigIntegerField(primary_key=True)
    workflow = models.TextField(help_text="The workflow, or the kind of a standalone job.")
    state = models.TextField(help_text="running, paused, completed, failed or cancelled.")
    def_version = models.TextField(help_text="The workflow definition's version, or 'job'.")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    deadline_at = models.DateTimeField(null=True)
    paused_at = models.DateTimeField(null=True)
    parent_run_id = models.BigIntegerField(null=True)
    parent_node_id = models.TextField(null=True)
    steps_total = models.BigIntegerField()
    steps_completed = models.BigIntegerField()
    steps_discarded = models.BigIntegerField()
    steps_running = models.BigIntegerField()
    steps_waiting_signal = models.BigIntegerField()
    steps_waiting_timer = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = "cyclone_v_runs"
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"run {self.id} ({self.workflow}, {self.state})"


class Step(models.Model):
    """One step of a run: a node's execution and its attempts (``cyclone_v_steps``)."""

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(
        Run,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="steps",
        db_column="run_id",
    )
    node = models.TextField()
    kind = models.TextField()
    state = models.TextField()
    queue = models.TextField()
    priority = models.IntegerField()
    attempt = models.IntegerField(help_text="Failed executions before the current one.")
    max_attempts = models.IntegerField()
    error = models.TextField(null=True)
    error_kind = models.TextField(null=True)
    panic_stack = models.TextField(null=True)
    lease_owner = models.TextField(null=True)
    lease_expiry = models.DateTimeField(null=True)
    lease_expired = models.BooleanField(null=True)
    heartbeat_at = models.DateTimeField(null=True)
    reclaims = models.IntegerField()
    signal_name = models.TextField(null=True)
    item_of = models.TextField(null=True)
    item_index = models.IntegerField(null=True)
    scheduled_at = models.DateTimeField()
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    completed_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = "cyclone_v_steps"
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"step {self.id} ({self.node}, {self.state})"
