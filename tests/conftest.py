"""Shared test configuration: when integration tests may run.

Integration tests are the ones marked ``@pytest.mark.integration`` (the marker is declared in
pyproject.toml) plus everything under ``tests/integration/``, which gets the marker here so
that ``-m "not integration"`` selects the unit tests alone. They need root and a running Open
vSwitch (and Mininet's mnexec). Where any is missing they are skipped with the reason, except
when the environment variable ``CI`` is set: there they fail, so that CI cannot pass by
skipping them (orchestrator.pytest_plugin.unavailable decides, for the astral_fabric fixture
too).
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from orchestrator.pytest_plugin import missing_requirements, unavailable

INTEGRATION_DIR = Path(__file__).parent / "integration"

# The astral_fabric fixture; also an installed pytest11 plugin under the same name, in
# which case this line finds it registered already.
pytest_plugins = ["orchestrator.pytest_plugin"]


def _is_integration(item: pytest.Item) -> bool:
    return item.get_closest_marker("integration") is not None


@functools.cache
def _missing_for_integration() -> str | None:
    """Why integration tests cannot run here, or None if they can (what the astral_fabric
    fixture needs: root, mnexec, Open vSwitch answering)."""
    return missing_requirements()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if not _is_integration(item):
        return
    missing = _missing_for_integration()
    if missing is None:
        return
    unavailable(f"integration test {missing}")
