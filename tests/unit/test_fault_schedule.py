"""Faults as an experiment writes them (orchestrator/testbed/faultspec.py), what the injector
does for each kind and records first (orchestrator/testbed/faults.py), the scheduler's
timing and log, the fault record that ``astral clean`` reads (orchestrator/emulation/state.py),
and the bundle's faults table. No root: commands go to a recording executor."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.emulation.executor import Completed
from orchestrator.emulation.faults import FabricFaults, fault_cookie, loss_table
from orchestrator.emulation.state import (
    FAULT_FILE,
    FaultEntry,
    FaultRecord,
    FaultResource,
    RunState,
    clean,
)
from orchestrator.results.store import (
    DATABASE,
    InjectedFault,
    ResultsBundle,
    ResultsWriter,
    Versions,
)
from orchestrator.run.experiment import parse_experiment
from orchestrator.testbed.faults import FaultInjector, Stragglers
from orchestrator.testbed.faultschedule import FaultLog, FaultScheduler
from orchestrator.testbed.faultspec import (
    APPLY,
    FLAP_DOWN,
    FLAP_UP,
    KINDS,
    UNDO,
    Action,
    FaultSpec,
    next_flap,
    timeline,
)
from tests.helpers import preset_description
from tests.unit.test_state import FakeSystem
from topologies.description import FabricDescription
from topologies.errors import ExperimentError

ISSUE_EXAMPLE = """
faults:
  - kind: link-slow
    target: p0r0a1-c2
    rate: 0.25
    at: 2s
    duration: 30s
  - {kind: link-down, target: p1s0g0-p1r0t1}
  - {kind: link-flap, target: p0r0t0-p0r0a1, period: 2s}
  - {kind: link-loss, target: p0r1t1-p0r1a0, probability: 0.02}
  - {kind: switch-down, target: p1r1t0}
  - {kind: straggler, target: p1s0g1, delay: 40ms}
  - {kind: blackhole, target: p0r0a0, destination: p1s1g0}
  - {kind: controller-crash, at: 5s, duration: 10s}
"""

BASE = {
    "name": "f",
    "fabric": "astral-small",
    "policy": "ecmp",
    "collectives": ["all-reduce"],
    "sizes": {"min": "64K", "max": "64K"},
}


def experiment(faults: object) -> Any:
    return parse_experiment({**BASE, "faults": faults}, "exp.yaml", policies=["ecmp"])


def one(entry: dict[str, Any]) -> FaultSpec:
    (fault,) = experiment([entry]).faults
    return fault


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


# --- the experiment key ---------------------------------------------------------------------


def test_the_issues_example_is_accepted_as_written() -> None:
    faults = experiment(yaml.safe_load(ISSUE_EXAMPLE)["faults"]).faults
    assert [f.kind for f in faults] == list(KINDS)
    assert [f.id for f in faults] == list(range(1, 9))
    slow, down, flap, loss, switch, straggler, blackhole, crash = faults
    assert (slow.rate, slow.at, slow.duration) == (0.25, 2.0, 30.0)
    assert {(x.a, x.b) for x in slow.target.links} == {("p0r0a1", "c2")}
    assert slow.target.ends == ()  # both directions
    assert down.duration is None and down.at == 0.0
    assert flap.period == 2.0 and loss.probability == 0.02
    assert switch.target.switch == "p1r1t0"
    assert straggler.target.gpu == "p1s0g1" and straggler.delay == pytest.approx(0.040)
    assert (blackhole.target.switch, blackhole.destination) == ("p0r0a0", "p1s1g0")
    assert crash.target.text == "" and (crash.at, crash.duration) == (5.0, 10.0)
    assert slow.describe() == "link-slow p0r0a1-c2 at=2s duration=30s rate=0.25"


def test_a_link_is_named_in_either_order_and_a_direction_by_its_sender() -> None:
    forward = one({"kind": "link-down", "target": "p0r0a1-c2"})
    backward = one({"kind": "link-down", "target": "c2-p0r0a1"})
    assert forward.target.links == backward.target.links
    directed = one({"kind": "link-loss", "target": "c2>p0r0a1", "probability": 0.1})
    (link,) = directed.target.links
    assert directed.target.ends == (("c2", link.port_of("c2")),)


# (a fault entry, the key path its error names, words it says); test_schema.py checks that
# the experiment's JSON Schema refuses them too
MISTAKES = [
    ({"kind": "link-down", "target": "p1s0g0-p1r0t9"}, "faults[0].target",
     "nearest: p1s0g0-p1r0t1"),
    ({"kind": "switch-down", "target": "p1r1t9"}, "faults[0].target", "nearest: p1r1t1"),
    ({"kind": "straggler", "target": "p1s0g9", "delay": "1ms"}, "faults[0].target",
     "nearest: p1s0g1, p1s0g0"),
    ({"kind": "blackhole", "target": "c3", "destination": "p1s1g7"},
     "faults[0].destination", "nearest: p1s1g1, p1s1g0"),
    ({"kind": "link-down", "target": "p1s0g0>p1r0t1"}, "faults[0].target",
     "both directions"),
    ({"kind": "link-slow", "target": "p0r0a1-c2", "rate": 1.5}, "faults[0].rate", "at most 1"),
    ({"kind": "link-slow", "target": "p0r0a1-c2"}, "faults[0].rate", "present"),
    ({"kind": "link-down", "target": "p0r0a1-c2", "rate": 0.5}, "faults[0].rate",
     "only the keys link-down takes"),
    ({"kind": "link-down", "target": "p0r0a1-c2", "at": 2}, "faults[0].at", "with its unit"),
    ({"kind": "link-down", "target": "p0r0a1-c2", "at": "2"}, "faults[0].at", "with its unit"),
    ({"kind": "link-down", "target": "p0r0a1-c2", "duration": "0s"}, "faults[0].duration",
     "> 0"),
    ({"kind": "link-flap", "target": "p0r0a1-c2", "period": "100ms"}, "faults[0].period",
     "above 200ms"),
    ({"kind": "controller-crash", "target": "c0"}, "faults[0].target", "no target"),
    ({"kind": "blackhole", "target": "p0s0nv", "destination": "p1s1g0"}, "faults[0].target",
     "OpenFlow switch"),
    ({"kind": "wobble"}, "faults[0].kind", "link-slow, link-down"),
    ({"target": "c0"}, "faults[0].kind", "present"),
    ({"kind": "link-down", "target": "p0r0a1-c2", "when": "1s"}, "faults[0].when",
     "known keys"),
]  # fmt: skip


@pytest.mark.parametrize(("entry", "key", "message"), MISTAKES)
def test_every_mistake_is_an_error_naming_its_key(
    entry: dict[str, Any], key: str, message: str
) -> None:
    with pytest.raises(ExperimentError) as caught:
        experiment([{"kind": "link-down", "target": "p0r0a1-c2"}, entry])
    text = str(caught.value).replace("faults[1]", "faults[0]")
    assert f"'{key}'" in text and message in text, text


def test_a_straggler_must_be_a_rank_and_faults_must_be_a_list() -> None:
    spec = {**BASE, "placement": {"gpus": ["p0s0g0", "p0s0g1"]}}
    with pytest.raises(ExperimentError, match=r"faults\[0\].target.*a GPU the experiment runs on"):
        parse_experiment(
            {**spec, "faults": [{"kind": "straggler", "target": "p1s0g1", "delay": "1ms"}]},
            "exp.yaml",
            policies=["ecmp"],
        )
    with pytest.raises(ExperimentError, match=r"'faults'.*a list of faults"):
        experiment({"kind": "link-down"})
    assert experiment([]).faults == ()


# --- actions in time ------------------------------------------------------------------------


def test_a_fault_is_applied_at_its_time_and_undone_after_its_duration_or_at_the_end() -> None:
    timed = one({"kind": "link-down", "target": "p0r0a1-c2", "at": "2s", "duration": "3s"})
    assert timeline(timed) == [Action(2.0, 1, APPLY), Action(5.0, 1, UNDO)]
    open_ended = one({"kind": "link-down", "target": "p0r0a1-c2", "at": "1s"})
    assert timeline(open_ended) == [Action(1.0, 1, APPLY), Action(None, 1, UNDO)]


def test_a_flap_goes_down_for_half_a_period_then_up_until_its_end() -> None:
    flap = one(
        {"kind": "link-flap", "target": "p0r0a1-c2", "period": "2s", "at": "1s", "duration": "5s"}
    )
    actions = timeline(flap)
    assert actions == [Action(1.0, 1, APPLY), Action(2.0, 1, FLAP_UP, 1), Action(6.0, 1, UNDO)]
    following = [actions[1]]
    while (step := next_flap(flap, following[-1])) is not None:
        following.append(step)
    assert [(a.offset, a.what, a.n) for a in following] == [
        (2.0, FLAP_UP, 1), (3.0, FLAP_DOWN, 2), (4.0, FLAP_UP, 2), (5.0, FLAP_DOWN, 3),
    ]  # fmt: skip
    endless = one({"kind": "link-flap", "target": "p0r0a1-c2", "period": "1s"})
    assert next_flap(endless, Action(1000.0, 1, FLAP_UP, 1000)) == Action(
        1000.5, 1, FLAP_DOWN, 1001
    )


# --- the injector, kind by kind -------------------------------------------------------------


class RecordingExecutor:
    """Runs nothing: records (node, argv, input), and what the fault record held each time."""

    def __init__(self, record: FaultRecord | None = None) -> None:
        self.calls: list[tuple[str | None, tuple[str, ...], str | None]] = []
        self.record = record
        self.resources_seen: list[int] = []

    def run(self, node: str | None, argv: Sequence[str], **options: Any) -> Completed:
        self.calls.append((node, tuple(argv), options.get("input")))
        if self.record is not None:
            self.resources_seen.append(sum(len(e.resources) for e in self.record.entries()))
        return Completed(tuple(argv), 0, "", "")

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise AssertionError("faults start no process through the executor")


class FakeController:
    def __init__(self) -> None:
        self.events: list[str] = []

    def kill(self) -> str:
        self.events.append("kill")
        return "killed"

    def restart(self, record: Callable[[FaultResource], None]) -> str:
        self.events.append("restart")
        record(FaultResource("process", "controller", pid=1, starttime=1))
        return "restarted"


class FakeLauncher:
    def __init__(self) -> None:
        self.late: list[tuple[int, float]] = []

    def set_late(self, rank: int, seconds: float) -> None:
        self.late.append((rank, seconds))


def injector(
    tmp_path: Path, description: FabricDescription, stragglers: Stragglers | None = None
) -> tuple[FaultInjector, RecordingExecutor, FakeController]:
    record = FaultRecord(tmp_path)
    executor = RecordingExecutor(record)
    controller = FakeController()
    return (
        FaultInjector(
            FabricFaults(executor, description),
            description,
            record,
            "run-1",
            controller=controller,
            stragglers=stragglers,
        ),
        executor,
        controller,
    )


def test_each_resource_is_recorded_before_the_commands_that_create_it(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    loss = one({"kind": "link-loss", "target": "p0s0g0-p0r0t0", "probability": 0.1})
    faults.apply(loss)
    (entry,) = FaultRecord(tmp_path).entries()
    table = loss_table("run-1", 1)
    assert [(r.kind, r.name, r.node) for r in entry.resources] == [
        ("nft", table, "p0s0g0"),  # in the GPU's namespace
        ("nft", table, None),  # the ToR's end: the root namespace, astral clean's to delete
    ]
    assert executor.resources_seen == [2, 2]  # both recorded before the first nft ran
    assert entry.applied is not None and entry.params == {"at": "0s", "probability": 0.1}
    faults.undo(loss)
    assert FaultRecord(tmp_path).entries() == []
    assert [c[1] for c in executor.calls[2:]] == [("nft", "delete", "table", "netdev", table)] * 2


def test_slow_link_one_direction_reshapes_the_senders_end_only(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, executor, _ = injector(tmp_path, astral)
    slow = one({"kind": "link-slow", "target": "p0r0a0>p0r0t0", "rate": 0.25})
    faults.apply(slow)
    assert {c[0] for c in executor.calls} == {"p0r0a0"}  # the root namespace of its machine
    assert {c[1][c[1].index("dev") + 1] for c in executor.calls} == {
        f"p0r0a0-eth{slow.target.links[0].port_of('p0r0a0')}"
    }
    rates = {c[1][c[1].index("rate") + 1] for c in executor.calls if "rate" in c[1]}
    assert rates == {f"{int(20e6 * 0.25)}bit"}  # astral-small: 20 Mbit/s emulated
    executor.calls.clear()
    faults.undo(slow)
    assert {c[1][c[1].index("rate") + 1] for c in executor.calls if "rate" in c[1]} == {
        "20000000bit"
    }


def test_blackhole_switch_down_straggler_and_controller_crash(
    tmp_path: Path, astral: FabricDescription
) -> None:
    launcher = FakeLauncher()
    stragglers = Stragglers(["p0s0g0", "p1s0g1"])
    faults, executor, controller = injector(tmp_path, astral, stragglers)
    hole = one({"kind": "blackhole", "target": "c3", "destination": "p1s1g0"})
    faults.apply(hole)
    addresses = faults.addresses("p1s1g0")
    plan = astral.addresses["p1s1g0"]
    assert addresses == list(dict.fromkeys([plan.fabric_ip, *(n.ip for n in plan.nics)]))
    assert [c[1][3:5] for c in executor.calls] == [("add-flows", "c3")]
    assert len((executor.calls[0][2] or "").splitlines()) == len(addresses)
    (entry,) = FaultRecord(tmp_path).entries()
    assert [(r.kind, r.name, r.cookie) for r in entry.resources] == [
        ("openflow", "c3", fault_cookie(1))
    ]
    faults.undo(hole)
    assert executor.calls[-1][1][3] == "del-flows"

    down = one({"kind": "switch-down", "target": "p1r1t0"})
    faults.apply(down)
    assert executor.calls[-1][1][-1] == "down"
    faults.undo(down)
    assert executor.calls[-1][1][-1] == "up"

    late = one({"kind": "straggler", "target": "p1s0g1", "delay": "40ms"})
    faults.apply(late)  # before any launch: kept for the next one
    stragglers.attach(launcher)  # type: ignore[arg-type]
    faults.undo(late)
    assert launcher.late == [(1, 0.04), (1, 0.0)]

    crash = one({"kind": "controller-crash"})
    faults.apply(crash)
    assert [r.kind for e in FaultRecord(tmp_path).entries() for r in e.resources] == []
    faults.undo(crash)
    assert controller.events == ["kill", "restart"]
    assert FaultRecord(tmp_path).entries() == []


def test_a_straggler_without_workers_is_an_error_and_leaves_no_record(
    tmp_path: Path, astral: FabricDescription
) -> None:
    faults, _, _ = injector(tmp_path, astral, stragglers=None)
    with pytest.raises(Exception, match="needs a run's workers"):
        faults.apply(one({"kind": "straggler", "target": "p1s0g1", "delay": "40ms"}))
    assert FaultRecord(tmp_path).entries() == []


# --- the scheduler ----------------------------------------------------------------------------


class TimedInjector:
    """Notes when each action happened (a stand-in for the real one: timing only)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int, float]] = []
        self.prepared: dict[int, float] = {}  # fault id -> when prepare was called
        self.closed = False

    def prepare(self, fault: FaultSpec) -> None:
        self.prepared[fault.id] = time.time()

    def close(self) -> None:
        self.closed = True

    def apply(self, fault: FaultSpec) -> str:
        assert fault.id in self.prepared and not self.closed
        self.events.append(("apply", fault.id, time.time()))
        if fault.kind == "straggler":
            raise ExperimentError("x", "y", "z")  # any AstralError: logged as failed
        return "applied"

    def undo(self, fault: FaultSpec) -> str:
        self.events.append(("undo", fault.id, time.time()))
        return "undone"

    def flap(self, fault: FaultSpec, up: bool) -> str:
        self.events.append(("up" if up else "down", fault.id, time.time()))
        return "flapped"


def test_the_scheduler_counts_from_the_first_timed_batch_and_logs_every_action(
    tmp_path: Path,
) -> None:
    faults = experiment(
        [
            {"kind": "link-down", "target": "p0r0a1-c2", "at": "100ms", "duration": "200ms"},
            {"kind": "link-flap", "target": "p0r0t0-p0r0a1", "period": "300ms", "at": "50ms",
             "duration": "500ms"},
            {"kind": "straggler", "target": "p1s0g1", "delay": "10ms", "at": "0s"},
            {"kind": "switch-down", "target": "p1r1t0", "at": "150ms"},
        ]
    ).faults  # fmt: skip
    fake = TimedInjector()
    log = FaultLog(tmp_path / "faults.jsonl")
    scheduler = FaultScheduler(fake, faults, log).start()  # type: ignore[arg-type]
    scheduler.batch_started(time.time() + 5, warmup=True)  # a warm-up does not count
    time.sleep(0.1)
    assert fake.events == []
    origin = time.time() + 0.05
    scheduler.batch_started(origin, warmup=False)
    scheduler.batch_started(origin + 100, warmup=False)  # only the first timed one counts
    time.sleep(0.8)
    outcomes = scheduler.stop()
    assert fake.closed and all(t < origin for t in fake.prepared.values())  # ahead of time
    happened = {(what, fid): t - origin for what, fid, t in fake.events}
    assert happened[("apply", 1)] == pytest.approx(0.1, abs=0.05)
    assert happened[("undo", 1)] == pytest.approx(0.3, abs=0.05)
    assert [w for w, fid, _ in fake.events if fid == 2] == ["apply", "up", "down", "up", "undo"]
    assert happened[("undo", 2)] == pytest.approx(0.55, abs=0.05)
    assert ("undo", 4) in happened  # open-ended: undone when the run stops
    by_id = {o.fault.id: o for o in outcomes}
    assert by_id[1].scheduled == pytest.approx(origin + 0.1)
    assert by_id[3].applied is None and by_id[3].error is not None
    lines = [json.loads(line) for line in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert set(lines[0]) == {"id", "kind", "target", "event", "t", "scheduled", "detail"}
    assert [(x["id"], x["event"]) for x in lines if x["id"] in (1, 3)] == [
        (3, "failed"), (1, "applied"), (1, "undone"),
    ]  # fmt: skip
    assert [x["event"] for x in lines if x["id"] == 2] == [
        "applied", "undone", "applied", "undone", "undone",
    ]  # fmt: skip
    for line in lines:
        if line["event"] != "failed":
            assert 0 <= line["t"] - line["scheduled"] < 0.1


def test_a_run_that_never_times_a_batch_applies_nothing(tmp_path: Path) -> None:
    faults = experiment([{"kind": "link-down", "target": "p0r0a1-c2"}]).faults
    fake = TimedInjector()
    scheduler = FaultScheduler(fake, faults, FaultLog(tmp_path / "f.jsonl")).start()  # type: ignore[arg-type]
    (outcome,) = scheduler.stop()
    assert fake.events == [] and outcome.scheduled is None and outcome.applied is None


# --- the fault record and astral clean --------------------------------------------------------


def test_astral_clean_removes_what_faults_added_in_the_root_namespace(tmp_path: Path) -> None:
    state = RunState.create(tmp_path, command=["astral", "run"], now=1_700_000_000.0)
    state.add_bridges([("c3", "ovs")])
    record = FaultRecord(state.run_dir)
    record.add(FaultEntry(1, "link-loss", "a-b"))
    record.add_resource(1, FaultResource("nft", "astral_t_f1", None))
    record.add_resource(1, FaultResource("nft", "astral_t_f1", "p0s0g0"))  # its namespace
    record.add(FaultEntry(2, "blackhole", "c3"))
    record.add_resource(2, FaultResource("openflow", "c3", cookie=fault_cookie(2)))
    record.add(FaultEntry(3, "controller-crash", ""))
    record.add_resource(3, FaultResource("process", "controller", pid=4242, starttime=99))
    with pytest.raises(ValueError):
        record.add(FaultEntry(1, "link-down", "a-b"))

    system = FakeSystem()
    system.procs[4242] = 99
    system.bridges["c3"] = {"astral-run": state.run_id}
    report = clean(RunState.load(state.run_dir), system)
    assert system.deleted_tables == ["astral_t_f1"]  # the root namespace's, not the GPU's
    assert system.deleted_flows == [("c3", fault_cookie(2))]
    assert 4242 not in system.procs
    assert "process controller (4242)" in report.faults
    assert FaultRecord(state.run_dir).entries() == []
    assert (state.run_dir / FAULT_FILE).exists()
    assert clean(RunState.load(state.run_dir), system).faults == []  # idempotent


# --- the bundle ------------------------------------------------------------------------------


def test_the_bundle_keeps_every_fault_with_its_instants(
    tmp_path: Path, astral: FabricDescription
) -> None:
    with ResultsWriter(tmp_path / "b", astral) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
        writer.add_faults(
            [
                InjectedFault(1, "link-down", "a-b", {"at": "1s"}, 10.0, 10.02, 12.0),
                InjectedFault(2, "straggler", "g", {"delay": "40ms"}, 10.0, None, None, "oops"),
            ]
        )
    with ResultsBundle.open(tmp_path / "b") as bundle:
        faults = bundle.faults()
    assert faults[0] == InjectedFault(1, "link-down", "a-b", {"at": "1s"}, 10.0, 10.02, 12.0)
    assert faults[1].error == "oops" and faults[1].applied is None


def test_an_older_bundle_reads_as_no_faults(tmp_path: Path, astral: FabricDescription) -> None:
    import sqlite3

    with ResultsWriter(tmp_path / "b", astral) as writer:
        writer.add_run(experiment="x", host="h", versions=Versions("a", "b", "c", "d"))
    with sqlite3.connect(tmp_path / "b" / DATABASE) as db:
        db.execute("DROP TABLE faults")
        db.execute("PRAGMA user_version = 2")
    with ResultsBundle.open(tmp_path / "b") as bundle:
        assert bundle.version == 2 and bundle.faults() == []


def test_hand_ids_stay_apart_and_a_restarted_process_outlives_its_fault(tmp_path: Path) -> None:
    record = FaultRecord(tmp_path)
    assert record.next_id() == 101  # never an experiment's (its positions in faults:)
    record.add(FaultEntry(101, "controller-crash", "", owner="astral fault"))
    record.add_resource(101, FaultResource("process", "controller", pid=7, starttime=8))
    assert record.next_id() == 102
    record.remove(101)  # the crash is over; the controller it restarted runs on
    assert record.entries() == [] and [r.pid for r in record.kept()] == [7]
    with pytest.raises(ValueError, match="no active fault 5"):
        record.add_resource(5, FaultResource("nft", "t"))


# --- astral fault without a fabric ----------------------------------------------------------


def test_astral_fault_without_a_fabric_up_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    assert main(["fault", "--state-dir", str(tmp_path), "list"]) == 4
    assert "no fabric is up: start one with `astral up`" in capsys.readouterr().err
    # a run whose owner is gone is not up, whatever its record says
    state = RunState.create(tmp_path, command=["astral", "up"])
    state.owner_pid, state.owner_starttime = 1, -1
    state.set_status("up")
    assert main(["fault", "--state-dir", str(tmp_path), "clear", "--all"]) == 4
    assert main(["fault", "--state-dir", str(tmp_path), "--run", "x", "list"]) == 4
    assert "no fabric is up with run id x" in capsys.readouterr().err


def test_the_shipped_fault_experiment_loads() -> None:
    from orchestrator.run.experiment import load_experiment
    from tests.helpers import REPO

    spec = load_experiment(REPO / "experiments" / "faults.yaml")
    assert [f.describe() for f in spec.faults] == [
        "link-down p0s0g0-p0r0t0 at=2s duration=4s",
        "straggler p1s0g1 at=8s duration=4s delay=40ms",
    ]
