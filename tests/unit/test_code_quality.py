"""The linters hold the line: ruff and mypy, configured in pyproject.toml (docs/architecture.md).

They run from the same environment as the tests (the tools next to ``sys.executable``), so
`./setup.sh test` checks exactly what the README's set-up installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

BIN = Path(sys.executable).parent

CHECKS = {
    "ruff check": [str(BIN / "ruff"), "check", "."],
    "ruff format": [str(BIN / "ruff"), "format", "--check", "."],
    "mypy": [str(BIN / "mypy")],  # what to check: [tool.mypy] packages in pyproject.toml
}


@pytest.mark.parametrize("name", list(CHECKS))
def test_tool_passes(name: str) -> None:
    argv = CHECKS[name]
    if not Path(argv[0]).exists():
        pytest.fail(f"{argv[0]} is missing: run ./setup.sh (it installs the '.[dev]' extras)")
    result = subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False
    )
    if result.returncode != 0:
        pytest.fail(
            f"`{' '.join(argv)}` exited {result.returncode}:\n{result.stdout}{result.stderr}",
            pytrace=False,
        )
