"""The emulation on this machine: every fabric kind comes up and is reachable, packets take
the paths the model says, a dual-ToR GPU survives a dead port, and nothing is left behind
after a normal end, Ctrl-C, SIGTERM or kill -9 followed by ``astral clean``.

Needs root and Open vSwitch (tests/conftest.py skips or, under CI, fails without them).
Runs share the machine with whatever else holds the astral run lock: a test waits for it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.emulation.faults import link_state_commands
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.sendbuffer import DEFAULT_SEND_BUFFER, raise_send_buffer
from orchestrator.emulation.state import RunState
from orchestrator.emulation.wiring import intf_name
from tests.integration.assertions import (
    assert_path,
    assert_reachable,
    leftovers,
    nic_tx_packets,
    send_udp_flows,
    snapshot,
)
from topologies.catalog import preset_names, preset_path
from topologies.description import FabricDescription
from topologies.errors import EmulationError, FabricSpecError
from topologies.generators import build_fabric
from topologies.model import Tier
from topologies.spec import load_fabric_spec

pytestmark = pytest.mark.integration

PRESETS = [preset_path(name) for name in preset_names()]
MAX_GPUS = 16  # larger presets are for benchmarks/bringup.py
LOCK_WAIT = 300.0
READY_TIMEOUT = 120.0


def start_emulation(fabric: str | Path) -> Emulation:
    """Start, waiting for the run lock if another run (another test, a person) holds it."""
    return Emulation(fabric, ready_timeout=READY_TIMEOUT, lock_wait=LOCK_WAIT).start()


@pytest.fixture(scope="module")
def astral_small() -> Iterator[Emulation]:
    emulation = start_emulation("astral-small")
    try:
        yield emulation
    finally:
        emulation.stop()


def preset_or_skip(path: Path) -> FabricDescription:
    spec = load_fabric_spec(path)
    try:
        fabric = build_fabric(spec)
    except FabricSpecError as err:
        if err.key == "kind":
            pytest.skip(f"no generator for fabric kind {spec.kind!r} yet ({path.name})")
        raise
    if len(fabric.gpus) > MAX_GPUS:
        pytest.skip(f"{path.name} has {len(fabric.gpus)} GPUs (benchmarks/bringup.py covers it)")
    return FabricDescription.of(fabric)


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_fabric_kind_comes_up_reachable_and_leaves_nothing(preset: Path) -> None:
    description = preset_or_skip(preset)
    before = snapshot()
    emulation = start_emulation(preset)
    try:
        assert emulation.timings["reachable_rounds"] >= 1
        assert_reachable(emulation)  # a second, independent pass
        # OpenFlow view: datapath id and port numbers are the model's.
        for switch in description.fabric.switches.values():
            if switch.tier is Tier.NVLINK:
                continue
            out = subprocess.run(
                ["ovs-ofctl", "-O", "OpenFlow13", "show", switch.name],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert f"dpid:{switch.dpid:016x}" in out
            for link in description.fabric.links_of(switch.name):
                port = link.port_of(switch.name)
                assert f" {port}({switch.name}-eth{port}):" in out
        # the description handed to the controller and workers is in the run directory
        written = FabricDescription.read(emulation.run_dir / "fabric.json")
        assert written.extra["datapath"] == emulation.datapath.kind  # type: ignore[union-attr]
        assert written.extra["controller"]["port"] == emulation.controller.port  # type: ignore[union-attr]
    finally:
        report = emulation.stop()
    assert report.errors == []
    assert emulation.state is not None
    assert RunState.load(emulation.run_dir).status == "clean"
    assert leftovers(before, emulation.state, description.fabric.nodes()) == []
    if emulation.send_buffer is not None:  # the raised send buffer was for the run only
        assert raise_send_buffer(size=1).after == emulation.send_buffer.before


def test_gpu_namespace_follows_the_host_contract(astral_small: Emulation) -> None:
    gpu = "p0s0g0"
    sysctl = astral_small.cmd(
        gpu,
        [
            "sysctl", "-n", "net.ipv4.fib_multipath_hash_policy",
            "net.ipv4.conf.all.ignore_routes_with_linkdown", "net.ipv4.conf.all.rp_filter",
            "net.ipv6.conf.all.disable_ipv6",
        ],
    ).split()  # fmt: skip
    assert sysctl == ["1", "1", "0", "1"]
    route = astral_small.cmd(gpu, ["ip", "route", "show", "10.0.0.0/9"])
    assert route.count("nexthop via 10.255.255.254") == 2
    # CUBIC whatever the machine's default, and really used by a connection
    assert "congctl cubic" in route
    assert "congctl cubic" in astral_small.cmd(gpu, ["ip", "route", "show", "10.128.0.0/24"])
    neigh = astral_small.cmd(gpu, ["ip", "neigh", "show", "10.255.255.254"])
    assert neigh.count("PERMANENT") == 2
    shaped = astral_small.cmd(gpu, ["tc", "class", "show", "dev", f"{gpu}-eth1"])
    assert "rate 20Mbit" in shaped
    nvlink = astral_small.cmd(gpu, ["tc", "class", "show", "dev", f"{gpu}-eth0"])
    assert "rate 360Mbit" in nvlink
    # and the switch ends (root namespace): ToR side of the NIC link, both ends of uplinks
    for intf in ("p0r0t0-eth1", "p0r0t0-eth3", "p0r0a0-eth1", "c0-eth1", "p0s0nv-eth1"):
        shown = subprocess.run(
            ["tc", "class", "show", "dev", intf], capture_output=True, text=True, check=True
        ).stdout
        rate = "360Mbit" if intf.startswith("p0s0nv") else "20Mbit"
        assert f"rate {rate}" in shown, f"{intf}: {shown!r}"
        leaf = subprocess.run(
            ["tc", "qdisc", "show", "dev", intf], capture_output=True, text=True, check=True
        ).stdout
        assert "pfifo_head_drop" in leaf, f"{intf}: {leaf!r}"


def test_ovs_vswitchd_send_buffer_is_raised_for_the_run(astral_small: Emulation) -> None:
    # read back from the kernel, not from what the emulation recorded
    assert astral_small.datapath is not None
    if astral_small.datapath.kind != "userspace":
        pytest.skip("only the userspace datapath sends through one packet socket")
    assert astral_small.send_buffer_problem is None
    now = raise_send_buffer(size=1)  # never lowers: reports what is there
    assert now.after >= 2 * DEFAULT_SEND_BUFFER


def test_packets_take_the_paths_of_the_model(astral_small: Emulation) -> None:
    assert astral_small.description is not None
    fabric = astral_small.description.fabric

    def tier(t: Tier, pod: int | None, rail: int | None) -> frozenset[str]:
        return frozenset(
            s.name
            for s in fabric.switches.values()
            if s.tier is t and (pod is None or s.pod == pod) and (rail is None or s.rail == rail)
        )

    # Same rail, same ToR pair: one hop, through the ToR of the port the packet leaves by.
    assert_path(astral_small, "p0s0g0", "p0s1g0", ["p0r0t0"], dev="p0s0g0-eth1")
    assert_path(astral_small, "p0s0g0", "p0s1g0", ["p0r0t1"], dev="p0s0g0-eth2")
    # Another pod, same rail: up through the rail plane to a core and down the other pod's.
    assert_path(
        astral_small,
        "p0s0g0",
        "p1s0g0",
        ["p0r0t1", tier(Tier.AGG, 0, 0), tier(Tier.CORE, None, None), tier(Tier.AGG, 1, 0),
         tier(Tier.TOR, 1, 0)],
        dev="p0s0g0-eth2",
    )  # fmt: skip
    # Same server, another rail: the planes meet only at the core.
    assert_path(
        astral_small,
        "p0s0g0",
        "p0s0g1",
        ["p0r0t0", tier(Tier.AGG, 0, 0), tier(Tier.CORE, None, None), tier(Tier.AGG, 0, 1),
         tier(Tier.TOR, 0, 1)],
        dev="p0s0g0-eth1",
    )  # fmt: skip


def test_dual_tor_gpu_uses_both_ports_and_survives_either_failing(
    astral_small: Emulation,
) -> None:
    src, dst = "p0s0g0", "p1s1g1"
    before = nic_tx_packets(astral_small, src)
    send_udp_flows(astral_small, src, dst, flows=64)
    after = nic_tx_packets(astral_small, src)
    sent = {intf: after[intf] - before[intf] for intf in after}
    assert all(count >= 8 for count in sent.values()), f"flows per port: {sent}"

    address = "10.1.1.2"  # p1s1g1's fabric address
    assert astral_small.description is not None
    link = next(x for x in astral_small.description.fabric.nic_links(src) if x.port_of(src) == 1)

    def set_end(node: str, up: bool) -> None:
        """One end of ``link`` (a fault takes both ends down together)."""
        (command,) = [c for c in link_state_commands(link, up) if c.node == node]
        done = astral_small.run(node, command.argv)
        assert done.ok, done.stderr

    # The switch's end (carrier loss must reach the GPU across the veth), then the GPU's own.
    for end in (link.other(src), src):
        set_end(end, up=False)
        try:
            # the kernel marks the route as the carrier goes, through its linkwatch work,
            # which runs up to a second later (and later still on a busy machine)
            deadline = time.monotonic() + 5.0
            route = astral_small.cmd(src, ["ip", "route", "show", "10.0.0.0/9"])
            while "linkdown" not in route and time.monotonic() < deadline:
                time.sleep(0.1)
                route = astral_small.cmd(src, ["ip", "route", "show", "10.0.0.0/9"])
            assert "linkdown" in route, route
            for _ in range(5):  # different flows, all over the surviving port
                out = astral_small.cmd(src, ["ping", "-c", "1", "-W", "2", address])
                assert " 0% packet loss" in out, f"{intf_name(end, link.port_of(end))} down: {out}"
        finally:
            set_end(end, up=True)
    assert_reachable(astral_small)


def test_a_switch_port_that_lost_its_shaper_is_an_error(astral_small: Emulation) -> None:
    assert astral_small.wiring is not None
    astral_small.check_shapers()  # what start() checked: all in place
    shaper = next(s for s in astral_small.wiring.shapers if s.intf == "p0r0t0-eth3")
    subprocess.run(["tc", "qdisc", "del", "dev", shaper.intf, "root"], check=True)
    try:
        with pytest.raises(EmulationError, match="p0r0t0-eth3"):
            astral_small.check_shapers()
    finally:
        for argv in shaper.commands():
            subprocess.run(argv, check=True)
    astral_small.check_shapers()
