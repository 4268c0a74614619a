"""A Ctrl-C that a run in the test process takes for itself still stops the session: the
plugin's hook reads what the run's handlers noted (orchestrator.emulation.signals). Without
it a session given Ctrl-C, or ``.ci/run``'s timeout, went on test after test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

PYTEST = [
    sys.executable,
    "-m",
    "pytest",
    "-p",
    "orchestrator.pytest_plugin",
    "-p",
    "no:cacheprovider",
]

SESSION = """\
import signal

from orchestrator.run.interrupts import noted_interrupts


def test_a_run_takes_a_ctrl_c():
    with noted_interrupts():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # as a run does: it winds down and reports itself interrupted


def test_the_next_test():
    pass
"""


def test_a_ctrl_c_taken_by_a_run_stops_the_session_after_its_test(tmp_path: Path) -> None:
    (tmp_path / "test_session.py").write_text(SESSION)
    result = subprocess.run(
        [*PYTEST, "-q", "-rA", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    out = result.stdout
    assert "PASSED test_session.py::test_a_run_takes_a_ctrl_c" in out, out
    assert "test_the_next_test" not in out, out
    assert "SIGINT arrived during test_session.py::test_a_run_takes_a_ctrl_c" in out, out
