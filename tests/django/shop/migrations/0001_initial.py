"""The receipts table."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Receipt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("run_id", models.BigIntegerField()),
                ("note", models.TextField()),
                ("issued_at", models.DateTimeField(null=True)),
                ("details", models.JSONField(null=True)),
            ],
        ),
    ]
