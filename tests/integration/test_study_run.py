"""``astral run STUDY.yaml`` end to end: a study of two fabrics and a swept key, on real
emulated fabrics through the command line, its study bundle and what it leaves behind.

The study is small on purpose (one collective, one size): what is tested is the study's
machinery (each fabric brought up once for the variants that share it, every variant's
bundle, the variant dimension in summary.json, the checks judged, nothing left behind),
not the figures, which the shipped studies under experiments/studies/ measure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.emulation.state import RunState
from tests.helpers import REPO, preset_fabric, run_command
from tests.integration.assertions import leftovers, snapshot

pytestmark = pytest.mark.integration

STUDY = {
    "name": "it-study",
    "fabrics": ["astral-small", "rail-only-small"],
    "sweep": {"host_ports": ["balanced", "hash"]},
    "policies": ["path-pinned"],
    "collectives": [{"op": "all-reduce", "algorithm": "ring"}],
    "sizes": {"min": "256K", "max": "256K"},
    "iterations": 1,
    "warmup": 1,
    "scale": 0.6e-4,
    "study": {
        "question": "do the host's NIC port choices matter under path pinning?",
        "expected": "no more than the noise",
        "checks": [
            {
                "name": "hashed NIC ports against balanced ones",
                "of": {"fabric": "astral-small", "host_ports": "hash"},
                "to": {"fabric": "astral-small", "host_ports": "balanced"},
                "ratio": [0.0, 100.0],  # the machinery, not the figure, is tested here
            },
            {"name": "rail-only completes", "of": {"variant": 3}, "completes": True},
        ],
    },
}


def runs_dir() -> Path:
    return Path(os.environ.get("ASTRAL_STATE_DIR") or "/run/astral") / "runs"


def test_a_study_runs_every_variant_once_per_fabric_into_one_bundle(tmp_path: Path) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(STUDY))
    before = snapshot()
    runs_before = set(runs_dir().iterdir()) if runs_dir().is_dir() else set()
    out = tmp_path / "bundle"
    result = run_command(
        [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--out", str(out),
         "--no-calibrate"],
        cwd=REPO, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    study = json.loads((out / "study.json").read_text())
    assert study["status"] == "ok"
    labels = [v["label"] for v in study["variants"]]
    assert labels == [
        "astral-small, host_ports=balanced",
        "astral-small, host_ports=hash",
        "rail-only-small, host_ports=balanced",
        "rail-only-small, host_ports=hash",
    ]
    assert all(v["status"] == "ok" for v in study["variants"])
    # one bring-up per fabric, each running the two variants that share it
    assert [b["variants"] for b in study["timings"]["bring_ups"]] == [[0, 1], [2, 3]]
    for variant in study["variants"]:
        bundle = out / variant["bundle"]
        summary = json.loads((bundle / "summary.json").read_text())
        assert summary["run"]["status"] == "ok"
        assert [c["wrong"] for c in summary["configurations"]] == [0]
        assert summary["configurations"][0]["host_ports"] == variant["settings"]["host_ports"]
        assert yaml.safe_load((bundle / "experiment.yaml").read_text())["fabric"]
    summary = json.loads((out / "summary.json").read_text())
    assert sorted({c["variant"] for c in summary["configurations"]}) == sorted(labels)
    assert [v["verdict"] for v in study["verdicts"]] == ["agrees", "agrees"]
    report = (out / "report.txt").read_text()
    assert "question: do the host's NIC port choices matter" in report
    assert "study verdict: agrees" in report and "verdict: agrees" in result.stdout
    assert (out / "plots" / "study-busbw.png").is_file()
    # nothing left: every fabric's recorded bridges, interfaces and processes are gone
    new_runs = sorted(set(runs_dir().iterdir()) - runs_before)
    assert len(new_runs) == 2
    nodes = {n for name in ("astral-small", "rail-only-small") for n in preset_fabric(name).nodes()}
    for run_dir in new_runs:
        assert leftovers(before, RunState.load(run_dir), nodes) == []


def test_a_bad_variant_exits_2_names_it_and_creates_nothing(tmp_path: Path) -> None:
    bad = dict(STUDY, sweep={"oversubscription.agg": [1, -3]})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    runs_before = set(runs_dir().iterdir()) if runs_dir().is_dir() else set()
    out = tmp_path / "bundle"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(path), "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "oversubscription.agg" in result.stderr and "variant 2" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert (set(runs_dir().iterdir()) if runs_dir().is_dir() else set()) == runs_before
