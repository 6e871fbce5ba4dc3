"""An app whose client registers no handlers (the worker command refuses it)."""

from __future__ import annotations

import os

import cyclone

client = cyclone.Client(os.environ.get("CYCLONE_TEST_APP_DSN", "postgresql://localhost/none"))
not_a_client = 42
