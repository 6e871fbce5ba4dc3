"""Apply Cyclone's own migrations (``cyclone.migrate``) to the database being migrated.

That is the database of the ``default`` alias, where ``enqueue_tx`` on Django's
connection writes and the admin reads (Django's test database during tests):
``manage.py migrate --database other`` leaves Cyclone alone. A ``CYCLONE["DSN"]`` that
names another database is not migrated here (a test run would otherwise migrate the
real database instead of the test one): ``manage.py cyclone migrate`` migrates it.
Cyclone's migrations run on a connection of their own,
under their own lock and version table, so this migration is not atomic; reversing it
does nothing (Cyclone's tables are dropped by hand, never by a rollback of Django's).
The two models over Cyclone's views are unmanaged: their operations only record them.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

import cyclone
from cyclone.contrib.django import config


def apply_cyclone_schema(apps: Any, schema_editor: Any) -> None:
    """Bring Cyclone's tables to the newest version (nothing when already current)."""
    alias = schema_editor.connection.alias
    if alias == "default":
        cyclone.migrate(config.conninfo_of(alias))


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.RunPython(apply_cyclone_schema, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                (
                    "workflow",
                    models.TextField(help_text="The workflow, or the kind of a standalone job."),
                ),
                (
                    "state",
                    models.TextField(help_text="running, paused, completed, failed or cancelled."),
                ),
                (
                    "def_version",
                    models.TextField(help_text="The workflow definition's version, or 'job'."),
                ),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(null=True)),
                ("deadline_at", models.DateTimeField(null=True)),
                ("paused_at", models.DateTimeField(null=True)),
                ("parent_run_id", models.BigIntegerField(null=True)),
                ("parent_node_id", models.TextField(null=True)),
                ("steps_total", models.BigIntegerField()),
                ("steps_completed", models.BigIntegerField()),
                ("steps_discarded", models.BigIntegerField()),
                ("steps_running", models.BigIntegerField()),
                ("steps_waiting_signal", models.BigIntegerField()),
                ("steps_waiting_timer", models.BigIntegerField()),
            ],
            options={"db_table": "cyclone_v_runs", "ordering": ("-id",), "managed": False},
        ),
        migrations.CreateModel(
            name="Step",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("node", models.TextField()),
                ("kind", models.TextField()),
                ("state", models.TextField()),
                ("queue", models.TextField()),
                ("priority", models.IntegerField()),
                (
                    "attempt",
                    models.IntegerField(help_text="Failed executions before the current one."),
                ),
                ("max_attempts", models.IntegerField()),
                ("error", models.TextField(null=True)),
                ("error_kind", models.TextField(null=True)),
                ("panic_stack", models.TextField(null=True)),
                ("lease_owner", models.TextField(null=True)),
                ("lease_expiry", models.DateTimeField(null=True)),
                ("lease_expired", models.BooleanField(null=True)),
                ("heartbeat_at", models.DateTimeField(null=True)),
                ("reclaims", models.IntegerField()),
                ("signal_name", models.TextField(null=True)),
                ("item_of", models.TextField(null=True)),
                ("item_index", models.IntegerField(null=True)),
                ("scheduled_at", models.DateTimeField()),
                ("created_at", models.DateTimeField()),
                ("started_at", models.DateTimeField(null=True)),
                ("completed_at", models.DateTimeField(null=True)),
                (
                    "run",
                    models.ForeignKey(
                        db_column="run_id",
                        db_constraint=False,
                        on_delete=models.deletion.DO_NOTHING,
                        related_name="steps",
                        to="cyclone.run",
                    ),
                ),
            ],
            options={"db_table": "cyclone_v_steps", "ordering": ("-id",), "managed": False},
        ),
    ]
