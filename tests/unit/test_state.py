"""The run record and its cleaning logic, on real files with a fake system (no root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.state import (
    RUN_TAG,
    STATE_FILE,
    CleanReport,
    RunState,
    clean,
    proc_starttime,
    prune_runs,
    state_dir,
    unclean_runs,
)
from tests.helpers import REPO
from topologies.errors import ConcurrentRunError


class FakeSystem:
    """Processes, OVS bridges and links as dictionaries; records what was done."""

    def __init__(self) -> None:
        self.procs: dict[int, int] = {}  # pid -> starttime
        self.netns: dict[int, int] = {}  # pid -> inode
        self.devices: dict[int, set[str]] = {}  # pid -> /proc/<pid>/net/dev names
        self.ignores_term: set[int] = set()
        self.bridges: dict[str, dict[str, str]] = {}
        self.link_set: set[str] = set()
        self.groups: dict[str, int] = {}
        self.signals: list[tuple[int, int, bool]] = []
        self.deleted_bridges: list[str] = []
        self.deleted_links: list[str] = []
        self.group_deletes: list[int] = []
        self.deleted_tables: list[str] = []  # what faults added (orchestrator/testbed/faults.py)
        self.deleted_flows: list[tuple[str, int]] = []

    def starttime(self, pid: int) -> int | None:
        return self.procs.get(pid)

    def kill(self, pid: int, sig: int, group: bool = False) -> None:
        self.signals.append((pid, sig, group))
        if pid in self.procs and (sig == signal.SIGKILL or pid not in self.ignores_term):
            del self.procs[pid]

    def pids(self) -> list[int]:
        return list(self.procs)

    def netns_inode(self, pid: int) -> int | None:
        return self.netns.get(pid)

    def net_devices(self, pid: int) -> set[str]:
        return self.devices.get(pid, set())

    def ovs_bridges(self) -> dict[str, dict[str, str]]:
        return {name: dict(ids) for name, ids in self.bridges.items()}

    def delete_ovs_bridges(self, names: list[str]) -> Callable[[], list[str]]:
        for name in names:
            self.bridges.pop(name, None)
            self.deleted_bridges.append(name)
        return list

    def links(self) -> set[str]:
        return set(self.link_set)

    def delete_links(self, names: list[str]) -> list[str]:
        for name in names:
            self.link_set.discard(name)
            self.deleted_links.append(name)
        return []

    def link_group_members(self, group: int) -> set[str]:
        return {n for n, g in self.groups.items() if g == group and n in self.link_set}

    def delete_link_group(self, group: int) -> list[str]:
        self.group_deletes.append(group)
        for name in self.link_group_members(group):
            self.link_set.discard(name)
        return []

    def delete_nft_table(self, table: str) -> list[str]:
        self.deleted_tables.append(table)
        return []

    def delete_flows(self, bridge: str, cookie: int) -> list[str]:
        self.deleted_flows.append((bridge, cookie))
        return []

    def sleep(self, seconds: float) -> None:
        pass


def recorded_run(tmp_path: Path) -> RunState:
    state = RunState.create(tmp_path, command=["astral", "up"], now=1_700_000_000.0)
    state.link_group = 77
    state.add_bridges([("p0r0t0", "ovs"), ("c0", "ovs"), ("p0s0nv", "linux")])
    state.add_interfaces(["p0r0t0-eth1", "p0r0t0-eth3", "c0-eth1", "p0s0nv-eth1"])
    state.add_qdiscs(["p0r0t0-eth1", "c0-eth1"])
    state.add_hosts({"p0s0g0": ["p0s0g0-eth0", "p0s0g0-eth1"]})
    state.hosts["p0s0g0"].pid, state.hosts["p0s0g0"].starttime = 100, 5000
    state.hosts["p0s0g0"].netns = 4026532000
    state.add_process("controller", 200, "controller", group=True, starttime=6000)
    return state


def live_system(state: RunState) -> FakeSystem:
    system = FakeSystem()
    system.procs = {100: 5000, 200: 6000, 300: 7000, 400: 8000, 500: 9000}
    system.netns = {100: 4026532000, 300: 4026532000, 400: 4026531999, 500: 4026532000}
    system.devices = {
        100: {"lo", "p0s0g0-eth0", "p0s0g0-eth1"},
        300: {"lo", "p0s0g0-eth0", "p0s0g0-eth1"},  # a worker inside the GPU's namespace
        500: {"lo", "eth0"},  # same inode number, other interfaces: a recycled inode
    }
    system.bridges = {
        "p0r0t0": {RUN_TAG: state.run_id},
        "c0": {RUN_TAG: state.run_id},
        "other": {},
    }
    ours = ["p0r0t0-eth1", "p0r0t0-eth3", "c0-eth1", "p0s0nv-eth1", "p0s0nv", "p0r0t0", "c0"]
    system.link_set = {*ours, "eth0", "theirs0"}
    system.groups = dict.fromkeys(ours, 77)
    return system


def test_record_is_saved_on_every_change_and_loads_back(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    on_disk = json.loads(state.path.read_text())
    assert on_disk["interfaces"] == ["p0r0t0-eth1", "p0r0t0-eth3", "c0-eth1", "p0s0nv-eth1"]
    assert on_disk["processes"][0]["pid"] == 200
    assert state.run_dir.parent == tmp_path / "runs"
    state.save()
    again = RunState.load(state.run_dir)
    assert again.to_dict() == state.to_dict()
    assert again.hosts["p0s0g0"].intfs == ["p0s0g0-eth0", "p0s0g0-eth1"]
    assert again.link_group == 77


def test_adding_twice_records_once(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    state.add_interfaces(["p0r0t0-eth1", "new-eth1"])
    state.add_bridges([("c0", "ovs")])
    assert state.interfaces.count("p0r0t0-eth1") == 1
    assert state.interfaces[-1] == "new-eth1"
    assert [b["name"] for b in state.bridges].count("c0") == 1


def test_clean_removes_exactly_what_is_recorded(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    report = clean(state, system)
    assert report.errors == []
    # processes: the controller's group, the stray worker in the GPU's namespace, the shell
    assert (200, signal.SIGTERM, True) in system.signals
    assert (300, signal.SIGTERM, False) in system.signals
    assert (100, signal.SIGKILL, False) in system.signals
    signalled = {pid for pid, _, _ in system.signals}
    assert signalled == {100, 200, 300}  # not 400 (other namespace) nor 500 (recycled inode)
    assert sorted(system.deleted_bridges) == ["c0", "p0r0t0"]
    assert "other" in system.bridges
    assert system.group_deletes == [77]
    assert system.link_set == {"eth0", "theirs0"}
    assert sorted(report.bridges) == ["c0", "p0r0t0", "p0s0nv"]
    assert sorted(report.qdiscs) == ["c0-eth1", "p0r0t0-eth1"]
    assert RunState.load(state.run_dir).status == "clean"


def test_clean_is_idempotent(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    clean(state, system)
    system.signals.clear()
    again = clean(state, system)
    assert not again.removed_anything
    assert again.errors == []
    assert system.signals == []
    assert again.lines() == ["nothing to remove"]


def test_recycled_pid_is_never_signalled(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    system.procs[200] = 6001  # the controller's pid now belongs to a newer process
    report = clean(state, system)
    assert all(pid != 200 for pid, _, _ in system.signals)
    assert any("recycled" in s for s in report.skipped)


def test_stubborn_process_gets_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    system.ignores_term.add(200)
    clean(state, system, grace=0.2)
    assert (200, signal.SIGKILL, True) in system.signals


def test_bridge_not_carrying_our_tag_is_left_alone(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    system.bridges["c0"] = {RUN_TAG: "someone-else"}
    report = clean(state, system)
    assert "c0" in system.bridges
    assert any("c0" in s for s in report.skipped)


def test_group_holding_a_stranger_is_not_deleted_wholesale(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)
    system.groups["theirs0"] = 77
    report = clean(state, system)
    assert system.group_deletes == []
    assert "theirs0" in system.link_set
    assert sorted(system.deleted_links) == sorted(
        ["p0r0t0-eth1", "p0r0t0-eth3", "c0-eth1", "p0s0nv-eth1", "p0s0nv"]
    )
    assert any("theirs0" in s for s in report.skipped)


def test_leftover_that_will_not_go_is_an_error_and_keeps_the_record(tmp_path: Path) -> None:
    state = recorded_run(tmp_path)
    system = live_system(state)

    def stuck(names: list[str]) -> list[str]:
        return []

    system.delete_links = stuck  # type: ignore[method-assign]
    system.delete_link_group = lambda group: []  # type: ignore[method-assign]
    report = clean(state, system, settle=0.1)
    assert any("still present" in e for e in report.errors)
    assert RunState.load(state.run_dir).status == "tearing-down"
    assert [s.run_id for s in unclean_runs(tmp_path)] == [state.run_id]


def test_unclean_runs_and_pruning(tmp_path: Path) -> None:
    states = [
        RunState.create(tmp_path, command=["x"], now=1_700_000_000.0 + i * 10) for i in range(4)
    ]
    for state in states[:3]:
        state.set_status("clean")
    (tmp_path / "runs" / "garbage").mkdir()
    (tmp_path / "runs" / "garbage" / STATE_FILE).write_text("{not json")
    assert [s.run_id for s in unclean_runs(tmp_path)] == [states[3].run_id]
    removed = prune_runs(tmp_path, keep=1)
    assert removed == [states[0].run_dir, states[1].run_dir]
    assert states[2].run_dir.exists() and states[3].run_dir.exists()


def test_report_lines_summarise_long_lists() -> None:
    report = CleanReport(interfaces=[f"x{i}-eth1" for i in range(20)])
    (line,) = report.lines()
    assert line.startswith("deleted interfaces: x0-eth1, ")
    assert line.endswith("(20 in all)")


def test_proc_starttime_of_this_process_and_of_nothing(tmp_path: Path) -> None:
    assert isinstance(proc_starttime(os.getpid()), int)
    fake = tmp_path / "proc"
    (fake / "7").mkdir(parents=True)
    fields = ["S", *[str(i) for i in range(4, 22)], "12345", "0"]
    (fake / "7" / "stat").write_text("7 (a (weird) name) " + " ".join(fields))
    assert proc_starttime(7, fake) == 12345
    (fake / "8").mkdir()
    (fake / "8" / "stat").write_text("8 (z) Z " + " ".join(fields[1:]))
    assert proc_starttime(8, fake) is None  # a zombie has exited
    assert proc_starttime(9, fake) is None


def test_state_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTRAL_STATE_DIR", str(tmp_path))
    assert state_dir() == tmp_path
    monkeypatch.delenv("ASTRAL_STATE_DIR")
    assert state_dir() == Path("/run/astral")


def test_second_lock_holder_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from orchestrator.emulation.lock import RunLock;"
            "lock = RunLock(Path(sys.argv[1])); lock.acquire(); print('held', flush=True);"
            "time.sleep(30)",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConcurrentRunError) as refused:
            RunLock(tmp_path).acquire()
        assert f"pid {holder.pid}" in str(refused.value)
        assert refused.value.exit_status == 5
    finally:
        holder.kill()
        holder.wait()
    # the kernel released it with the process: no stale lock
    with RunLock(tmp_path) as lock:
        assert lock.held
    assert not lock.held


def test_a_waiting_lock_gets_it_once_the_holder_lets_go(tmp_path: Path) -> None:
    holder = RunLock(tmp_path)
    holder.acquire()
    said: list[str] = []
    waiter = RunLock(tmp_path)
    with pytest.raises(ConcurrentRunError):
        waiter.acquire(wait=0.6, on_wait=said.append)
    assert len(said) == 1 and "waiting up to 1 s" in said[0]  # told once, not per try
    releaser = threading.Timer(0.3, holder.release)
    releaser.start()
    try:
        waiter.acquire(wait=10)
        assert waiter.held
    finally:
        releaser.join()
        waiter.release()


def test_a_record_cleaned_before_never_takes_another_runs_namespace_for_its_own(
    tmp_path: Path,
) -> None:
    """Its namespaces are gone; another run of the same fabric may have a namespace with
    the same inode number and the same interface names now: a second clean leaves its
    processes alone."""
    state = recorded_run(tmp_path)
    state.set_status("clean")
    system = FakeSystem()
    system.procs = {300: 7000}  # another run's worker, in a namespace that looks like ours
    system.netns = {300: 4026532000}
    system.devices = {300: {"lo", "p0s0g0-eth0", "p0s0g0-eth1"}}
    report = clean(RunState.load(state.run_dir), system)
    assert system.signals == [] and report.killed == []
    assert 300 in system.procs
