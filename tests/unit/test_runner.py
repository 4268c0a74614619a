"""``astral run`` without root: the runner on loopback workers, the load guard, pinning and
ceilings as data, and the command line's answer to a malformed experiment.

The runner only needs a testbed that launches workers and knows its fabric; here
:class:`LoopbackTestbed` gives it the workers of orchestrator/worker on 127.0.0.x (the
launcher's own test set-up) under the fabric description of astral-small, so everything the
runner does with results (records, tables, the bundle, failures) runs for real.
"""

from __future__ import annotations

import _thread
import json
import math
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controllers.pinning import PinnedPaths, paths_document
from orchestrator.calibration.capacity import Calibration
from orchestrator.collectives.ceilings import default_channels, fabric_share
from orchestrator.run.experiment import ExperimentSpec, parse_experiment
from orchestrator.run.loadguard import load_guard
from orchestrator.run.runner import Runner, RunOptions, step_seconds
from orchestrator.testbed import testbed
from orchestrator.testbed.pinning import assign, candidates, fabric_flows
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.spec import LaunchOptions, loopback_workers
from tests.helpers import REPO, preset_description
from topologies.description import FabricDescription
from topologies.errors import ExperimentError

POLICIES = ("shortest", "ecmp", "ecmp-polarized", "path-pinned")


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return preset_description("astral-small")


def experiment(**changes: Any) -> ExperimentSpec:
    document: dict[str, Any] = {
        "name": "unit",
        "fabric": "astral-small",
        "policies": ["ecmp", "path-pinned"],
        "collectives": ["all-reduce", {"op": "all-to-all", "algorithm": "direct"}],
        "sizes": {"min": "4K", "max": "16K", "factor": 4},
        "iterations": 2,
        "warmup": 1,
    }
    document.update(changes)
    return parse_experiment(document, "unit.yaml", REPO, policies=POLICIES)


@dataclass
class LoopbackTestbed:
    """What the runner uses of a Testbed, with loopback workers (ranks 2 per "server")."""

    description: FabricDescription
    run_dir: Path
    policy: str = "ecmp"
    switches: list[str] = field(default_factory=list)
    launches: int = 0
    host_ports: list[str | None] = field(default_factory=list)  # each launch's

    @property
    def emulation(self) -> Any:
        return SimpleNamespace(datapath=None, timings={})

    # Read off the description as the Testbed reads them (its own properties; a class named
    # Test* imported here would be collected by pytest).
    scale = testbed.Testbed.scale
    nic_ports = testbed.Testbed.nic_ports

    def rail_bandwidth(self) -> float:
        return 5e6

    def default_channels(self, gpus: Any, collectives: Any) -> int:
        workers = loopback_workers(8, 2)
        return max(default_channels(workers, op, alg, 2) for op, alg in collectives)

    def use_policy(self, name: str) -> float:
        if name == self.policy:
            return 0.0
        self.policy = name
        self.switches.append(name)
        return 0.01

    def launch(
        self,
        gpus: Sequence[str] | None = None,
        options: LaunchOptions | None = None,
        collectives: Any = None,
        *,
        host_ports: str | None = None,
    ) -> Launcher:
        self.launches += 1
        self.host_ports.append(host_ports)
        fast = replace(
            options or LaunchOptions(),
            heartbeat_interval=0.1,
            heartbeat_timeout=1.5,
            settle_time=0.3,
        )
        return Launcher(
            loopback_workers(len(gpus or self.description.fabric.gpus), 2),
            options=fast,
            run_dir=self.run_dir / f"w{self.launches}",
        )

    def port_counters(self, since: float | None = None) -> list[Any]:
        return []

    @property
    def telemetry_path(self) -> Path | None:
        return None


def run(
    spec: ExperimentSpec, tmp_path: Path, description: FabricDescription, **options: Any
) -> tuple[Any, LoopbackTestbed, str]:
    bed = LoopbackTestbed(description, tmp_path / "run")
    lines: list[str] = []
    runner = Runner(
        spec,
        RunOptions(out=tmp_path / "bundle", plots=False, **options),
        text="name: unit\n",
        out=SimpleNamespace(write=lines.append, flush=lambda: None),  # type: ignore[arg-type]
    )
    outcome = runner.run(bed)  # type: ignore[arg-type]
    return outcome, bed, "".join(lines)


def test_the_runner_runs_every_step_and_writes_the_bundle(
    tmp_path: Path, description: FabricDescription
) -> None:
    spec = experiment()
    outcome, bed, printed = run(spec, tmp_path, description)
    assert outcome.status == "ok" and outcome.exit_status == 0, outcome.error
    assert bed.switches == ["path-pinned"]
    assert bed.launches == 4  # one launch per policy and collective
    run_channels = json.loads((tmp_path / "bundle" / "run.json").read_text())["channels"]
    assert run_channels == {"all-reduce (ring)": 2, "all-to-all (direct)": 1}
    assert len(outcome.results) == len(spec.steps()) == 8
    assert all(r.row.wrong == 0 and r.row.busbw > 0 for r in outcome.results)
    # one table per policy and collective, nccl-tests style, real speeds and the time rule
    assert printed.count("# Avg bus bandwidth    :") == 4
    assert printed.count("# time: mean over ranks") >= 4
    assert "real speed" in printed and "# astral run 'unit': ok" in printed
    assert "load guard:" in printed
    bundle = tmp_path / "bundle"
    for name in ("results.sqlite", "fabric.json", "experiment.yaml", "summary.json", "run.json"):
        assert (bundle / name).is_file()
    assert len(list((bundle / "tables").glob("*.txt"))) == 4
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["run"]["status"] == "ok"
    by_key = {(c["policy"], c["collective"], c["size"]): c for c in summary["configurations"]}
    for result in outcome.results:  # printed and stored numbers are the same numbers
        c = result.configuration
        assert by_key[(c.policy, c.collective, c.size)]["busbw_GBps"] == pytest.approx(
            result.row.busbw, rel=1e-12
        )
    with sqlite3.connect(bundle / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM iterations").fetchone()[0] == 8 * 8 * 3
        assert db.execute("SELECT COUNT(*) FROM timelines").fetchone()[0] > 0
        assert db.execute("SELECT COUNT(*) FROM connections").fetchone()[0] > 0
    run_file = json.loads((bundle / "run.json").read_text())
    assert run_file["status"] == "ok"
    assert [s["step"] for s in run_file["timings"]["steps"]] == list(range(8))
    assert run_file["load_guard"]["offered_bps"] == pytest.approx(8 * 2 * 20e6)
    # how hosts pick NIC ports: the default, given to every launch, named everywhere
    assert spec.host_ports == "balanced" and run_file["host_ports"] == "balanced"
    assert bed.host_ports == ["balanced"] * 4
    assert printed.count(", host ports balanced, 8 ranks") == 4  # every table's header
    assert "; host ports balanced; " in printed  # the side-by-side summary's
    assert {c["host_ports"] for c in summary["configurations"]} == {"balanced"}
    for table in (bundle / "tables").glob("*.txt"):
        assert ", host ports balanced, 8 ranks" in table.read_text(), table.name


def test_the_experiments_host_ports_reach_every_launch_and_the_bundle(
    tmp_path: Path, description: FabricDescription
) -> None:
    spec = experiment(host_ports="hash", policies=["ecmp"], collectives=["all-reduce"])
    outcome, bed, printed = run(spec, tmp_path, description)
    assert outcome.status == "ok", outcome.error
    assert bed.host_ports == ["hash"]
    assert "all-reduce (ring), policy ecmp, host ports hash, 8 ranks" in printed
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    assert {c["host_ports"] for c in summary["configurations"]} == {"hash"}
    assert [a["host_ports"] for a in summary["averages"]] == ["hash"]


def test_a_hung_worker_ends_the_run_with_its_rank_and_a_failed_bundle(
    tmp_path: Path, description: FabricDescription
) -> None:
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, _, printed = run(
        spec, tmp_path, description, worker_args=("--hang-rank", "3"), step_deadline=1.5
    )
    assert outcome.status == "failed" and outcome.exit_status == 4
    assert outcome.failure is not None and outcome.failure.ranks == [3]
    assert "# FAILED: workers failed during" in printed and "rank 3 (lo3)" in printed
    run_file = json.loads((tmp_path / "bundle" / "run.json").read_text())
    culprit = run_file["failure"]["culprits"][0]
    assert (culprit["rank"], culprit["host"], culprit["kind"]) == (3, "lo3", "hung")
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    assert summary["run"]["status"] == "failed"


def test_load_guard_refuses_above_the_safe_share_unless_forced() -> None:
    spec = experiment()
    none = load_guard(spec, uncalibrated=True)
    assert not none.calibrated and not none.refused
    assert "no calibration on this machine" in none.summary()[0]
    offered = none.assessment.offered.hop_bps
    big = Calibration(capacity_bps=offered * 10, bound="bracketed", safe_share=0.7)
    small = Calibration(capacity_bps=offered / 2, bound="bracketed", safe_share=0.7)
    assert not load_guard(spec, calibration=big).over
    refused = load_guard(spec, calibration=small)
    assert refused.refused and not refused.emulator_bound
    with pytest.raises(ExperimentError) as error:
        raise refused.error()
    assert error.value.key == "load_limit.force" and error.value.exit_status == 2
    forced = load_guard(spec, calibration=small, force=True)
    assert forced.emulator_bound and not forced.refused
    assert "EMULATOR-BOUND" in forced.summary()[0]
    from_file = load_guard(experiment(load_limit={"force": True}), calibration=small)
    assert from_file.emulator_bound and from_file.to_dict()["emulator_bound"] is True


def test_pinning_puts_the_ring_on_disjoint_links(description: FabricDescription) -> None:
    workers = [
        SimpleNamespace(rank=r, host=g.name, server=g.server, local_rank=g.local_rank)
        for r, g in enumerate(description.fabric.gpus_by_rank())
    ]
    document = paths_document(PinnedPaths(description))
    paths = candidates(document)
    groups = fabric_flows(workers, [("all-reduce", "ring"), ("all-to-all", "direct")], 2)  # type: ignore[arg-type]
    assert len(groups[0]) == 4 * 2  # odd ranks send to the next server, 2 channels each
    assert len(groups[1]) == 8 * 6 * 2  # every rank to its 6 peers off its server
    chosen = assign(groups, workers, paths)  # type: ignore[arg-type]
    assert set(chosen) == set(groups[0]) | set(groups[1])
    ring_links = [link for flow in groups[0] for link in chosen[flow].links()]
    assert len(ring_links) == len(set(ring_links))  # no link carries two ring connections
    for rank in range(1, 8, 2):  # the two channels leave by the two NIC ports
        assert {chosen[(rank, (rank + 1) % 8, c)].nic for c in (0, 1)} == {1, 2}


def test_fabric_shares_and_channels_of_the_algorithms() -> None:
    workers = loopback_workers(8, 2)  # 4 servers of 2 GPUs, as astral-small
    assert fabric_share(workers, "all-reduce", "ring") == pytest.approx(1.0)
    assert fabric_share(workers, "all-reduce", "hierarchical") == pytest.approx(0.75 / 1.75)
    assert fabric_share(workers, "all-to-all", "direct") == pytest.approx(6 / 7)
    # enough connections per peer to use both NIC ports, no more
    assert default_channels(workers, "all-reduce", "ring", 2) == 2  # one fabric peer
    assert default_channels(workers, "all-to-all", "direct", 2) == 1  # six
    assert default_channels(workers, "all-to-all", "pxn", 2) == 2  # three
    assert default_channels(loopback_workers(8, 1), "all-to-all", "direct", 2) == 2  # seven


def test_step_weights_grow_with_the_traffic() -> None:
    steps = experiment().steps()
    weights = [step_seconds(s, 5e6) for s in steps if s.policy == "ecmp"]
    assert weights[0] < weights[1] and all(w > 0 for w in weights)
    assert not math.isnan(sum(weights))


def test_a_malformed_experiment_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nfabric: astral-small\npolicy: nope\ncollectives: [all-reduce]\n"
                   "sizes: {min: 1K, max: 4K}\n")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(bad), "--out", str(tmp_path / "b")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"{bad}: key 'policy'" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_ctrl_c_marks_the_bundle_interrupted_and_stops_the_workers(
    tmp_path: Path, description: FabricDescription
) -> None:
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"], iterations=10**6)
    timer = threading.Timer(3.0, _thread.interrupt_main)
    timer.start()
    try:
        outcome, _, printed = run(spec, tmp_path, description)
    finally:
        timer.cancel()
    assert outcome.status == "interrupted" and outcome.exit_status == 130
    assert "# astral run 'unit': interrupted" in printed
    run_file = json.loads((tmp_path / "bundle" / "run.json").read_text())
    assert run_file["status"] == "interrupted"
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    assert summary["run"]["status"] == "interrupted"
    assert not list((tmp_path / "run").glob("w*/workers.sock"))  # the launcher closed
