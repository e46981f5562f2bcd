"""The scenario lane: every test here starts real processes (ranks, pytest runs, tools), so each is
marked ``chaos``: ``-m chaos`` selects this lane and ``-m "not chaos"`` the unit lane."""
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.chaos)
