"""``astral calibrate --quick`` on this machine: it brings astral-small up, runs its few load
steps (the last at the default experiment's packet size) and writes a calibration file a
run can read. Speeds are not asserted (the machine is
shared and noisy): the file's structure is, and that its ratios follow from the goodputs
measured.

Needs root and Open vSwitch (tests/conftest.py); waits for the run lock like every test
that brings a fabric up.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.calibration import capacity as cal
from orchestrator.calibration import measure
from orchestrator.cli import main as cli_main
from orchestrator.emulation.recipe import BASE_MTU, current_recipe, packet_scale_of
from orchestrator.run.experiment import load_experiment
from orchestrator.run.runner import DEFAULT_EXPERIMENT
from tests.helpers import REPO, run_command
from topologies.units import tcp_payload_share

pytestmark = pytest.mark.integration

QUICK_SECONDS = 60.0  # the calibration itself, lock waits excluded


def test_quick_calibration_writes_a_sane_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "calibration.json"
    began = time.monotonic()
    status = cli_main(["calibrate", "--quick", "--out", str(path), "--lock-wait", "900"])
    took = time.monotonic() - began
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert f"written to {path}" in captured.out
    # Its duration is reported, not asserted: tests check correctness, not speed, and CI
    # machines are noisy (the --quick plan aims at QUICK_SECONDS).
    print(f"astral calibrate --quick took {took:.0f} s (aim: {QUICK_SECONDS:.0f} s)")

    loaded = cal.load_calibration(path)
    assert loaded is not None
    assert loaded.bound in cal.BOUNDS
    assert loaded.capacity_bps > 0 and math.isfinite(loaded.capacity_bps)
    assert loaded.safe_share == cal.DEFAULT_SAFE_SHARE
    conditions = loaded.conditions
    assert conditions["cpus"] >= 1 and len(conditions["loadavg_start"]) == 3
    assert conditions["datapath"] in ("kernel", "userspace")
    assert conditions["ovs_version"] and conditions["kernel"]
    assert loaded.fabric["name"] == "astral-small"

    # the quick plan's steps for the default experiment's packets (it stops early only
    # below the threshold, at the last packet scale)
    recipe = current_recipe()
    nic = loaded.fabric["nic_rate_bps"]
    default = load_experiment(DEFAULT_EXPERIMENT)
    scale = packet_scale_of(default.fabric, recipe)
    planned = measure.plan_for(measure.QUICK_PLAN, recipe, nic, scale).steps
    assert loaded.fabric["policy"] == measure.CALIBRATION_POLICY
    assert 1 <= len(loaded.steps) <= len(planned)
    ports = 16  # 8 GPUs x 2 NIC ports: one flow each at most
    for step, (flows, factor) in zip(loaded.steps, planned, strict=False):
        assert step.flows == min(flows, ports) and step.rate_bps == pytest.approx(nic * factor)
        assert step.packet_scale == recipe.scale_for(step.rate_bps)
        assert step.hops == 5  # GPU i <-> i + n/2: across the pods
        assert step.offered_bps == pytest.approx(step.flows * step.rate_bps)
        assert step.offered_hop_bps == pytest.approx(step.offered_bps * step.hops)
        assert step.achieved_bps > 0  # goodput was measured
        mtu = BASE_MTU * step.packet_scale if recipe.scale_mtu else BASE_MTU
        share = tcp_payload_share(mtu)  # of the frames the recipe used at that step
        assert step.ratio == pytest.approx(step.achieved_bps / (step.offered_bps * share))
        assert 0 < step.jain <= 1 and step.vswitchd_cores >= 0
    if len(loaded.steps) == len(planned):  # the run it is for was measured at its packets
        assert loaded.steps[-1].packet_scale == scale
    capacity, bound = cal.find_capacity(loaded.steps, loaded.threshold)
    assert capacity == pytest.approx(loaded.capacity_bps) and bound == loaded.bound


TINY_EXPERIMENT = """\
name: it-first-run
fabric: astral-small
policies: [path-pinned]
collectives: [all-reduce]
sizes: {min: 64K, max: 64K}
iterations: 1
warmup: 0
scale: 0.1e-4
"""
# 2 Mbit/s per port, 139 hop-Mbit/s offered: inside the safe share of what the quick
# calibration measures even on a loaded machine (283 hop-Mbit/s at load average 5.6 here),
# so the load guard lets the run go wherever this test runs; what it checks is that the
# calibration runs once and is kept, not the emulator's speed.
LOCK_WAIT = 600.0  # another run (a person, another test session) may hold the lock


def test_astral_run_without_a_calibration_measures_it_once_and_keeps_it(tmp_path: Path) -> None:
    """A first ``astral run`` on a machine without a calibration file runs the quick
    calibration, stores it where calibration files live ($ASTRAL_CALIBRATION here) and
    judges the experiment against it; the next run reads it and measures nothing."""
    path = tmp_path / "lib" / "calibration.json"
    env = dict(os.environ, **{cal.ENV_VAR: str(path)})
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY_EXPERIMENT)
    outputs = []
    deadline = time.monotonic() + LOCK_WAIT
    for attempt in range(2):  # the first calibrates, the second must not
        while True:
            out = tmp_path / f"bundle-{attempt}-{len(outputs)}"
            result = run_command(
                [sys.executable, "-m", "orchestrator.cli", "run", str(exp), "--out", str(out),
                 "--no-plots"],
                cwd=REPO, env=env, timeout=LOCK_WAIT,
            )  # fmt: skip
            outputs.append(result.stderr)
            if result.returncode == 5 and time.monotonic() < deadline:
                time.sleep(2)  # another run holds the lock: wait for it, as a person would
                continue
            break
        assert result.returncode == 0, result.stderr
        run = json.loads((out / "run.json").read_text())
        assert run["load_guard"]["calibrated"] is True
        assert run["load_guard"]["calibration"] == str(path)
    measured = [text for text in outputs if f"calibration stored in {path}" in text]
    assert len(measured) == 1, outputs  # once, whatever the lock made us retry
    assert f"no calibration at {path}: measuring" in measured[0]
    assert "measuring" not in outputs[-1]  # the second run read the stored one
    loaded = cal.load_calibration(path)
    assert loaded is not None and loaded.fabric["plan"] == "quick"
    assert len(loaded.steps) >= 1 and loaded.capacity_bps > 0
