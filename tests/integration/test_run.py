"""``astral run`` end to end on a real emulated astral-small, through the pytest plugin.

One fabric for the whole module (the ``astral_fabric`` fixture, orchestrator/pytest_plugin.py):
the experiment below runs every collective algorithm under ``ecmp`` and ``path-pinned`` with
one small size through the runner (the code ``astral run`` runs, on the fixture's testbed), and
the tests check its results, its bundle, a worker killed in the middle of a run, and the
command line's answer to a malformed experiment.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from orchestrator.run.experiment import ExperimentSpec, parse_experiment
from orchestrator.run.runner import RunOptions, RunOutcome
from tests.helpers import REPO
from topologies.units import TCP_PAYLOAD_SHARE

pytestmark = pytest.mark.integration

COLLECTIVES = [
    {"op": "all-reduce", "algorithm": "ring"},
    {"op": "all-reduce", "algorithm": "hierarchical"},
    {"op": "all-gather", "algorithm": "ring"},
    {"op": "reduce-scatter", "algorithm": "ring"},
    {"op": "all-to-all", "algorithm": "direct"},
    {"op": "all-to-all", "algorithm": "pxn"},
]
POLICIES = ["ecmp", "path-pinned"]
EXPERIMENT = {
    "name": "it-every-collective",
    "fabric": "astral-small",
    "policies": POLICIES,
    "collectives": COLLECTIVES,
    "sizes": {"min": "256K", "max": "256K"},  # one size: the suite's time
    "iterations": 2,
    "warmup": 1,
}


def experiment(document: dict[str, object]) -> ExperimentSpec:
    return parse_experiment(document, "test_run.py", REPO)  # the controller's policy names


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="ecmp")


@pytest.fixture(scope="module")
def outcome(fabric: FabricHandle, tmp_path_factory: pytest.TempPathFactory) -> RunOutcome:
    out = tmp_path_factory.mktemp("run") / "bundle"
    return fabric.run_experiment(experiment(EXPERIMENT), RunOptions(out=out, plots=True))


def test_every_collective_verifies_and_stays_under_its_own_ceiling(
    fabric: FabricHandle, outcome: RunOutcome
) -> None:
    """Every cell, of every collective, policy and size, at most the configuration's own
    busbw ceiling (NIC ports x rate x TCP's payload share / the algorithm's fabric share):
    no allowance for the shapers' buckets, which the timed batches are sized to make
    negligible (orchestrator.collectives.ceilings)."""
    assert outcome.status == "ok", outcome.error
    assert outcome.exit_status == 0
    seen = {(r.configuration.policy, r.configuration.collective, r.configuration.algorithm)
            for r in outcome.results}  # fmt: skip
    assert seen == {(p, c["op"], c["algorithm"]) for p in POLICIES for c in COLLECTIVES}
    assert len(outcome.results) == len(POLICIES) * len(COLLECTIVES)
    for result in outcome.results:
        c = result.configuration
        ceiling = fabric.busbw_ceiling(c.collective, c.algorithm)
        label = f"{c.policy} {c.collective}/{c.algorithm} {c.size} B"
        assert result.ceiling is not None and result.ceiling.busbw == pytest.approx(ceiling)
        assert result.row.wrong == 0, label
        assert 0 < result.row.busbw <= ceiling, f"{label}: {result.row.busbw} vs {ceiling}"
        assert c.iterations >= EXPERIMENT["iterations"], label
        assert not any(m.startswith("ABOVE") for m in result.marks()), label
    # a flat algorithm's ceiling: 2 NIC ports x the emulated rate x TCP's payload share
    rail = 2 * 20e6 / 8 / 1e9
    assert fabric.busbw_ceiling("all-reduce", "ring") == pytest.approx(rail * TCP_PAYLOAD_SHARE)


def test_the_bundle_has_every_file(outcome: RunOutcome) -> None:
    bundle = outcome.bundle
    assert bundle is not None
    for name in ("results.sqlite", "fabric.json", "summary.json", "run.json", "telemetry.jsonl"):
        assert (bundle / name).is_file(), name
    groups = [f"{p}__{c['op']}-{c['algorithm']}" for p in POLICIES for c in COLLECTIVES]
    for group in groups:
        for suffix in (".txt", ".csv"):
            assert (bundle / "tables" / f"{group}{suffix}").is_file(), group + suffix
        for size in ("256K",):
            assert (bundle / "plots" / "connections" / f"{group}__{size}.png").is_file()
    for c in COLLECTIVES:
        assert (bundle / "plots" / f"busbw-{c['op']}-{c['algorithm']}.png").is_file()
    assert (bundle / "plots" / "link-utilization.png").is_file()
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["run"]["status"] == "ok"
    assert len(summary["configurations"]) == len(outcome.results)
    assert all(c["wrong"] == 0 for c in summary["configurations"])
    assert all(c["verified"] for c in summary["configurations"])
    # path-pinned pins every fabric connection's source port; ecmp pins none
    unpinned = {(c["policy"], c["unpinned_connections"]) for c in summary["configurations"]}
    # host ports balanced (the default): every connection's source port is planned, under
    # ecmp (its NIC port) as under path-pinned (its NIC port and path)
    assert unpinned == {("ecmp", 0), ("path-pinned", 0)}
    assert summary["run"]["versions"]["ovs"] not in ("", "unknown")
    run = json.loads((bundle / "run.json").read_text())
    assert run["status"] == "ok" and run["failure"] is None
    assert run["load_guard"]["offered_bps"] == pytest.approx(8 * 2 * 20e6)
    floors = run["conditions"]["tcp_rto_min"]  # every launch's connections, as reported
    assert floors["connections"] > 0
    granted = run["conditions"]["start"]["tcp_rto_min_us"]
    assert floors["in_effect"] == (floors["connections"] if granted else 0)
    with sqlite3.connect(bundle / "results.sqlite") as db:
        for table in ("iterations", "connection_samples", "timelines", "port_counters"):
            (count,) = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
            assert count > 0, table


def test_the_tables_the_runner_prints_match_the_bundle(outcome: RunOutcome) -> None:
    assert outcome.bundle is not None
    summary = json.loads((outcome.bundle / "summary.json").read_text())
    printed = {
        (r.configuration.policy, r.configuration.collective, r.configuration.algorithm,
         r.configuration.size): r.row.busbw
        for r in outcome.results
    }  # fmt: skip
    for c in summary["configurations"]:
        key = (c["policy"], c["collective"], c["algorithm"], c["size"])
        assert c["busbw_GBps"] == pytest.approx(printed[key], rel=1e-9)


def test_every_configuration_carries_the_cpu_sampled_while_it_ran(outcome: RunOutcome) -> None:
    """The live saturation flag on a real fabric: every configuration sampled over its
    measured window and judged; the bundle, summary.json and the tables agree."""
    assert outcome.bundle is not None
    ids = [r.configuration.id for r in outcome.results]
    assert sorted(outcome.emulator) == sorted(ids)
    for load in outcome.emulator.values():
        assert load.samples >= 2 and load.sampled_s >= load.window_s > 0
        assert 0 <= load.idle_share <= 1
        assert load.vswitchd_cores > 0  # the real ovs-vswitchd forwarded this traffic
        assert 0 <= load.vswitchd_wait <= 1 and load.softirqd_wait >= 0
        assert load.saturated == bool(load.reasons)
    summary = json.loads((outcome.bundle / "summary.json").read_text())
    stored = {c["id"]: c["emulator_saturated"] for c in summary["configurations"]}
    assert stored == {i: load.saturated for i, load in outcome.emulator.items()}
    flagged = {i for i, load in outcome.emulator.items() if load.saturated}
    assert summary["emulator"]["saturated_configurations"] == sorted(flagged)
    for result in outcome.results:  # a table's header names its flagged sizes, if any
        c = result.configuration
        text = outcome.bundle / "tables" / f"{c.policy}__{c.collective}-{c.algorithm}.txt"
        header = text.read_text()
        group = [r for r in outcome.results if r.configuration.group == c.group]
        if any(r.configuration.id in flagged for r in group):
            assert "# EMULATOR SATURATED while measuring" in header
        else:
            assert "SATURATED" not in header
    with sqlite3.connect(outcome.bundle / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM emulator_load").fetchone()[0] == len(ids)


def worker_pids(run_dir: Path, rank: int) -> list[int]:
    """Worker processes of ``rank`` whose control socket is under ``run_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "orchestrator.worker" not in argv or "--rank" not in argv:
            continue
        socket = argv[argv.index("--socket") + 1] if "--socket" in argv else ""
        if argv[argv.index("--rank") + 1] == str(rank) and socket.startswith(str(run_dir)):
            pids.append(int(entry.name))
    return pids


def all_workers(run_dir: Path) -> list[int]:
    return [pid for rank in range(8) for pid in worker_pids(run_dir, rank)]


@pytest.fixture
def killer(fabric: FabricHandle) -> Iterator[threading.Event]:
    """Kills rank 3's worker once it has run for 3 s; set the event to stop early."""
    stop = threading.Event()

    def kill() -> None:
        began = None
        while not stop.wait(0.05):
            pids = worker_pids(fabric.testbed.run_dir, 3)
            if pids and began is None:
                began = time.monotonic()
            if pids and began is not None and time.monotonic() - began > 3.0:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                return

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    yield stop
    stop.set()
    thread.join(5)


def test_a_killed_worker_is_named_and_the_run_ends_cleanly(
    fabric: FabricHandle, killer: threading.Event, tmp_path: Path
) -> None:
    document = dict(EXPERIMENT, name="it-killed", policies=["ecmp"],
                    collectives=[{"op": "all-reduce", "algorithm": "ring"}],
                    sizes={"min": "4M", "max": "4M"}, iterations=50)  # fmt: skip
    began = time.monotonic()
    outcome = fabric.run_experiment(experiment(document), RunOptions(out=tmp_path / "b"))
    assert time.monotonic() - began < 60
    assert outcome.status == "failed"
    assert outcome.exit_status == 4
    assert outcome.failure is not None
    culprits = [(p.rank, p.host, p.kind) for p in outcome.failure.culprits]
    assert culprits == [(3, "p0s1g1", "exited")], str(outcome.failure)
    assert "rank 3 (p0s1g1)" in str(outcome.failure)
    # clean: no worker of the run is left, the bundle says what happened
    assert all_workers(fabric.testbed.run_dir) == []
    run = json.loads((tmp_path / "b" / "run.json").read_text())
    assert run["status"] == "failed"
    assert run["failure"]["culprits"][0]["host"] == "p0s1g1"
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["run"]["status"] == "failed"
    # and the fabric is still good for the next run
    again = fabric.run("all-reduce", "ring", sizes=["64K"], iterations=1, record=False)
    assert again.failure is None and again.wrong == 0


def test_a_malformed_experiment_exits_2_and_creates_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nfabric: astral-small\npolicy: ecmp\ncollectives: [all-reduce]\n"
                   "sizes: {min: 1M, max: 64K}\n")  # fmt: skip
    runs = Path(os.environ.get("ASTRAL_STATE_DIR") or "/run/astral") / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    out = tmp_path / "bundle"
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", str(bad), "--out", str(out)],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "sizes.max" in result.stderr and str(bad) in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not (tmp_path / "results").exists()
    after = set(runs.iterdir()) if runs.is_dir() else set()
    assert after == before
