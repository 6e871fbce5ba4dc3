"""The client ``manage.py cyclone worker`` runs (``CYCLONE["APP"]``): its DSN comes
from ``$CYCLONE_DSN``, which the command sets to the project's default database."""

from __future__ import annotations

import os
from typing import Any

import cyclone
from cyclone.contrib.django import completion_atomic


@cyclone.step("django_receipt", max_attempts=1)
def django_receipt(ctx: cyclone.Context, inp: Any) -> dict[str, Any]:
    """Write a receipt through the ORM in the step's completion transaction."""
    from tests.django.shop.models import Receipt

    with completion_atomic(ctx):
        receipt = Receipt.objects.create(run_id=ctx.run_id, note=str(inp["note"]))
    return {"receipt": receipt.pk}


client = cyclone.Client(os.environ["CYCLONE_DSN"], handlers=[django_receipt], poll_interval=1)
