"""The receipts handlers write in their completion transactions."""

from __future__ import annotations

from django.db import models


class Receipt(models.Model):
    """A receipt for a run; ``issued_at`` checks time zones through the ORM."""

    run_id = models.BigIntegerField()
    note = models.TextField()
    issued_at = models.DateTimeField(null=True)
    details = models.JSONField(null=True)

    def __str__(self) -> str:
        return f"receipt {self.pk} of run {self.run_id}"
