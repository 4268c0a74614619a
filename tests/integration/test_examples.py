"""The scripts under examples/ run as a user would run them (the Python API,
orchestrator/api.py, on real emulated fabrics): smoke tests of the documented API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_command

pytestmark = pytest.mark.integration


def run_example(name: str, out: Path) -> subprocess.CompletedProcess[str]:
    return run_command(
        [sys.executable, str(REPO / "examples" / name), "--out", str(out)],
        cwd=REPO, timeout=600,
    )  # fmt: skip


def test_compare_policies_prints_both_policies_and_their_ratio(tmp_path: Path) -> None:
    result = run_example("compare_policies.py", tmp_path / "bundle")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "path-pinned / ecmp = " in result.stdout
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    assert {c["policy"] for c in summary["configurations"]} == {"ecmp", "path-pinned"}
    assert all(c["wrong"] == 0 for c in summary["configurations"])


def test_core_sweep_runs_a_study_and_prints_its_verdict(tmp_path: Path) -> None:
    result = run_example("core_sweep.py", tmp_path / "study")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == [
        "oversubscription.agg=1",
        "oversubscription.agg=4",
    ]
    assert lines[2].startswith("verdict: ")  # agrees or not: the figures are the study's
    study = json.loads((tmp_path / "study" / "study.json").read_text())
    assert [v["status"] for v in study["variants"]] == ["ok", "ok"]
