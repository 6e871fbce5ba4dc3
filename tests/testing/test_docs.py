"""docs/testing.md: its first test file runs as written, with the plugin's fixtures."""

from __future__ import annotations

import re

import pytest

from tests.helpers import ROOT

pytest_plugins = ["pytester"]

_INI = """
[pytest]
filterwarnings = error
asyncio_default_fixture_loop_scope = function
"""


def _orders_example() -> str:
    text = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"```python\n(# test_orders\.py\n.*?)```", text, re.DOTALL)
    assert len(blocks) == 1, "docs/testing.md: one block starts with '# test_orders.py'"
    return str(blocks[0])


def test_the_first_test_file_of_the_page_passes(pytester: pytest.Pytester) -> None:
    pytester.makeini(_INI)
    pytester.makepyfile(test_orders=_orders_example())
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
