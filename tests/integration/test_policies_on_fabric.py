"""The load-balancing policies on a real (emulated) astral-small fabric, checked from the
switches' own counters: every policy delivers all pairs; ecmp uses every next hop and its
polarized twin does not; path-pinned puts a permutation on disjoint links; fast-failover
groups and the controller recover a stream from a link failure (the gaps are printed); a
controller restart does not interrupt a transfer.

One network for the module (node names prefixed ``g3``: tests/integration/prefixed_net.py);
each test starts its own controller process, so each also exercises the hand-over from the
previous test's rules and groups (the new controller reads them and sends the difference).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controllers.pinning import PinnedPaths, assign_paths, directed_links, read_paths
from controllers.policies.ecmp import switch_basis
from controllers.routing import programmable_switches
from orchestrator.emulation.controller import ControllerProcess
from tests.helpers import preset_description
from tests.integration.prefixed_net import PrefixedFabric, wait_for
from topologies.description import FabricDescription
from topologies.model import Link, LinkKind, Tier

pytestmark = pytest.mark.integration

PROBE = Path(__file__).with_name("stream_probe.py")
PREFIX = "g3"
PROGRAM_TIMEOUT = 60.0
TCP_PORT = 29500
UDP_PORT = 5005


@pytest.fixture(scope="module")
def description() -> FabricDescription:
    return preset_description("astral-small")


@pytest.fixture(scope="module")
def fabric(description: FabricDescription) -> Iterator[PrefixedFabric]:
    with PrefixedFabric(description, PREFIX).running() as running:
        yield running


@pytest.fixture(scope="module")
def fabric_json(description: FabricDescription, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return description.write(tmp_path_factory.mktemp("fabric") / "fabric.json")


class Controller:
    """One controller process for a test, pointed at the fabric, programmed."""

    def __init__(self, fabric: PrefixedFabric, fabric_json: Path, run_dir: Path) -> None:
        self.fabric = fabric
        self.fabric_json = fabric_json
        self.run_dir = run_dir
        self.process: ControllerProcess | None = None
        self.port: int | None = None

    def start(self, policy: str) -> ControllerProcess:
        if self.process is not None:
            self.process.stop()
        self.process = ControllerProcess(
            self.fabric_json, self.run_dir, policy=policy, port=self.port
        )
        self.process.start()
        if self.port is None:
            self.port = self.process.port
            self.fabric.point_switches_at(self.process.target)
        status = self.process.wait_programmed(timeout=PROGRAM_TIMEOUT)
        assert {s.openflow for s in status.switches.values()} == {6}, (
            "every switch should speak OpenFlow 1.5 with the controller (select groups need "
            "it); an os-ken app loaded with it may offer only 1.3 (apps' OFP_VERSIONS are "
            "intersected)"
        )
        assert all(s.errors == 0 for s in status.switches.values()), self.process.log_tail()
        return self.process

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


@pytest.fixture(scope="module")
def controller(
    fabric: PrefixedFabric, fabric_json: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    ctl = Controller(fabric, fabric_json, tmp_path_factory.mktemp("controller"))
    try:
        yield ctl
    finally:
        ctl.stop()


def probe(fabric: PrefixedFabric, gpu: str, *args: Any) -> subprocess.Popen[str]:
    argv = [sys.executable, str(PROBE), *map(str, args)]
    return fabric.host(gpu).popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(proc: subprocess.Popen[str], timeout: float = 30.0) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


def ip(description: FabricDescription, gpu: str) -> str:
    return description.addresses[gpu].fabric_ip


# --- every policy --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["shortest", "ecmp", "ecmp-polarized", "path-pinned"])
def test_every_policy_delivers_all_pairs(
    policy: str, controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    controller.start(policy)
    assert fabric.unreachable() == []
    if policy.startswith("ecmp"):
        for switch in programmable_switches(description.fabric):
            groups = fabric.dump_groups(switch.name)
            if "type=select" not in groups:
                continue
            assert "selection_method=hash" in groups, groups
            basis = 0 if policy == "ecmp-polarized" else switch_basis(switch.dpid)
            assert f"selection_method_param={basis}," in groups or (
                basis == 0 and "selection_method_param" not in groups
            ), groups


# --- ecmp ----------------------------------------------------------------------------------


def spray(fabric: PrefixedFabric, description: FabricDescription) -> None:
    """Every GPU of pod 0 sends 3 packets on each of 64 UDP flows to its peer in pod 1."""
    procs = []
    for gpu in description.fabric.gpus_by_rank():
        if gpu.pod != 0:
            continue
        peer = gpu.name.replace("p0", "p1", 1)
        procs.append(
            probe(
                fabric,
                gpu.name,
                "udp-spray",
                *("--src", ip(description, gpu.name), "--dst", ip(description, peer)),
                *("--port", UDP_PORT, "--sports", "20000-20063", "--packets", 3),
            )
        )
    for proc in procs:
        report(proc)
    time.sleep(1.5)  # Open vSwitch credits datapath flows' packets to groups periodically


def uplink_buckets(
    fabric: PrefixedFabric, description: FabricDescription, tier: Tier
) -> dict[str, list[int]]:
    """Packets per bucket of the select group of each pod-0 switch of ``tier`` that carries
    the spray (the uplink group)."""
    used = {}
    for switch in description.fabric.switches_in(tier):
        if switch.pod != 0:
            continue
        kinds = fabric.group_types(switch.name)
        for gid, counts in fabric.group_stats(switch.name).items():
            if kinds.get(gid) == "select" and sum(counts) >= 48:
                used[switch.name] = counts
    return used


def test_ecmp_uses_every_next_hop_and_the_polarized_hash_does_not(
    controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    controller.start("ecmp")
    before = {
        t: uplink_buckets(fabric, description, t) for t in (Tier.TOR, Tier.AGG)
    }  # counters survive a controller restart
    spray(fabric, description)
    for tier in (Tier.TOR, Tier.AGG):
        after = uplink_buckets(fabric, description, tier)
        assert len(after) == 4, f"every pod-0 {tier.value} carries the spray: {after}"
        for switch, counts in after.items():
            old = before[tier].get(switch, [0] * len(counts))
            delta = [n - o for n, o in zip(counts, old, strict=True)]
            assert all(d > 0 for d in delta), f"ecmp: {switch} left a bucket idle: {delta}"

    controller.start("ecmp-polarized")
    before_agg = uplink_buckets(fabric, description, Tier.AGG)
    spray(fabric, description)
    after_agg = uplink_buckets(fabric, description, Tier.AGG)
    idle = 0
    for switch, counts in after_agg.items():
        old = before_agg.get(switch, [0] * len(counts))
        delta = [n - o for n, o in zip(counts, old, strict=True)]
        # The same hash as the ToR below: only the bucket with the agg's own index is used.
        index = description.fabric.switches[switch].index
        assert [i for i, d in enumerate(delta) if d > 0] == [index], (switch, delta)
        idle += sum(1 for d in delta if d == 0)
    assert idle == 4, "half of the pod-0 agg->core links carry nothing"


# --- path-pinned ---------------------------------------------------------------------------


def fabric_link_bytes(
    fabric: PrefixedFabric, description: FabricDescription, before: dict[tuple[str, int], int]
) -> dict[tuple[str, str], int]:
    """Bytes each directed link (switch -> neighbour) sent since ``before``."""
    after = fabric.port_tx_bytes()
    ends = {(x.a, x.a_port): x for x in description.fabric.links}
    ends |= {(x.b, x.b_port): x for x in description.fabric.links}
    sent = {}
    for (switch, port), count in after.items():
        link = ends.get((switch, port))
        if link is None or link.kind is LinkKind.NVLINK:
            continue
        sent[(switch, link.other(switch))] = count - before.get((switch, port), 0)
    return sent


def test_path_pinned_puts_a_permutation_on_disjoint_links(
    controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    process = controller.start("path-pinned")
    wait_for(lambda: (process.run_dir / "paths.json").exists(), 10, "the paths file")
    published = read_paths(process.run_dir / "paths.json")
    assert published["layout"]["bits"] == 3 and len(published["pairs"]) == 56

    gpus = description.fabric.gpus_by_rank()
    flows = [(g.name, gpus[(g.rank + 4) % 8].name) for g in gpus]  # across the core
    assignments = assign_paths(PinnedPaths(description), flows)
    size = 4 << 20
    receivers = {
        dst: probe(
            fabric,
            dst,
            "tcp-recv",
            *("--bind", ip(description, dst), "--port", TCP_PORT),
            *("--duration", 40, "--bytes", size),
        )
        for _, dst in flows
    }
    time.sleep(0.5)
    before = fabric.port_tx_bytes()
    senders = [
        probe(
            fabric,
            a.src,
            "tcp-send",
            *("--src", ip(description, a.src), "--dst", ip(description, a.dst)),
            *("--port", TCP_PORT, "--sport", a.source_port, "--bytes", size),
        )
        for a in assignments
    ]
    for proc in senders:
        assert report(proc, timeout=60)["sent"] == size
    for proc in receivers.values():
        assert report(proc, timeout=60)["bytes"] == size
    time.sleep(0.2)
    sent = fabric_link_bytes(fabric, description, before)

    switches = set(description.fabric.switches)
    carrying = {link: n for link, n in sent.items() if n > size // 2}
    # No fabric link carries two flows (ACKs, the rest of the bytes, are a few percent).
    assert all(n < 1.5 * size for n in sent.values()), sorted(sent.items(), key=lambda x: -x[1])
    # Each flow went where the rules say: from its first aggregation switch on, its path is
    # the same for both NIC ports; before, exactly one of the two ToR uplinks carried it.
    for a in assignments:
        variants = [directed_links(p) for p in a.paths.values()]
        common = set.intersection(*(set(v) for v in variants))
        for link in common:
            if link[0] in switches:
                assert link in carrying, f"{a.src}->{a.dst} port {a.source_port}: {link} idle"
        uplinks = [v[1] for v in variants]
        assert sum(1 for x in uplinks if x in carrying) == 1, (a, uplinks)
    fabric_links = [x for x in carrying if x[0] in switches and x[1] in switches]
    assert len(fabric_links) == 8 * 4, "8 flows x 4 switch-to-switch links, none shared"


# --- failures ------------------------------------------------------------------------------


def busiest_port(
    fabric: PrefixedFabric, ports: list[tuple[str, int]], window: float = 0.5
) -> tuple[str, int]:
    before = fabric.port_tx_bytes()
    time.sleep(window)
    after = fabric.port_tx_bytes()
    return max(ports, key=lambda p: after.get(p, 0) - before.get(p, 0))


def link_at(description: FabricDescription, switch: str, port: int) -> Link:
    return next(
        x
        for x in description.fabric.links
        if (x.a, x.a_port) == (switch, port) or (x.b, x.b_port) == (switch, port)
    )


def stream_gap(
    controller: Controller,
    fabric: PrefixedFabric,
    description: FabricDescription,
    policy: str,
    where: str,
    with_controller: bool,
) -> dict[str, Any]:
    """A 1000 packet/s UDP stream p0s0g0 -> p1s0g0 for 4 s; after 1 s the link it uses at
    ``where`` (``uplink``: its source ToR's uplink; ``last-hop``: the destination's NIC link)
    goes down (both ends). Without ``with_controller`` the controller is stopped first (the
    switches keep their tables: fail-secure), so only the data plane can react. Returns the
    receiver's report, plus when the controller had re-programmed every switch.
    """
    process = controller.start(policy)
    if not with_controller:
        process.stop()
    src, dst = "p0s0g0", "p1s0g0"
    receiver = probe(
        fabric,
        dst,
        "udp-recv",
        *("--bind", ip(description, dst), "--port", UDP_PORT, "--duration", 5),
    )
    time.sleep(0.3)
    sender = probe(
        fabric,
        src,
        "udp-send",
        *("--src", ip(description, src), "--dst", ip(description, dst), "--port", UDP_PORT),
        *("--sport", 20001, "--rate", 1000, "--duration", 4),
    )
    time.sleep(0.7)
    if where == "uplink":
        tors = {n.peer for n in description.addresses[src].nics}
        candidates = [
            (x.a, x.a_port)
            for x in description.fabric.links_of_kind(LinkKind.TOR_AGG)
            if x.a in tors
        ]
    else:
        candidates = [(n.peer, n.peer_port) for n in description.addresses[dst].nics]
    switch, port = busiest_port(fabric, candidates)
    link = link_at(description, switch, port)
    failed_at = time.monotonic()
    fabric.faults.set_link_state(link, up=False)
    rerouted = None
    try:
        if with_controller:
            wait_for(
                lambda: (
                    (s := process.status()) is not None
                    and len(s.failed_links) == 1
                    and s.programmed()
                ),
                10,
                "the controller to re-route",
            )
            rerouted = time.monotonic() - failed_at
        report(sender)
        result = report(receiver)
    finally:
        fabric.faults.set_link_state(link, up=True)
        if link.kind is LinkKind.NIC:
            # Setting a device down flushed its permanent gateway entry: put it back.
            fabric.restore_gateway(dst, link.port_of(dst))
    if with_controller:
        wait_for(
            lambda: (s := process.status()) is not None and not s.failed_links and s.programmed(),
            10,
            "the link to be back",
        )
    result["link"] = f"{link.a}:{link.a_port}-{link.b}:{link.b_port}"
    result["rerouted"] = rerouted
    return result


@pytest.mark.parametrize("where", ["uplink", "last-hop"])
def test_failover_fast_failover_without_controller_and_controller_driven(
    where: str, controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    """(a) fast-failover groups, the controller stopped: the data plane alone recovers;
    (b) no fast-failover, the controller running: it re-routes on the port status."""
    data_plane = stream_gap(
        controller, fabric, description, "shortest:fast_failover=on", where, False
    )
    by_controller = stream_gap(controller, fabric, description, "shortest", where, True)
    print(
        f"\n{where} failure ({data_plane['link']}), 1000 packet/s UDP stream: "
        f"(a) data plane, no controller: longest gap {data_plane['max_gap'] * 1e3:.0f} ms, "
        f"{data_plane['lost']} packets lost; (b) controller-driven: longest gap "
        f"{by_controller['max_gap'] * 1e3:.0f} ms, {by_controller['lost']} lost "
        f"(every switch re-programmed {by_controller['rerouted'] * 1e3:.0f} ms after the "
        "failure)"
    )
    for result in (data_plane, by_controller):
        # Sent for 4 s, the failure after about 1.2 s: the stream went on after it.
        assert result["packets"] > 3000, result
        assert result["max_gap"] < 1.0, result


def test_a_controller_restart_does_not_interrupt_a_transfer(
    controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    process = controller.start("ecmp")
    src, dst = "p0s1g1", "p1s1g0"
    receiver = probe(
        fabric,
        dst,
        "tcp-recv",
        "--bind",
        ip(description, dst),
        "--port",
        TCP_PORT,
        "--duration",
        7,
    )
    time.sleep(0.3)
    rate = 2 << 20
    sender = probe(
        fabric,
        src,
        "tcp-send",
        "--src",
        ip(description, src),
        "--dst",
        ip(description, dst),
        "--port",
        TCP_PORT,
        "--sport",
        20002,
        "--rate",
        rate,
        "--duration",
        6,
    )
    time.sleep(2.0)
    restarted_at = time.monotonic()
    process.restart()
    process.wait_programmed(timeout=PROGRAM_TIMEOUT)
    reprogrammed = time.monotonic() - restarted_at
    sent = report(sender)["sent"]
    got = report(receiver)
    print(
        f"\ncontroller restart during a {rate >> 20} MiB/s TCP transfer: longest gap "
        f"{got['max_gap'] * 1e3:.0f} ms, re-programmed {reprogrammed:.2f} s after restart()"
    )
    assert got["bytes"] == sent
    assert got["max_gap"] < 0.25, got
    log = process.log_path.read_text()
    resync = log[log.rfind("starting:") :]
    assert " 0 stale entries and 0 groups removed" in resync
    assert "stale entries and" in resync and "groups removed" in resync


def test_a_tcp_transfer_survives_a_link_failure_on_its_path_under_ecmp(
    controller: Controller, fabric: PrefixedFabric, description: FabricDescription
) -> None:
    """Select-group buckets watch their ports: the flows of a dead uplink move to the others
    in the data plane, then the controller re-renders; TCP carries on."""
    process = controller.start("ecmp")
    src, dst = "p0s1g1", "p1s1g1"
    receiver = probe(
        fabric,
        dst,
        "tcp-recv",
        *("--bind", ip(description, dst), "--port", TCP_PORT, "--duration", 7),
    )
    time.sleep(0.3)
    rate = 2 << 20
    sender = probe(
        fabric,
        src,
        "tcp-send",
        *("--src", ip(description, src), "--dst", ip(description, dst), "--port", TCP_PORT),
        *("--sport", 20003, "--rate", rate, "--duration", 5),
    )
    time.sleep(1.0)
    tors = {n.peer for n in description.addresses[src].nics}
    uplinks = [
        (x.a, x.a_port) for x in description.fabric.links_of_kind(LinkKind.TOR_AGG) if x.a in tors
    ]
    link = link_at(description, *busiest_port(fabric, uplinks))
    fabric.faults.set_link_state(link, up=False)
    try:
        sent = report(sender)["sent"]
        got = report(receiver)
    finally:
        fabric.faults.set_link_state(link, up=True)
    wait_for(
        lambda: (s := process.status()) is not None and not s.failed_links and s.programmed(),
        10,
        "the link to be back",
    )
    print(
        f"\necmp, {link.a}:{link.a_port}-{link.b}:{link.b_port} down under a "
        f"{rate >> 20} MiB/s TCP transfer: longest gap {got['max_gap'] * 1e3:.0f} ms"
    )
    assert got["bytes"] == sent >= 4 * rate
    assert got["max_gap"] < 1.0, got
