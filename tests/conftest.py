"""Shared test configuration: when integration tests may run.

Integration tests are the ones marked ``@pytest.mark.integration`` (the marker is declared in
pyproject.toml) plus everything under ``tests/integration/``, which gets the marker here so
that ``-m "not integration"`` selects the unit tests alone. They need root and a running Open
vSwitch (and Mininet's mnexec). Where any is missing they are skipped with the reason, except
when the environment variable ``CI`` is set: there they fail, so that CI cannot pass by
skipping them (orchestrator.pytest_plugin.unavailable decides, for the astral_fabric fixture
too).

Every test sees no calibration unless it makes one: ``$ASTRAL_CALIBRATION`` points into
the session's temporary directory, a new file per test, so the load guard's verdicts (and whether
``astral run`` calibrates first) do not depend on what a person's ``astral calibrate`` or
``astral run`` left in /var/lib/astral, and no test writes there.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.calibration.capacity import ENV_VAR as CALIBRATION_ENV_VAR
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


@pytest.fixture(autouse=True, scope="session")
def _no_machine_calibration(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """$ASTRAL_CALIBRATION at a file no test has written, for what runs outside a test
    function (module-scoped fabrics and their runs, which never calibrate)."""
    before = os.environ.get(CALIBRATION_ENV_VAR)
    os.environ[CALIBRATION_ENV_VAR] = str(tmp_path_factory.mktemp("calibration") / "none.json")
    yield
    if before is None:
        os.environ.pop(CALIBRATION_ENV_VAR, None)
    else:
        os.environ[CALIBRATION_ENV_VAR] = before


@pytest.fixture(autouse=True)
def _no_calibration_from_other_tests(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """... and a new such file for every test (subprocesses inherit it): a test whose
    ``astral run`` calibrates first, as the command does on a machine without a
    calibration, must not hand its calibration to the tests after it."""
    monkeypatch.setenv(
        CALIBRATION_ENV_VAR, str(tmp_path_factory.mktemp("calibration") / "none.json")
    )
