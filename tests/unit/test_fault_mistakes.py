"""Faults that meet: two on the same link, port, GPU or controller compose (undoing one
leaves what the others still active imply), ``astral fault`` never gives an id twice on
one fabric, clears each fault once, and refuses a straggler with exit status 2. No root:
commands go to a recording executor, ``astral fault`` to a fabric held in name only."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.commands import fault as fault_command
from orchestrator.emulation.executor import Completed
from orchestrator.emulation.faults import FabricFaults
from orchestrator.emulation.state import FaultRecord, FaultResource
from orchestrator.run.experiment import parse_experiment
from orchestrator.testbed.faults import FaultInjector, Stragglers
from orchestrator.testbed.faultschedule import FAULT_LOG, FaultLog
from orchestrator.testbed.faultspec import FaultSpec
from tests.helpers import preset_description
from topologies.description import FabricDescription

BASE = {
    "name": "f",
    "fabric": "astral-small",
    "policy": "ecmp",
    "collectives": ["all-reduce"],
    "sizes": {"min": "64K", "max": "64K"},
}
RATE = 20e6  # astral-small's links, emulated (bit/s)


def faults_of(*entries: dict[str, Any]) -> tuple[FaultSpec, ...]:
    spec = parse_experiment({**BASE, "faults": list(entries)}, "exp.yaml", policies=["ecmp"])
    return spec.faults


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


class Executor:
    """Runs nothing; keeps (node, argv)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, tuple[str, ...]]] = []

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        self.calls.append((node, tuple(argv)))
        return Completed(tuple(argv), 0, "", "")

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise AssertionError("faults start no process through the executor")

    def rates(self) -> dict[str, str]:
        """Each interface's last HTB class rate."""
        out: dict[str, str] = {}
        for _, argv in self.calls:
            if argv[:2] == ("tc", "class"):
                out[argv[argv.index("dev") + 1]] = argv[argv.index("rate") + 1]
        return out

    def states(self) -> dict[str, str]:
        """Each interface's last ``ip link set`` state."""
        return {argv[4]: argv[5] for _, argv in self.calls if argv[:3] == ("ip", "link", "set")}


class Controller:
    def __init__(self) -> None:
        self.events: list[str] = []

    def kill(self) -> str:
        self.events.append("kill")
        return "killed"

    def restart(self, record: Callable[[FaultResource], None]) -> str:
        self.events.append("restart")
        return "restarted"


def injector(
    tmp_path: Path, description: FabricDescription, stragglers: Stragglers | None = None
) -> tuple[FaultInjector, Executor, Controller]:
    executor, controller = Executor(), Controller()
    faults = FaultInjector(
        FabricFaults(executor, description),
        description,
        FaultRecord(tmp_path),
        "run-1",
        controller=controller,
        stragglers=stragglers,
    )
    return faults, executor, controller


# --- faults that compose ---------------------------------------------------------------------


def test_undoing_a_milder_slow_leaves_the_link_at_the_slower_rate(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    slow, milder = faults_of(
        {"kind": "link-slow", "target": "p0r0t0-p0r0a0", "rate": 0.1},
        {"kind": "link-slow", "target": "p0r0t0-p0r0a0", "rate": 0.5, "duration": "2s"},
    )
    ends = {f"{n}-eth{p}" for n, p in [(x.a, x.a_port) for x in slow.target.links]}
    ends |= {f"{x.b}-eth{x.b_port}" for x in slow.target.links}
    faults.apply(slow)
    assert set(executor.rates().values()) == {f"{int(RATE * 0.1)}bit"}
    faults.apply(milder)  # the link stays at the most restrictive rate
    assert set(executor.rates().values()) == {f"{int(RATE * 0.1)}bit"}
    faults.undo(milder)
    rates = executor.rates()
    assert set(rates) == ends and set(rates.values()) == {f"{int(RATE * 0.1)}bit"}
    faults.undo(slow)
    assert set(executor.rates().values()) == {f"{int(RATE)}bit"}


def test_a_one_way_slow_under_a_both_way_one_keeps_the_other_end_as_it_was(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    both, one_way = faults_of(
        {"kind": "link-slow", "target": "p0r0t0-p0r0a0", "rate": 0.5},
        {"kind": "link-slow", "target": "p0r0t0>p0r0a0", "rate": 0.25},
    )
    (link,) = both.target.links
    tor, agg = f"p0r0t0-eth{link.port_of('p0r0t0')}", f"p0r0a0-eth{link.port_of('p0r0a0')}"
    faults.apply(both)
    faults.apply(one_way)
    assert executor.rates() == {tor: f"{int(RATE * 0.25)}bit", agg: f"{int(RATE * 0.5)}bit"}
    faults.undo(both)
    assert executor.rates() == {tor: f"{int(RATE * 0.25)}bit", agg: f"{int(RATE)}bit"}


def test_a_port_stays_down_while_another_fault_holds_it(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    down, switch, flap = faults_of(
        {"kind": "link-down", "target": "p0s0g0-p0r0t0"},
        {"kind": "switch-down", "target": "p0r0t0"},
        {"kind": "link-flap", "target": "p0s0g0-p0r0t0", "period": "1s"},
    )
    (link,) = down.target.links
    tor_port = f"p0r0t0-eth{link.port_of('p0r0t0')}"
    gpu_port = f"p0s0g0-eth{link.port_of('p0s0g0')}"
    faults.apply(down)
    faults.apply(switch)
    executor.calls.clear()
    detail = faults.undo(switch)
    states = executor.states()
    assert tor_port not in states  # link-down still holds it
    assert states and set(states.values()) == {"up"}
    assert "still down: fault 1" in detail
    faults.apply(flap)
    executor.calls.clear()
    faults.flap(flap, up=True)  # a flap's up leaves it down too
    assert tor_port not in executor.states() and gpu_port not in executor.states()
    faults.undo(flap)
    assert tor_port not in executor.states()
    faults.undo(down)  # the last one: both ends up
    assert executor.states()[tor_port] == executor.states()[gpu_port] == "up"


def test_a_link_down_under_a_switch_down_comes_up_at_the_gpu_end_only(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    down, switch = faults_of(
        {"kind": "link-down", "target": "p0s0g0-p0r0t0"},
        {"kind": "switch-down", "target": "p0r0t0"},
    )
    (link,) = down.target.links
    faults.apply(down)
    faults.apply(switch)
    executor.calls.clear()
    faults.undo(down)
    assert executor.states() == {f"p0s0g0-eth{link.port_of('p0s0g0')}": "up"}


def test_overlapping_stragglers_and_controller_crashes_compose(
    tmp_path: Path, astral: FabricDescription
) -> None:
    stragglers = Stragglers(["p0s0g0", "p1s0g1"])
    faults, _, controller = injector(tmp_path, astral, stragglers)
    late, later, crash, again = faults_of(
        {"kind": "straggler", "target": "p1s0g1", "delay": "40ms"},
        {"kind": "straggler", "target": "p1s0g1", "delay": "10ms"},
        {"kind": "controller-crash"},
        {"kind": "controller-crash"},
    )
    faults.apply(late)
    faults.apply(later)
    assert stragglers.late["p1s0g1"] == pytest.approx(0.04)
    faults.undo(late)
    assert stragglers.late["p1s0g1"] == pytest.approx(0.01)
    faults.undo(later)
    assert stragglers.late["p1s0g1"] == 0.0
    faults.apply(crash)
    faults.apply(again)  # already down: not killed twice
    faults.undo(crash)  # the other crash is active: not restarted yet
    assert controller.events == ["kill"]
    faults.undo(again)
    assert controller.events == ["kill", "restart"]


# --- astral fault: ids, clear, straggler ------------------------------------------------------


def held(tmp_path: Path, description: FabricDescription) -> tuple[Any, Executor]:
    """A HeldFabric over a recording executor (no fabric, no root)."""
    faults, executor, _ = injector(tmp_path, description)
    fabric = fault_command.HeldFabric.__new__(fault_command.HeldFabric)
    fabric.state = SimpleNamespace(run_id="run-1", run_dir=tmp_path)  # type: ignore[assignment]
    fabric.description = description
    fabric.record = faults.record
    fabric.injector = faults
    fabric.log = FaultLog(tmp_path / FAULT_LOG)
    return fabric, executor


@pytest.fixture
def astral_fault(
    tmp_path: Path, astral: FabricDescription, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., int]:
    from orchestrator.cli import main

    fabric, _ = held(tmp_path, astral)
    monkeypatch.setattr(fault_command, "held_fabric", lambda args: fabric)
    return lambda *args: main(["fault", *args])


def logged(tmp_path: Path) -> list[tuple[int, str]]:
    lines = (tmp_path / FAULT_LOG).read_text().splitlines()
    return [(json.loads(x)["id"], json.loads(x)["event"]) for x in lines]


def test_a_cleared_faults_id_is_not_given_again(
    tmp_path: Path, astral_fault: Callable[..., int]
) -> None:
    assert astral_fault("apply", "link-down", "p0s0g0-p0r0t0") == 0  # 101
    assert astral_fault("apply", "link-down", "p0s1g0-p0r0t0") == 0  # 102
    assert astral_fault("clear", "102") == 0
    assert astral_fault("apply", "switch-down", "p0r0t0") == 0  # 103, not 102 again
    assert [i for i, event in logged(tmp_path) if event == "applied"] == [101, 102, 103]


def test_clearing_a_fault_twice_undoes_it_once_and_says_so(
    tmp_path: Path, astral_fault: Callable[..., int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert astral_fault("apply", "link-down", "p0s0g0-p0r0t0") == 0
    capsys.readouterr()
    assert astral_fault("clear", "101", "101") == 0
    assert astral_fault("clear", "101") == 0
    out = capsys.readouterr().out
    assert out.count("fault 101 cleared") == 1
    assert out.count("fault 101 is not active (already cleared)") == 1
    assert logged(tmp_path) == [(101, "applied"), (101, "undone")]
    assert astral_fault("clear", "105") == 2  # never applied here
    assert "key 'clear'" in capsys.readouterr().err


def test_a_straggler_by_hand_is_a_bad_fault_with_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    for args in (["straggler"], ["straggler", "p0s0g0", "--delay", "1ms"]):
        assert main(["fault", "--state-dir", str(tmp_path), "apply", *args]) == 2
        err = capsys.readouterr().err
        assert "key 'kind'" in err and "needs a run's workers" in err
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing created
