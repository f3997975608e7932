"""The chaos suite's long form: the tests it alone runs (its figures are printed by tests/chaos/session.py)."""

from __future__ import annotations

import pytest

from .harness import STRESS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``stress`` run only in the long form (`make stress`, ``DISPATCHER_STRESS=1``)."""
    if STRESS:
        return
    skip = pytest.mark.skip(reason="the long form of the chaos suite: run it with make stress")
    for item in items:
        if item.get_closest_marker("stress") is not None:
            item.add_marker(skip)
