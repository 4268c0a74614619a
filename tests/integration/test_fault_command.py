"""``astral fault`` on a fabric held by ``astral up`` (a subprocess, as a person runs it):
faults applied by hand, listed, cleared, a bad one refused with exit status 2, then the
holder killed with SIGKILL: ``astral clean`` removes what the faults added (an nftables
table in the root namespace, OpenFlow entries, a controller restarted by a fault), exactly.

A module of its own: ``astral up`` takes the machine-wide run lock, which a module-scoped
``astral_fabric`` would hold. Needs root and Open vSwitch.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.emulation.faults import loss_table
from orchestrator.emulation.state import FaultRecord, RunState, clean_faults, proc_starttime
from tests.helpers import REPO
from tests.integration.assertions import leftovers, snapshot
from tests.integration.test_runs import astral, finish, start_up
from topologies.description import FabricDescription

pytestmark = pytest.mark.integration


def nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_astral_fault_by_hand_and_astral_clean_after_kill_9(tmp_path: Path) -> None:
    before = snapshot()
    process, state = start_up("astral-small", "--policy", "ecmp")
    nodes = list(FabricDescription.read(state.run_dir / "fabric.json").fabric.nodes())
    run = ["--run", state.run_id]

    def fault(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(astral("fault", *run, *args), capture_output=True, text=True,
                              cwd=REPO, timeout=120)  # fmt: skip

    try:
        loss = fault("apply", "link-loss", "p0r0t0>p0r0a0", "--probability", "0.5")
        assert loss.returncode == 0, loss.stdout + loss.stderr
        hole = fault("apply", "blackhole", "c1", "--destination", "p1s1g1")
        assert hole.returncode == 0, hole.stdout + hole.stderr
        crash = fault("apply", "controller-crash")
        assert crash.returncode == 0, crash.stdout + crash.stderr
        bad = fault("apply", "link-down", "p0r0t0-p0r0a9")
        assert bad.returncode == 2 and "nearest" in bad.stderr
        straggler = fault("apply", "straggler", "p0s0g0", "--delay", "1ms")
        assert straggler.returncode != 0 and "needs a run's workers" in straggler.stderr
        listed = fault("list")
        assert [line.split()[1] for line in listed.stdout.splitlines()[1:] if line[:5].strip()] == [
            "link-loss", "blackhole", "controller-crash"
        ]  # fmt: skip
        # ids by hand start at 101; the controller comes back, kept in the fault record
        cleared = fault("clear", "103")
        assert cleared.returncode == 0, cleared.stdout + cleared.stderr
        (kept,) = FaultRecord(state.run_dir).kept()
        assert kept.pid is not None and proc_starttime(kept.pid) == kept.starttime
        table = loss_table(state.run_id, 101)
        assert table in nft_tables()
    except BaseException:
        process.send_signal(signal.SIGTERM)
        finish(process)
        raise
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert table in nft_tables()  # left behind, as its record says
    result = clean_now(state)
    finish(process, timeout=5)
    if result is not None:
        assert "removed what faults added" in result.stdout
    else:
        # Another run took the lock first and cleaned the record as it started (Emulation
        # cleans leftovers); one built from another branch may not know the fault record
        # yet, so clean that from the record, as astral clean does.
        clean_faults(RunState.load(state.run_dir))
    assert table not in nft_tables()
    assert proc_starttime(kept.pid) is None  # the restarted controller stopped
    assert leftovers(before, RunState.load(state.run_dir), nodes) == []
    assert FaultRecord(state.run_dir).entries() == [] and FaultRecord(state.run_dir).kept() == []


def clean_now(state: RunState, wait: float = 600.0) -> subprocess.CompletedProcess[str] | None:
    """``astral clean`` at once, again while another run holds the lock (exit 5); None
    when that run cleaned this one's record meanwhile."""
    deadline = time.monotonic() + wait
    while True:
        result = subprocess.run(
            astral("clean"), capture_output=True, text=True, cwd=REPO, timeout=120
        )
        if result.returncode == 0 and f"run {state.run_id}" in result.stdout:
            return result
        if RunState.load(state.run_dir).status == "clean":
            return None
        assert result.returncode == 5 and time.monotonic() < deadline, result.stdout + result.stderr
        time.sleep(0.5)


def test_overlapping_faults_compose_and_ids_are_not_reused() -> None:
    """Clearing one of two faults on a link or port leaves what the other implies; a
    cleared fault's id is not given again; a second clear says so."""
    before = snapshot()
    process, state = start_up("astral-small", "--policy", "ecmp")
    nodes = list(FabricDescription.read(state.run_dir / "fabric.json").fabric.nodes())

    def fault(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(astral("fault", "--run", state.run_id, *args),
                              capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip

    def rate(dev: str) -> str:
        shown = subprocess.run(["tc", "class", "show", "dev", dev], capture_output=True, text=True)
        return shown.stdout.split(" rate ", 1)[1].split()[0]

    try:
        assert fault("apply", "link-slow", "p0r0t0-p0r0a0", "--rate", "0.1").returncode == 0
        slowed = rate("p0r0t0-eth3")
        milder = fault("apply", "link-slow", "p0r0t0-p0r0a0", "--rate", "0.5", "--duration", "1s")
        assert milder.returncode == 0 and "fault 102 cleared" in milder.stdout, milder.stdout
        assert rate("p0r0t0-eth3") == slowed  # 101's rate, not the link's own
        assert fault("apply", "link-down", "p0s0g0-p0r0t0").returncode == 0  # 103, not 102
        assert fault("apply", "switch-down", "p0r0t0").returncode == 0  # 104
        assert fault("clear", "104").returncode == 0
        link = subprocess.run(["ip", "link", "show", "p0r0t0-eth1"], capture_output=True, text=True)
        assert ",UP" not in link.stdout  # 103 holds it down
        again = fault("clear", "104", "104")
        assert again.returncode == 0 and "already cleared" in again.stdout
        assert fault("clear", "--all").returncode == 0
    finally:
        process.send_signal(signal.SIGTERM)
        finish(process)
    assert leftovers(before, RunState.load(state.run_dir), nodes) == []
