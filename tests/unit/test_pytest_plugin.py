"""The pytest plugin's answer where no fabric can come up: skip, or fail under CI.

The decision is a pure function (:func:`unavailable_outcome`); the end-to-end tests run a
pytest of their own in a subprocess, on a test file that asks for ``astral_fabric``, with a
PATH on which ``mnexec`` is missing, once with ``CI`` set and once without.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.pytest_plugin import unavailable_outcome, under_ci

USES_THE_FIXTURE = """\
def test_needs_a_fabric(astral_fabric):
    astral_fabric("astral-small")
"""


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, False),
        ({"CI": ""}, False),
        ({"CI": "true"}, True),
        ({"CI": "1"}, True),
        ({"GITHUB_ACTIONS": "true"}, False),
    ],
)
def test_ci_is_the_ci_variable_set_to_something(environ: dict[str, str], expected: bool) -> None:
    assert under_ci(environ) is expected


def test_every_reason_skips_outside_ci_and_fails_under_it() -> None:
    reasons = [
        "needs root (run: sudo ./setup.sh test)",
        "needs Open vSwitch and Mininet's mnexec (mnexec not on PATH)",
        "needs Open vSwitch running (`ovs-vsctl --timeout=20 show` failed; run ./setup.sh)",
    ]
    for reason in reasons:
        assert unavailable_outcome(reason, {}) == ("skip", reason)
        outcome, message = unavailable_outcome(reason, {"CI": "true"})
        assert outcome == "fail" and reason in message and "CI" in message


def run_pytest_without_mnexec(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """A pytest of its own on USES_THE_FIXTURE; PATH holds ovs-vsctl (if installed) but
    no mnexec; ``ci``: the CI variable's value (None: unset)."""
    (tmp_path / "test_fixture_user.py").write_text(USES_THE_FIXTURE)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ovs_vsctl = shutil.which("ovs-vsctl")
    if ovs_vsctl:
        (bin_dir / "ovs-vsctl").symlink_to(ovs_vsctl)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(bin_dir)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_mnexec_the_fixture_skips(tmp_path: Path) -> None:
    result = run_pytest_without_mnexec(tmp_path, None)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    if os.geteuid() == 0:  # as another user, root is what is missing first
        assert "mnexec not on PATH" in result.stdout


def test_without_mnexec_the_fixture_fails_under_ci(tmp_path: Path) -> None:
    result = run_pytest_without_mnexec(tmp_path, "true")
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout and "skipped" not in result.stdout
    assert "cannot run under CI" in result.stdout
    if os.geteuid() == 0:
        assert "mnexec not on PATH" in result.stdout
