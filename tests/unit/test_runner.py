"""``astral run`` without root: the runner on loopback workers, the load guard, pinning and
ceilings as data, and the command line's answer to a malformed experiment.

The runner only needs a testbed that launches workers and knows its fabric; here
:class:`LoopbackTestbed` gives it the workers of orchestrator/worker on 127.0.0.x (the
launcher's own test set-up) under the fabric description of astral-small, so everything the
runner does with results (records, tables, the bundle, failures) runs for real.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import math
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controllers.pinning import PinnedPaths, paths_document
from orchestrator.calibration.capacity import Calibration
from orchestrator.collectives.ceilings import (
    Ceiling,
    configuration_ceiling,
    default_channels,
    fabric_share,
)
from orchestrator.collectives.nccl import TIME_DEFINITION
from orchestrator.diagnosis.detectors import QUIET_AFTER_S
from orchestrator.emulation import signals
from orchestrator.emulation.executor import run_local
from orchestrator.emulation.pathtrace import DROPPED, TRACED, Hop, TracedPath
from orchestrator.monitor import record
from orchestrator.results import ResultsBundle
from orchestrator.results.store import ControllerRestart
from orchestrator.run.experiment import ExperimentSpec, parse_experiment
from orchestrator.run.loadguard import load_guard
from orchestrator.run.runner import (
    Runner,
    RunOptions,
    emulator_line,
    rto_min_line,
    rto_min_summary,
    step_seconds,
)
from orchestrator.testbed import testbed
from orchestrator.testbed.monitoring import FULL, MonitorLevel
from orchestrator.testbed.pinning import Candidate, Pinning, assign, candidates, fabric_flows
from orchestrator.testbed.queues import QDISC_COMMAND
from orchestrator.testbed.tracing import PathTraces
from orchestrator.worker import rto
from orchestrator.worker.launcher import Launcher, local_spawn
from orchestrator.worker.outcome import ConnectionInfo
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
    restarts: list[ControllerRestart] = field(default_factory=list)  # as Testbed keeps them
    launches: int = 0
    pinning: Pinning | None = None  # the last launch's source ports, as Testbed has it
    pinnings: dict[str, Pinning] = field(default_factory=dict)  # policy -> what to report
    spawn_delay: float = 0.0  # seconds before each worker starts (a slow start-up)
    interrupt_at_spawn: int | None = None  # Ctrl-C while starting the worker of this rank
    spawned: list[Any] = field(default_factory=list)  # every worker process started
    host_ports: list[str | None] = field(default_factory=list)  # each launch's
    monitor: MonitorLevel = FULL  # as Testbed.use_monitor sets it
    launch_dirs: list[Path] = field(default_factory=list)
    launcher: Launcher | None = None
    # what the switches would say of the connections' paths (default: nothing to trace)
    tracer: Callable[[Sequence[ConnectionInfo]], PathTraces] | None = None

    @property
    def emulation(self) -> Any:
        # its commands (the switches' queues: tc) run here, where no switch of the model is
        return SimpleNamespace(
            datapath=None,
            timings={},
            controller=None,
            fitted_recipe=None,
            run=lambda node, argv, **options: run_local(argv, **options),
        )

    def use_monitor(self, level: MonitorLevel) -> float:
        self.monitor = level
        return 0.0

    process_groups = testbed.Testbed.process_groups

    # Read off the description as the Testbed reads them (its own properties; a class named
    # Test* imported here would be collected by pytest).
    scale = testbed.Testbed.scale
    nic_ports = testbed.Testbed.nic_ports

    def rail_bandwidth(self) -> float:
        return 5e6

    def default_channels(self, gpus: Any, collectives: Any) -> int:
        workers = loopback_workers(8, 2)
        return max(default_channels(workers, op, alg, 2) for op, alg in collectives)

    def ceiling(self, gpus: Any, collective: str, algorithm: str) -> Ceiling:
        workers = loopback_workers(len(gpus or self.description.fabric.gpus), 2)
        return configuration_ceiling(workers, collective, algorithm, self.rail_bandwidth(), 0.01)

    def use_policy(self, name: str) -> float:
        if name == self.policy:
            return 0.0
        self.policy = name
        self.switches.append(name)
        began = time.time()
        self.restarts.append(ControllerRestart(began, began + 0.01, name, "policy"))
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
        self.pinning = self.pinnings.get(self.policy)
        self.host_ports.append(host_ports)
        fast = replace(
            options or LaunchOptions(),
            heartbeat_interval=0.1,
            heartbeat_timeout=1.5,
            settle_time=0.3,
            tcp_info=self.monitor.tcp_info,
        )
        self.launch_dirs.append(self.run_dir / f"w{self.launches}")
        self.launcher = Launcher(
            loopback_workers(len(gpus or self.description.fabric.gpus), 2),
            spawn=self.spawn,
            options=fast,
            run_dir=self.launch_dirs[-1],
            live=self.run_dir / testbed.LIVE_FILE if self.monitor.live else None,
        )
        return self.launcher

    def spawn(self, worker: Any, argv: list[str], log: Any) -> Any:
        if worker.rank == self.interrupt_at_spawn:
            # as a Ctrl-C does: it lands in the main thread, in the sleep below
            _thread.interrupt_main()
        time.sleep(self.spawn_delay)
        process = local_spawn(worker, argv, log)
        self.spawned.append(process)
        return process

    def port_counters(self, since: float | None = None) -> list[Any]:
        return []

    def trace_paths(self, connections: Any, workers: Any = None) -> PathTraces:
        """Loopback workers cross no switch: nothing to trace (the planned paths stay),
        unless the test says what the switches would answer."""
        if self.tracer is not None:
            return self.tracer(connections)
        return PathTraces({}, seconds=0.0, switch_seconds=0.0, traces=0, via="none")

    @property
    def telemetry_path(self) -> Path | None:
        return None


def run(
    spec: ExperimentSpec,
    tmp_path: Path,
    description: FabricDescription,
    *,
    bed: LoopbackTestbed | None = None,
    said: list[str] | None = None,
    **options: Any,
) -> tuple[Any, LoopbackTestbed, str]:
    """Run ``spec`` on ``bed`` (default a fresh LoopbackTestbed); the status messages go
    to ``said``; returns the outcome, the bed and what the runner printed."""
    bed = bed or LoopbackTestbed(description, tmp_path / "run")
    lines: list[str] = []
    runner = Runner(
        spec,
        RunOptions(out=tmp_path / "bundle", plots=False, **options),
        text="name: unit\n",
        out=SimpleNamespace(write=lines.append, flush=lambda: None),  # type: ignore[arg-type]
        say=None if said is None else said.append,
    )
    outcome = runner.run(bed)  # type: ignore[arg-type]
    return outcome, bed, "".join(lines)


def astral_run(experiment_file: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``astral run EXPERIMENT --out tmp_path/b`` in a subprocess, from ``tmp_path``."""
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(experiment_file),
         "--out", str(tmp_path / "b")],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip


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
    assert printed.count(f"# {TIME_DEFINITION}") >= 4
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
    with ResultsBundle.open(bundle) as results:  # the policy switch, for the diagnosis
        assert results.controller_restarts() == bed.restarts
        (switch,) = bed.restarts
        assert switch.policy == "path-pinned" and switch.reason == "policy"
    run_file = json.loads((bundle / "run.json").read_text())
    assert run_file["status"] == "ok"
    assert [s["step"] for s in run_file["timings"]["steps"]] == list(range(8))
    # the live diagnosis looked (with the testbed's restarts) and nothing failed it
    assert run_file["live_diagnosis"]["checks"] > 0 and "alert_errors" not in run_file
    assert run_file["load_guard"]["offered_bps"] == pytest.approx(8 * 2 * 20e6)
    # the minimum RTO: the kernel's answer at start and end, and the workers' reports
    granted = rto.probe()[1]
    conditions = run_file["conditions"]
    assert conditions["start"]["tcp_rto_min_us"] == conditions["end"]["tcp_rto_min_us"] == granted
    reported = conditions["tcp_rto_min"]
    assert reported["requested_us"] == 5000 and reported["connections"] > 0
    assert reported["in_effect"] == (reported["connections"] if granted else 0)
    assert reported["granted_us"] == ([granted] if granted else [])
    assert ("minimum RTO" in printed) and (("WARNING" in printed) is (granted is None))
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


def test_the_minimum_rto_line_warns_with_the_cost_where_it_is_missing() -> None:
    assert rto_min_line([8000, 8000]) == (
        "minimum RTO 8 ms on all 2 connections (5 ms asked, in the kernel's clock ticks)"
    )
    line = rto_min_line([8000, None, None])
    assert line.startswith("WARNING: the 5 ms minimum RTO is not in effect on 2 of 3 ")
    assert "TCP_RTO_MIN_US" in line and "waits 200 ms" in line and "astral doctor" in line
    assert rto_min_summary([8000, None, 4000]) == {
        "requested_us": 5000, "connections": 3, "in_effect": 2, "granted_us": [4000, 8000]
    }  # fmt: skip


def test_every_configuration_is_judged_on_the_cpu_sampled_while_it_ran(
    tmp_path: Path, description: FabricDescription
) -> None:
    spec = experiment(policies=["ecmp"])
    outcome, _, printed = run(spec, tmp_path, description)
    assert outcome.status == "ok", outcome.error
    ids = {r.configuration.id for r in outcome.results}
    assert set(outcome.emulator) == ids  # every configuration sampled and judged
    offered = outcome.verdict.offered_hop_bps if outcome.verdict else None
    for load in outcome.emulator.values():
        assert load.samples >= 2 and load.sampled_s >= load.window_s > 0
        assert 0 <= load.idle_share <= 1 and load.vswitchd_cores >= 0
        assert load.offered_hop_bps == offered
        assert load.saturated == bool(load.reasons)  # the verdict and its reasons agree
    flagged = sum(load.saturated for load in outcome.emulator.values())
    assert f"# {emulator_line(outcome.emulator)}" in printed
    assert (f"in {flagged} of {len(ids)}" if flagged else f"any of the {len(ids)}") in printed
    bundle = tmp_path / "bundle"
    summary = json.loads((bundle / "summary.json").read_text())
    stored = {c["id"]: c["emulator_saturated"] for c in summary["configurations"]}
    assert stored == {i: load.saturated for i, load in outcome.emulator.items()}
    with sqlite3.connect(bundle / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM emulator_load").fetchone()[0] == len(ids)
    thresholds = json.loads((bundle / "run.json").read_text())["emulator_saturation"]
    assert set(thresholds) == {"idle_share", "cores_per_hop_gbps", "vswitchd_wait", "softirqd_wait"}


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
    # the live table has the failed configuration's row, saying why (it used to be dropped)
    rows = [line for line in printed.splitlines() if line[:1] == " "]
    failed = [line for line in rows if "FAILED: rank 3 (lo3) " in line]
    assert len(failed) == 1 and "nan" not in failed[0], printed
    run_file = json.loads((tmp_path / "bundle" / "run.json").read_text())
    culprit = run_file["failure"]["culprits"][0]
    assert (culprit["rank"], culprit["host"], culprit["kind"]) == (3, "lo3", "hung")
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    assert summary["run"]["status"] == "failed"


def test_the_sizes_measured_before_a_failure_stay_the_runs_figures(
    tmp_path: Path, description: FabricDescription
) -> None:
    """Rank 3 hangs in global iteration 4, in the collective's second size (16K): its first
    (4K) was measured, and is among the run's results as in its bundle, where a study's
    completes check reads it (it was dropped with the rest of the collective's group)."""
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, _, _ = run(
        spec, tmp_path, description,
        worker_args=("--hang-rank", "3", "--hang-at-iteration", "4"), step_deadline=1.5,
    )  # fmt: skip
    assert outcome.status == "failed"
    assert [(r.configuration.size, r.measured) for r in outcome.results] == [(4096, True)]


def test_a_corrupted_chunk_fails_the_run_with_exit_7_naming_the_configuration(
    tmp_path: Path, description: FabricDescription
) -> None:
    # rank 1 corrupts its first region in global iteration 4: the ring's 16K under ecmp
    # (iterations 0-2 are 4K's warm-up and timed ones, 3-5 16K's)
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, _, printed = run(
        spec,
        tmp_path,
        description,
        worker_args=("--corrupt-rank", "1", "--corrupt-iteration", "4"),
    )
    assert (outcome.status, outcome.exit_status) == ("failed", 7)
    assert outcome.failure is None  # every step ran
    wrong = outcome.wrong_results()
    assert [(r.configuration.policy, r.configuration.size) for r in wrong] == [("ecmp", 16384)]
    assert wrong[0].row.wrong is not None and wrong[0].row.wrong > 0
    phrase = f"policy ecmp, all-reduce (ring), 16K: {wrong[0].row.wrong} wrong elements"
    assert outcome.error == f"1 configuration delivered wrong data (#wrong > 0): {phrase}"
    assert f"# WRONG DATA: {phrase}" in printed and "# stopped" not in printed
    assert "# astral run 'unit': failed" in printed
    bundle = tmp_path / "bundle"
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["run"]["status"] == "failed"
    assert [c["size"] for c in summary["configurations"] if c["wrong"]] == [16384]
    run_file = json.loads((bundle / "run.json").read_text())
    assert run_file["status"] == "failed" and run_file["error"] == outcome.error
    assert run_file["failure"] is None


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


def test_the_run_counts_unpinned_connections_per_configuration(
    tmp_path: Path, description: FabricDescription
) -> None:
    bed = LoopbackTestbed(description, tmp_path / "run")
    ports = {(r, (r + 1) % 8, c): 40000 + r for r in range(8) for c in (0, 1)}
    left = [(0, 1, 0), (2, 3, 1), (4, 5, 0)]
    bed.pinnings["path-pinned"] = Pinning(
        ports={f: p for f, p in ports.items() if f not in left}, unpinned=left
    )
    said: list[str] = []
    outcome, _, printed = run(
        experiment(collectives=["all-reduce"]), tmp_path, description, bed=bed, said=said
    )
    assert outcome.status == "ok", outcome.error
    summary = json.loads((tmp_path / "bundle" / "summary.json").read_text())
    counts = {
        (c["policy"], c["size"]): c["unpinned_connections"] for c in summary["configurations"]
    }
    assert counts == {("ecmp", 4096): None, ("ecmp", 16384): None,
                      ("path-pinned", 4096): 3, ("path-pinned", 16384): 3}  # fmt: skip
    assert "# path-pinned: source ports planned, all-reduce (ring) 13 of 16 (3 left ephemeral)" in (
        printed
    )
    assert any("3 of 16 fabric connections got no planned source port" in m for m in said)


def traced_as(
    description: FabricDescription, routes: dict[tuple[int, int], list[str]], dropped: int
) -> Callable[[Sequence[ConnectionInfo]], PathTraces]:
    """What the switches answer: each fabric connection on its pair's route, the one from
    rank ``dropped`` dropped at its ToR."""
    fabric = description.fabric

    def trace(connections: Sequence[ConnectionInfo]) -> PathTraces:
        paths = {}
        for c in connections:
            if c.link != "fabric":
                continue
            nodes = routes[(c.src, c.dst)]
            hops = [
                Hop(h.node, h.in_port, h.out_port)
                for h in record.path_hops(fabric, Candidate(0, 1, tuple(nodes)))
            ]
            if c.src == dropped:
                stop = Hop(hops[1].node, hops[1].in_port, None)
                reason = f"{stop.node}: no entry sends it anywhere"
                paths[c.five_tuple] = TracedPath((hops[0], stop), DROPPED, reason, 1)
            else:
                paths[c.five_tuple] = TracedPath(tuple(hops), TRACED, "", len(hops) - 2)
        return PathTraces(paths, 0.01, 0.005, sum(p.traces for p in paths.values()), "test")

    return trace


def test_traced_paths_are_recorded_and_what_they_contradict_is_said(
    tmp_path: Path, description: FabricDescription
) -> None:
    """The runner records what tracing answers after every batch: ``traced`` paths, a
    dropped one as far as it went, a pinned path the switches do not follow replaced by
    the trace; it says each problem once per launch and keeps every tracing in run.json."""
    gpus = [g.name for g in description.fabric.gpus_by_rank()]
    pinned = PinnedPaths(description)
    ring = [(r, (r + 1) % 8) for r in range(1, 8, 2)]  # the fabric hops of the ring
    published = {p: pinned.paths(gpus[p[0]], gpus[p[1]], 1)[0][1] for p in ring}
    forwarded = dict(published)
    forwarded[(3, 4)] = next(
        nodes for _, nodes in pinned.paths(gpus[3], gpus[4], 1) if nodes != published[(3, 4)]
    )
    bed = LoopbackTestbed(
        description, tmp_path / "run", tracer=traced_as(description, forwarded, 5)
    )
    flows = [(a, b, c) for a, b in ring for c in (0, 1)]
    bed.pinnings["path-pinned"] = Pinning(
        ports={f: 41000 + 2 * f[0] + f[2] for f in flows},
        chosen={f: Candidate(1, 1, tuple(published[f[:2]])) for f in flows},
    )
    said: list[str] = []
    outcome, _, _ = run(
        experiment(collectives=["all-reduce"]), tmp_path, description, bed=bed, said=said
    )
    assert outcome.status == "ok", outcome.error
    dropped = [m for m in said if "could not be traced to their destination" in m]
    assert len(dropped) == 2  # once per launch (policy), not once per batch
    assert "2 of 8 fabric connections" in dropped[0] and "no entry sends it anywhere" in dropped[0]
    (contradicted,) = [m for m in said if "off their published path" in m]
    # rank 3's two channels forwarded elsewhere, rank 5's dropped: not on their paths either
    assert "policy path-pinned" in contradicted and "4 pinned connections" in contradicted
    with ResultsBundle.open(tmp_path / "bundle") as bundle:
        policy = {c.id: c.policy for c in bundle.configurations()}
        ends = {
            x.id: x for x in bundle.connections() if x.link == "fabric" and x.rank == x.src_rank
        }
        for connection_id, hops in bundle.paths().items():
            end = ends[connection_id]
            sources = {h.source for h in hops}
            if end.src_rank == 5:
                assert sources == {record.TRACE_DROPPED} and len(hops) == 2
            elif policy[end.config_id] == "path-pinned" and end.src_rank != 3:
                assert sources == {record.PINNED}
            else:
                assert sources == {record.TRACED}
                route = (int(end.src_rank or 0), int(end.dst_rank or 0))
                assert [h.node for h in hops] == forwarded[route]
        assert {c for c in ends.values() if c.id not in bundle.paths()} == set()
    traces = json.loads((tmp_path / "bundle" / "run.json").read_text())["path_traces"]
    assert [(t["policy"], t["size"]) for t in traces] == [
        ("ecmp", 4096), ("ecmp", 16384), ("path-pinned", 4096), ("path-pinned", 16384)
    ]  # fmt: skip
    assert all(t["outcomes"] == {"dropped": 2, "traced": 6} for t in traces)


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
    result = astral_run(bad, tmp_path)
    assert result.returncode == 2
    assert f"{bad}: key 'policy'" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: bad\nfabric: astral-small\nfabric: fat-tree-small\n", "lines 2 and 3"),
        ("name: bad\nseed: " + "[" * 4000 + "]" * 4000 + "\n", "levels of nested"),
        ("name: bad\nseed: &s [*s]\n", "recursive alias"),
        (
            "name: bad\nl0: &l0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 9)),
            "values once aliases are expanded",
        ),
    ],
    ids=["duplicate key", "deep nesting", "recursive alias", "alias bomb"],
)
def test_a_file_yaml_cannot_hold_safely_exits_2_without_a_traceback(
    tmp_path: Path, text: str, words: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    result = astral_run(bad, tmp_path)
    assert result.returncode == 2, result.stderr
    assert str(bad) in result.stderr and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_referenced_fabric_file_yaml_cannot_hold_safely_exits_2_naming_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "fab.yaml").write_text("name: f\nkind: astral\npods: &p [*p]\n")
    bad = tmp_path / "exp.yaml"
    bad.write_text("name: e\nfabric: fab.yaml\npolicy: ecmp\ncollectives: [all-reduce]\n"
                   "sizes: {min: 1K, max: 4K}\n")  # fmt: skip
    result = astral_run(bad, tmp_path)
    assert result.returncode == 2, result.stderr
    assert "fab.yaml: expected no alias inside the value of its own anchor" in result.stderr
    assert "the fabric of experiment" in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml", "fab.yaml"]


@pytest.fixture
def own_ctrl_c() -> Iterator[None]:
    """These tests press Ctrl-C on themselves: their runs take it, and the session must
    not stop for it (orchestrator.emulation.signals)."""
    mark = signals.mark()
    yield
    signals.forget(mark)


def test_ctrl_c_marks_the_bundle_interrupted_and_stops_the_workers(
    tmp_path: Path, description: FabricDescription, own_ctrl_c: None
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


def test_a_ctrl_c_whose_keyboardinterrupt_got_lost_still_stops_the_run(
    tmp_path: Path, description: FabricDescription, own_ctrl_c: None
) -> None:
    """A KeyboardInterrupt raised inside a finalizer is "ignored" by Python: here the
    run's SIGINT handler runs in another thread (its exception stays there), so only its
    note reaches the run, which must stop on it all the same."""
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"], iterations=10**6)

    def lost_ctrl_c() -> None:
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)
        with contextlib.suppress(KeyboardInterrupt):
            handler(signal.SIGINT, None)

    timer = threading.Timer(3.0, lost_ctrl_c)
    timer.start()
    try:
        outcome, bed, _ = run(spec, tmp_path, description)
    finally:
        timer.cancel()
    assert outcome.status == "interrupted" and outcome.exit_status == 130
    assert all(process.poll() is not None for process in bed.spawned)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_ctrl_c_while_the_workers_start_stops_them_too(
    tmp_path: Path, description: FabricDescription, own_ctrl_c: None
) -> None:
    bed = LoopbackTestbed(description, tmp_path / "run", spawn_delay=0.2, interrupt_at_spawn=3)
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, _, _ = run(spec, tmp_path, description, bed=bed)
    assert outcome.status == "interrupted" and outcome.exit_status == 130
    assert len(bed.spawned) == 3  # ranks 0-2 started, then Ctrl-C before rank 3
    assert all(process.poll() is not None for process in bed.spawned)
    assert not list((tmp_path / "run").glob("w*/workers.sock"))


def test_the_bundle_holds_the_monitor_layers_at_full_detail_and_fewer_at_light(
    tmp_path: Path, description: FabricDescription
) -> None:
    """Loopback workers, real TCP: every step with its peers, both ends of every
    connection, the senders' TCP_INFO, the CPU per interval with the workers' share, the
    worker logs copied and the live file written; at light, no TCP_INFO and no live file."""
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, bed, _ = run(spec, tmp_path, description)
    assert outcome.status == "ok", outcome.error
    bundle = tmp_path / "bundle"
    with ResultsBundle.open(bundle) as b:
        configs = b.configurations()
        steps = b.steps(configs[0].id)
        # ring all-reduce on 8 ranks: 14 steps, then the drain ("delivery"), per operation
        # (and a check of the data, "verify", not a step of the plan: no peers)
        ops = len(b.iterations(configs[0].id))
        ring = [s for s in steps if s.phase in ("reduce-scatter", "all-gather")]
        assert len(ring) == ops * 14 and sum(s.phase == "delivery" for s in steps) == ops
        assert all(not s.send_peers for s in steps if s.phase in ("delivery", "verify"))
        assert all(s.send_peers == ((s.rank + 1) % 8,) for s in ring)
        assert all(s.recv_peers == ((s.rank - 1) % 8,) for s in ring)
        assert all(s.sent > 0 and s.start <= s.end for s in ring)
        ends = b.connections(configs[0].id)
        assert ends and all(c.rank in (c.src_rank, c.dst_rank) for c in ends)
        senders = [c for c in ends if c.rank == c.src_rank]
        info = [s for c in senders for s in b.tcp_info(c.id)]
        assert info and all(s.rtt_us > 0 and s.cwnd > 0 for s in info)
        cpu = b.host_cpu()
        assert cpu and all(0.0 <= c.idle_share <= 1.0 for c in cpu)
        assert any((c.workers_cores or 0) > 0 for c in cpu)
    logs = sorted(p.relative_to(bundle / "logs").as_posix() for p in (bundle / "logs").rglob("*"))
    assert "w1/worker-0.log" in logs and "w1/worker-7.log" in logs
    assert (bed.run_dir / testbed.LIVE_FILE).is_file()
    assert json.loads((tmp_path / "bundle" / "run.json").read_text())["monitor"] == "full"

    light_dir = tmp_path / "light"
    light = experiment(policies=["ecmp"], collectives=["all-reduce"], monitor="light")
    outcome, bed, _ = run(light, light_dir, description)
    assert outcome.status == "ok", outcome.error
    with ResultsBundle.open(light_dir / "bundle") as b:
        assert b.steps(b.configurations()[0].id)  # the application layer stays
        assert all(not b.tcp_info(c.id) for c in b.connections())
        assert all(c.workers_cores is None for c in b.host_cpu())
    assert not (bed.run_dir / testbed.LIVE_FILE).exists()


@dataclass
class SampledTestbed(LoopbackTestbed):
    """A LoopbackTestbed that notes when the switches' queues were sampled (tc's command)."""

    sampled: list[float] = field(default_factory=list)

    @property
    def emulation(self) -> Any:
        def run(node: Any, argv: list[str], **options: Any) -> Any:
            if argv == QDISC_COMMAND:
                self.sampled.append(time.time())
            return run_local(argv, **options)

        return SimpleNamespace(
            datapath=None, timings={}, controller=None, fitted_recipe=None, run=run
        )


def test_the_queues_are_sampled_on_a_quiet_fabric_after_the_last_operation(
    tmp_path: Path, description: FabricDescription
) -> None:
    """Each switch's balance of packets in and out ends :data:`QUIET_AFTER_S` after the
    last operation (orchestrator.diagnosis.detectors.switch_leaks): the run samples the
    queues (and the counters poll) past it, at full detail by a poll interval more."""
    bed = SampledTestbed(description, tmp_path / "run")
    spec = experiment(policies=["ecmp"], collectives=["all-reduce"])
    outcome, bed, _ = run(spec, tmp_path, description, bed=bed)
    assert outcome.status == "ok", outcome.error
    with ResultsBundle.open(tmp_path / "bundle") as b:
        records = b.iterations(b.configurations()[0].id)
    last = max(r.start + r.time_us / 1e6 for r in records if r.start is not None)
    assert bed.sampled[-1] >= last + QUIET_AFTER_S + FULL.telemetry_interval
