"""Every fault kind on a real astral-small fabric, checked by its effect in measured data
(iperf3 goodput and retransmissions, tc and nftables counters, OpenFlow entries, interface
states, the workers' iteration times), and cleared without leftovers, also after a kill -9
of ``astral up`` followed by ``astral clean`` (tests/integration/test_fault_command.py).

Flows are steered onto a chosen NIC port by their client port (``ip route get`` in the
sending GPU: its multipath hash, tests/integration/assertions.connection_devices), so which
links a flow crosses is known, not hoped for. Short windows (a few seconds of traffic) keep
the module at about a minute or two; one fabric for the module (``astral_fabric``).

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.faults import loss_table
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.pathtrace import TRACED, open_control, trace_paths
from orchestrator.emulation.state import proc_starttime
from orchestrator.run.experiment import _ExperimentReader, parse_experiment
from orchestrator.testbed.faults import FaultInjector, injector_on, spec_of
from orchestrator.testbed.faultschedule import FaultLog, FaultScheduler
from orchestrator.testbed.faultspec import FaultSpec, parse_fault
from orchestrator.testbed.tracing import flow_requests
from orchestrator.testbed.traffic import BASE_PORT, Flow, TrafficResult, run_flows
from tests.helpers import nft_dropped
from tests.integration.assertions import connection_devices
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.fivetuple import FiveTuple

pytestmark = pytest.mark.integration

GPU = "p0s0g0"  # rail 0 of server 0 of pod 0: NIC port 1 to ToR p0r0t0, port 2 to p0r0t1
ELSEWHERE = ["p1s0g0", "p1s1g0", "p0s1g0"]  # rail 0 elsewhere: over the fabric, not NVLink


@pytest.fixture(scope="module")
def fabric(astral_fabric: Any) -> Any:
    return astral_fabric("astral-small", policy="ecmp")


@pytest.fixture
def faults(fabric: Any) -> Iterator[FaultInjector]:
    injector, _ = injector_on(fabric.testbed, [g for g in fabric.gpus])
    yield injector
    for entry in injector.record.entries():  # a failed test's fault must not leak onward
        injector.undo(spec_of(entry, fabric.testbed.description.fabric, _ExperimentReader("test")))
    injector.close()


def spec(fabric: Any, raw: dict[str, Any], fault_id: int = 1) -> FaultSpec:
    description: FabricDescription = fabric.testbed.description
    return parse_fault(_ExperimentReader("test"), raw, description.fabric, "fault", fault_id)


def emulation(fabric: Any) -> Emulation:
    return fabric.testbed.emulation


#: (src, client port, dst, server port) of every flow the module has run: a flow measured
#: again within a minute must not reuse one, whose connection is still in TIME_WAIT on the
#: client (its connect would fail, and the flow receive nothing: a flaky test once)
_USED: set[tuple[str, int, str, int]] = set()


def via(
    fabric: Any, src: str, dst: str, port: int, index: int, apart_from: tuple[Flow, ...] = ()
) -> Flow:
    """Flow number ``index`` (its server port BASE_PORT + index) from ``src`` to ``dst``
    with a client port that the sender's kernel sends out of its NIC port ``port``, never
    one an earlier flow of this module used towards the same server port; with
    ``apart_from``, one whose path (as the switches forward it now) shares no link
    direction with theirs, so that what it carries is its own path's rate, not a share
    that the ECMP hash happened to give it beside one of them."""
    description: FabricDescription = fabric.testbed.description
    plan, peer = description.addresses[src], description.addresses[dst]
    device = next(n.intf for n in plan.nics if n.port == port)
    candidates = list(range(41000 + 100 * index, 41100 + 100 * index))
    tuples = [FiveTuple(plan.fabric_ip, c, peer.fabric_ip, BASE_PORT + index) for c in candidates]
    devices = connection_devices(emulation(fabric), src, tuples)
    taken = {hop for flow in apart_from for hop in directions(fabric, flow)}
    for cport, found in zip(candidates, devices, strict=True):
        key = (src, cport, dst, BASE_PORT + index)
        flow = Flow(src, dst, cport)
        if found != device or key in _USED:
            continue
        if taken and taken & directions(fabric, flow):
            continue
        _USED.add(key)
        return flow
    apart = " on a path apart from the others'" if taken else ""
    raise AssertionError(f"no client port of {src} routes via {device} to {dst}{apart}")


def directions(fabric: Any, flow: Flow) -> set[tuple[str, str]]:
    """The link directions (node, next node) of the path of ``flow`` (one ``via`` made: its
    client port tells its server port) as the switches forward it (``ofproto/trace``)."""
    description: FabricDescription = fabric.testbed.description
    assert flow.cport is not None
    index = (flow.cport - 41000) // 100
    five = FiveTuple(
        description.addresses[flow.src].fabric_ip,
        flow.cport,
        description.addresses[flow.dst].fabric_ip,
        BASE_PORT + index,
    )
    (request,) = flow_requests(emulation(fabric), description, [(five, flow.src, flow.dst)])
    with closing(open_control(emulation(fabric))) as control:
        (path,) = trace_paths(description, [request], control)
    assert path.outcome == TRACED, f"{flow}: its path is not traced ({path.outcome})"
    return set(pairwise(path.nodes))


def goodputs(result: TrafficResult) -> list[float]:
    return [f.goodput_bps for f in result.flows]


def link_rate(fabric: Any, a: str, b: str) -> float:
    description: FabricDescription = fabric.testbed.description
    (link,) = [x for x in description.fabric.links_of(a) if x.other(a) == b]
    return description.emulated_rate(link)


def nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def flows_across(
    fabric: Any, flows: list[Flow], apply: Any, undo: Any, *, omit: float, duration: float
) -> TrafficResult:
    """``run_flows`` with a fault applied 1 s after the flows started (they are connected:
    within ``omit``) and undone just after the measured window ends (before the clients
    end, so that a stalled one can say goodbye)."""
    timers = [threading.Timer(1.0, apply), threading.Timer(omit + duration + 0.3, undo)]
    for timer in timers:
        timer.start()
    try:
        return run_flows(emulation(fabric), flows, duration=duration, omit=omit)
    finally:
        for timer in timers:
            timer.join()


# --- link-slow -------------------------------------------------------------------------------


def test_a_slow_link_carries_rate_times_its_capacity(fabric: Any, faults: FaultInjector) -> None:
    flow = via(fabric, GPU, "p1s0g0", 1, 0)  # out of NIC port 1: link p0s0g0-p0r0t0
    capacity = link_rate(fabric, GPU, "p0r0t0")
    before = run_flows(emulation(fabric), [flow], duration=2.5, omit=1.0)
    slow = spec(fabric, {"kind": "link-slow", "target": "p0s0g0-p0r0t0", "rate": 0.25})
    faults.apply(slow)
    try:
        during = run_flows(emulation(fabric), [flow], duration=2.5, omit=1.0)
    finally:
        faults.undo(slow)
    after = run_flows(emulation(fabric), [flow], duration=2.5, omit=1.0)
    nic = next(x for x in during.links if x.intf == f"{GPU}-eth1")
    mbits = [round(r.flows[0].goodput_bps / 1e6, 2) for r in (before, during, after)]
    print(f"goodput before, during, after: {mbits} Mbit/s; NIC port sent "
          f"{nic.sent_bps / capacity:.3f} of {capacity / 1e6:g} Mbit/s")  # fmt: skip
    assert 0.18 < nic.sent_bps / capacity < 0.27  # tc's own count at the sending NIC
    assert 0.18 < during.flows[0].goodput_bps / capacity < 0.26
    assert before.flows[0].goodput_bps > 0.7 * capacity
    assert after.flows[0].goodput_bps > 0.7 * capacity  # restored


# --- link-down and switch-down: dual-ToR failover ----------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "link-down", "target": "p0s0g0-p0r0t0"},
        {"kind": "switch-down", "target": "p0r0t0"},
    ],
    ids=["link-down", "switch-down"],
)
def test_a_downed_nic_port_halves_the_gpus_bandwidth_through_the_other_tor(
    fabric: Any, faults: FaultInjector, fault: dict[str, Any]
) -> None:
    # to the same rail's GPU of the next server: one ToR hop per port, nothing shared
    flows = [via(fabric, GPU, "p0s1g0", 1, 0), via(fabric, GPU, "p0s1g0", 2, 1)]
    both = run_flows(emulation(fabric), flows, duration=2.5, omit=1.0)
    down = spec(fabric, fault)
    faults.apply(down)
    try:
        time.sleep(1.0)  # the controller replans around the port (port status)
        one = run_flows(emulation(fabric), flows, duration=2.5, omit=1.0)
        state = subprocess.run(["ip", "-o", "link", "show", "p0r0t0-eth1"], capture_output=True,
                               text=True).stdout  # fmt: skip
    finally:
        faults.undo(down)
    ratio = one.aggregate_bps / both.aggregate_bps
    print(f"{fault['kind']}: aggregate {both.aggregate_bps / 1e6:.2f} -> "
          f"{one.aggregate_bps / 1e6:.2f} Mbit/s (x {ratio:.2f}); per flow "
          f"{[round(g / 1e6, 2) for g in goodputs(one)]}")  # fmt: skip
    assert "state DOWN" in state or "NO-CARRIER" in state
    assert 0.35 < ratio < 0.65
    assert min(goodputs(one)) > 0.2 * max(goodputs(one))  # both still deliver: failover
    again = _once_back(fabric, flows)
    assert again.aggregate_bps > 0.8 * both.aggregate_bps  # both ports back


def _once_back(fabric: Any, flows: list[Flow], within: float = 15.0) -> TrafficResult:
    """The flows measured again once the undone port carries them: the controller replans
    when the port comes back, in about a second here, but a full CI run once had a flow
    through it that did not connect 1 s after the undo (3 runs of the test alone all
    did). A flow that never connects within ``within`` s fails the test as before."""
    deadline = time.monotonic() + within
    while True:
        time.sleep(1.0)
        try:
            return run_flows(emulation(fabric), flows, duration=2.0, omit=1.0)
        except EmulationError:
            if time.monotonic() > deadline:
                raise


# --- link-flap ---------------------------------------------------------------------------------


def test_a_flapping_link_goes_down_and_up_every_period_on_schedule(
    fabric: Any, faults: FaultInjector, tmp_path: Path
) -> None:
    flap = spec(fabric, {"kind": "link-flap", "target": "p0s0g0-p0r0t0", "period": "1s",
                         "duration": "2.2s"})  # fmt: skip
    log = FaultLog(tmp_path / "faults.jsonl")
    scheduler = FaultScheduler(faults, [flap], log).start()
    origin = time.time() + 0.2
    scheduler.batch_started(origin, warmup=False)
    states: list[tuple[float, bool]] = []
    while time.time() < origin + 2.6:
        text = Path("/sys/class/net/p0r0t0-eth1/operstate").read_text().strip()
        states.append((time.time() - origin, text == "up"))
        time.sleep(0.02)
    (outcome,) = scheduler.stop()
    changes = [(t, up) for (t, up), (_, was) in zip(states[1:], states, strict=False) if up != was]
    print("operstate changes (s after the origin):", [(round(t, 2), up) for t, up in changes])
    assert [up for _, up in changes] == [False, True, False, True, False, True]
    for (t, _), due in zip(changes, [0.0, 0.5, 1.0, 1.5, 2.0, 2.2], strict=True):
        assert due - 0.02 <= t < due + 0.15
    events = [json.loads(line) for line in log.path.read_text().splitlines()]
    assert [e["event"] for e in events] == ["applied", "undone", "applied", "undone", "applied",
                                            "undone"]  # fmt: skip
    assert all(0 <= e["t"] - e["scheduled"] < 0.1 for e in events)
    assert outcome.applied is not None and outcome.undone is not None and outcome.error is None


# --- link-loss ----------------------------------------------------------------------------------


def test_loss_shows_as_retransmissions_at_the_senders_whose_connections_cross_it(
    fabric: Any, faults: FaultInjector
) -> None:
    # both uplinks of ToR p0r0t0, as OVS sends out of them (the switch's egress hook)
    lossy = via(fabric, GPU, "p1s0g0", 1, 0)  # up through p0r0t0 to pod 1
    clean = via(fabric, "p1s0g1", "p1s1g1", 1, 1)  # pod 1 only: never near p0r0t0
    specs = [
        spec(fabric, {"kind": "link-loss", "target": f"p0r0t0>{agg}", "probability": 0.03}, i)
        for i, agg in enumerate(("p0r0a0", "p0r0a1"), start=1)
    ]
    without = run_flows(emulation(fabric), [lossy, clean], duration=3.0, omit=1.0)
    for fault in specs:
        faults.apply(fault)
    try:
        result = run_flows(emulation(fabric), [lossy, clean], duration=3.0, omit=1.0)
        tables = [loss_table(faults.run_id, f.id) for f in specs]
        dropped = [nft_dropped(t) for t in tables]
    finally:
        for fault in specs:
            faults.undo(fault)
    before = [f.retransmits for f in without.flows]
    retrans = [f.retransmits for f in result.flows]
    print(f"retransmits crossing / not crossing: {before} without the fault, {retrans} with it; "
          f"dropped by nft: {dropped}; goodput {[round(g / 1e6, 2) for g in goodputs(result)]} "
          "Mbit/s")  # fmt: skip
    assert sum(dropped) > 20  # the egress hook drops what OVS's userspace datapath sends
    added = [after - base for after, base in zip(retrans, before, strict=True)]
    assert added[0] >= 0.5 * sum(dropped)  # each drop of data is a retransmission
    # the other flow's come from its shapers' own queues (TCP fills a switch buffer), more or
    # fewer as the machine's load varies, but the fault adds nothing like the crossing one's
    assert added[0] >= 3 * max(1, added[1])
    assert not any(t in nft_tables() for t in tables)  # undone: the tables are gone


# --- blackhole ---------------------------------------------------------------------------------


def test_a_blackhole_stalls_exactly_the_flows_through_that_switch_to_that_gpu(
    fabric: Any, faults: FaultInjector
) -> None:
    target = "p1s0g0"
    to_target = via(fabric, GPU, target, 2, 1)  # enters p0r0t1, to the target: flows
    also = via(fabric, "p0s1g0", target, 2, 3)  # via p0r0t1 too: flows
    flows = [
        via(fabric, GPU, target, 1, 0),  # enters ToR p0r0t0, to the target: stalls
        to_target,
        # through p0r0t0, elsewhere: flows, at its path's rate (a CI run once had the hash
        # put it beside flow 3 on one link: 5.5 of 20 Mbit/s, the other 13.8)
        via(fabric, GPU, "p1s1g0", 1, 2, apart_from=(to_target, also)),
        also,
    ]
    hole = spec(fabric, {"kind": "blackhole", "target": "p0r0t0", "destination": target})
    seen: list[str] = []

    def undo() -> None:
        seen.append(dump_fault_entries("p0r0t0", 1))
        faults.undo(hole)

    result = flows_across(fabric, flows, lambda: faults.apply(hole), undo, omit=1.5, duration=2.5)
    (entries,) = seen
    rates = goodputs(result)
    print(f"goodput during the blackhole: {[round(g / 1e6, 3) for g in rates]} Mbit/s")
    print(entries)
    # stalled; the others go on. Flows 1 and 3 share the target's rail-1 port, and TCP may
    # split it very unevenly (17.3 / 1.8 Mbit/s was seen in CI), so each of them is judged
    # as moving bytes (a stalled flow moves none) and the two together as filling the port
    rate = link_rate(fabric, GPU, "p0r0t0")
    assert rates[0] < 0.05 * min(rates[1:])
    assert min(rates[1:]) > 0.02 * rate
    assert rates[2] > 0.3 * rate and rates[1] + rates[3] > 0.5 * rate
    assert "actions=drop" in entries and "n_packets=0," not in entries
    assert "actions=drop" not in dump_fault_entries("p0r0t0", 1)


def dump_fault_entries(switch: str, fault_id: int) -> str:
    cookie = f"cookie={0xA5A5_FA17_0000_0000 | fault_id:#x}/-1"
    argv = ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", switch, cookie]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def test_a_blackhole_survives_a_controller_restart(fabric: Any, faults: FaultInjector) -> None:
    hole = spec(fabric, {"kind": "blackhole", "target": "c0", "destination": "p1s1g1"}, 5)
    faults.apply(hole)
    try:
        fabric.testbed.emulation.controller.restart()  # as a policy change does
        fabric.testbed.emulation.controller.wait_programmed(timeout=60)
        out = dump_fault_entries("c0", 5)
    finally:
        faults.undo(hole)
    assert out.count("actions=drop") >= 1


# --- controller-crash ---------------------------------------------------------------------------


def test_flows_keep_forwarding_while_the_controller_is_down_and_it_comes_back(
    fabric: Any, faults: FaultInjector
) -> None:
    controller = fabric.testbed.emulation.controller
    flows = [via(fabric, GPU, "p1s0g0", 1, 0), via(fabric, "p0s1g0", "p1s1g0", 2, 1)]
    before = run_flows(emulation(fabric), flows, duration=2.0, omit=1.0)
    crash = spec(fabric, {"kind": "controller-crash"})
    old = controller.pid
    faults.apply(crash)
    try:
        assert not controller.running() and proc_starttime(old) is None
        during = run_flows(emulation(fabric), flows, duration=2.0, omit=1.0)
    finally:
        faults.undo(crash)
    print(f"aggregate with / without the controller: {before.aggregate_bps / 1e6:.2f} / "
          f"{during.aggregate_bps / 1e6:.2f} Mbit/s")  # fmt: skip
    assert during.aggregate_bps > 0.85 * before.aggregate_bps
    assert controller.running() and controller.pid != old
    status = controller.wait_programmed(timeout=60)  # every switch reconnected
    assert all(s.connected for s in status.switches.values())


# --- straggler --------------------------------------------------------------------------------


STRAGGLER = {
    "name": "it-straggler",
    "fabric": "astral-small",
    "policy": "ecmp",
    "collectives": ["all-reduce"],
    "sizes": {"min": "64K", "max": "64K"},
    "iterations": 6,
    "warmup": 1,
    "latency": "off",
    "load_limit": {"force": True},
}


def test_a_straggler_makes_every_operation_later_by_its_delay(fabric: Any, tmp_path: Path) -> None:
    from orchestrator.results.store import ResultsBundle
    from orchestrator.run.runner import RunOptions

    times = {}
    for name, faults_key in (("on-time", []), ("late", [
        {"kind": "straggler", "target": "p1s0g1", "delay": "300ms"}
    ])):  # fmt: skip
        experiment = parse_experiment({**STRAGGLER, "faults": faults_key}, "it.yaml",
                                      policies=["ecmp"])  # fmt: skip
        outcome = fabric.run_experiment(experiment, RunOptions(out=tmp_path / name, plots=False))
        assert outcome.status == "ok", outcome.error
        (result,) = outcome.results
        times[name] = result.row.time_us / 1e6
        with ResultsBundle.open(tmp_path / name) as bundle:
            injected = bundle.faults()
    print(f"operation time on time {times['on-time']:.3f} s, with a 300 ms straggler "
          f"{times['late']:.3f} s")  # fmt: skip
    # the first timed operation may start before the message reaches the worker
    assert 0.18 < times["late"] - times["on-time"] < 0.45
    (row,) = injected
    assert row.kind == "straggler" and row.applied is not None and row.undone is not None
    # applied at its time, not before; how soon after is the machine's (the scheduler's
    # thread wakes as the batch starts, the busiest moment of a run): measured 127 ms and
    # 226 ms late in two full suites on a 2-core machine, against a few ms when quiet.
    # Its effect on every operation is the assertion above.
    assert row.scheduled is not None and 0 <= row.applied - row.scheduled < 0.5
