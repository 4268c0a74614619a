"""The controller programs a real (emulated) astral-small fabric: all pairs reach each other,
also after a NIC link failure and after a controller restart.

Builds the network itself with Mininet's Python API (independent of the emulation module),
configuring each GPU host exactly as the controller's contract says
(orchestrator/emulation/hostconfig.py renders the same for ``astral up``): NIC ports carry the
fabric address /32, a permanent neighbour entry for the gateway and one multipath route over
all NIC ports.

Every node name gets the prefix ``q7`` so that bridges and interfaces cannot collide with
another run or experiment on the machine; leftovers of a crashed run of this test (and only
those names) are removed before building.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
from mininet.net import Mininet
from mininet.node import Host, OVSSwitch

from controllers.routing import programmable_switches
from orchestrator.emulation.controller import ControllerProcess
from topologies.addressing import FABRIC_PREFIX, GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.generators import build_fabric
from topologies.model import Tier
from topologies.spec import load_fabric_spec

pytestmark = pytest.mark.integration

PRESET = Path(__file__).resolve().parents[2] / "topologies" / "presets" / "astral-small.yaml"
PROBE = Path(__file__).with_name("icmp_probe.py")
PREFIX = "q7"  # unique to this test's nodes
PROGRAM_TIMEOUT = 90.0


def node(name: str) -> str:
    return PREFIX + name


def intf(name: str, port: int) -> str:
    return f"{node(name)}-eth{port}"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def remove_leftovers(desc: FabricDescription) -> None:
    """Bridges and root-namespace interfaces a crashed run of this test left (our names only)."""
    for switch in desc.fabric.switches:
        run(["ovs-vsctl", "--if-exists", "del-br", node(switch)])
    for link in desc.fabric.links:
        for name, port in ((link.a, link.a_port), (link.b, link.b_port)):
            if Path(f"/sys/class/net/{intf(name, port)}").exists():
                run(["ip", "link", "del", intf(name, port)])


def build_network(desc: FabricDescription) -> Mininet:
    fabric = desc.fabric
    net = Mininet(
        topo=None,
        build=False,
        controller=None,
        switch=partial(OVSSwitch, datapath="user", protocols="OpenFlow13"),
        autoSetMacs=False,
    )
    for switch in sorted(fabric.switches.values(), key=lambda s: s.dpid):
        net.addSwitch(
            node(switch.name),
            dpid=f"{switch.dpid:016x}",
            # NVLink switches learn on their own; fabric switches wait for the controller.
            failMode="standalone" if switch.tier is Tier.NVLINK else "secure",
        )
    for gpu in fabric.gpus_by_rank():
        net.addHost(node(gpu.name), cls=Host, ip=None)
    macs = {
        (addr.gpu, port.port): port.mac
        for addr in desc.addresses.values()
        for port in (addr.nvlink, *addr.nics)
    }
    for link in fabric.links:
        addrs = {
            key: mac
            for key, mac in (
                ("addr1", macs.get((link.a, link.a_port))),
                ("addr2", macs.get((link.b, link.b_port))),
            )
            if mac is not None
        }
        net.addLink(node(link.a), node(link.b), port1=link.a_port, port2=link.b_port, **addrs)
    return net


def configure_hosts(net: Mininet, desc: FabricDescription) -> None:
    """The contract: fabric /32 on every NIC port, static gateway, multipath route."""
    for addr in desc.addresses.values():
        host = net[node(addr.gpu)]
        nics = [intf(addr.gpu, nic.port) for nic in addr.nics]
        nvlink = intf(addr.gpu, addr.nvlink.port)
        commands = [
            [
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv4.fib_multipath_hash_policy=1",
                "net.ipv4.conf.all.ignore_routes_with_linkdown=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                *(f"net.ipv4.conf.{name}.rp_filter=0" for name in [nvlink, *nics]),
            ],
            ["ip", "addr", "replace", f"{addr.nvlink.ip}/24", "dev", nvlink],
        ]
        for name in nics:
            commands += [
                ["ip", "addr", "replace", f"{addr.fabric_ip}/32", "dev", name],
                [
                    *("ip", "neigh", "replace", GATEWAY_IP, "lladdr", GATEWAY_MAC),
                    *("dev", name, "nud", "permanent"),
                ],
            ]
        route = ["ip", "route", "replace", FABRIC_PREFIX, "src", addr.fabric_ip]
        for name in nics:
            route += ["nexthop", "via", GATEWAY_IP, "dev", name, "onlink"]
        commands.append(route)
        for argv in commands:
            out, err, code = host.pexec(*argv)
            assert code == 0, f"{addr.gpu}: {' '.join(argv)}: {out}{err}"


def point_switches_at(desc: FabricDescription, target: str) -> None:
    """Connect the fabric switches (not the NVLink ones) to the controller, 1 s max backoff.

    Open vSwitch 3.1 ignores ``max_backoff`` given when the Controller row is created (the
    connection keeps the default 8 s: "waiting 1, 2, 4 seconds before reconnect" in
    ovs-vswitchd.log); it applies the value when the row changes later. So: two transactions.
    Without it, each controller restart waits longer for the switches (1.3, 2.4, 4.5, 9 s).
    """
    switches = [node(s.name) for s in programmable_switches(desc.fabric)]
    argv = ["ovs-vsctl"]
    for i, switch in enumerate(switches):
        argv += ["--", f"--id=@c{i}", "create", "Controller", f'target="{target}"']
        argv += ["--", "set", "Bridge", switch, f"controller=@c{i}"]
    result = run(argv)
    assert result.returncode == 0, result.stderr
    argv = ["ovs-vsctl"]
    for switch in switches:  # a Controller row is named by its (only) bridge
        argv += ["--", "set", "Controller", switch, "max_backoff=1000"]
    result = run(argv)
    assert result.returncode == 0, result.stderr


def unreachable(
    net: Mininet, desc: FabricDescription, down: frozenset[str] = frozenset()
) -> list[str]:
    """Every (source NIC port, destination) pair without an echo reply; ``down`` ports skipped.

    Each GPU probes every other GPU out of each of its NIC ports in turn (icmp_probe.py), so
    both ToRs of every pair carry traffic to every destination.
    """
    failures = []
    for src in desc.addresses.values():
        host = net[node(src.gpu)]
        targets = [dst.fabric_ip for dst in desc.addresses.values() if dst is not src]
        for nic in src.nics:
            name = intf(src.gpu, nic.port)
            if name in down:
                continue
            argv = [sys.executable, str(PROBE), "--dev", name, "--src", src.fabric_ip, *targets]
            out, err, code = host.pexec(*argv)
            assert code == 0, f"{' '.join(argv)}: {out}{err}"
            failures += [f"{name} -> {ip}" for ip in json.loads(out)]
    return failures


def set_link(net: Mininet, gpu: str, port: int, tor: str, tor_port: int, state: str) -> None:
    out, err, code = net[node(gpu)].pexec("ip", "link", "set", "dev", intf(gpu, port), state)
    assert code == 0, out + err
    result = run(["ip", "link", "set", "dev", intf(tor, tor_port), state])
    assert result.returncode == 0, result.stderr


def wait_failed_links(controller: ControllerProcess, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = controller.status()
        if status is not None and len(status.failed_links) == count and status.programmed():
            return
        time.sleep(0.05)
    raise AssertionError(
        f"controller did not settle on {count} failed link(s): {controller.status()}\n"
        + controller.log_tail()
    )


def route_entry_ages(bridge: str) -> dict[str, float]:
    """Seconds since each route entry (priority 100) of ``bridge`` was installed, by address."""
    out = run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "ip"])
    assert out.returncode == 0, out.stderr
    ages = {}
    for line in out.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.replace(",", " ").split() if "=" in f)
        if fields.get("priority") == "100" and "nw_dst" in fields:
            ages[fields["nw_dst"]] = float(fields["duration"].rstrip("s"))
    return ages


@pytest.fixture
def description(tmp_path: Path) -> FabricDescription:
    return FabricDescription.of(build_fabric(load_fabric_spec(PRESET)))


@pytest.fixture
def network(description: FabricDescription) -> Iterator[Mininet]:
    remove_leftovers(description)
    net = build_network(description)
    try:
        net.start()
        configure_hosts(net, description)
        yield net
    finally:
        net.stop()
        remove_leftovers(description)


def test_controller_routes_all_pairs_and_survives_failure_and_restart(
    description: FabricDescription, network: Mininet, tmp_path: Path
) -> None:
    fabric_json = description.write(tmp_path / "fabric.json")
    with ControllerProcess(fabric_json, tmp_path / "run") as controller:
        started = time.monotonic()
        point_switches_at(description, controller.target)
        status = controller.wait_programmed(timeout=PROGRAM_TIMEOUT)
        connect_to_programmed = time.monotonic() - started
        assert status.missing() == []
        assert {s.dpid for s in status.switches.values()} == set(status.expected_dpids)
        assert all(s.errors == 0 for s in status.switches.values())
        assert unreachable(network, description) == []

        # A NIC link of a dual-ToR GPU fails: its traffic must come in over the other ToR.
        gpu = "p1s0g1"
        dead = next(x for x in description.fabric.nic_links(gpu) if x.port_of(gpu) == 1)
        tor = dead.other(gpu)
        set_link(network, gpu, 1, tor, dead.port_of(tor), "down")
        wait_failed_links(controller, 1)
        status = controller.status()
        assert status is not None
        assert status.failed_links == [(dead.a, dead.a_port, dead.b, dead.b_port)]
        assert unreachable(network, description, down=frozenset({intf(gpu, 1)})) == []

        # Back up. Taking a device down flushed its permanent gateway neighbour entry, so the
        # GPU ARPs for the gateway on that port: the controller answers.
        set_link(network, gpu, 1, tor, dead.port_of(tor), "up")
        wait_failed_links(controller, 0)
        assert unreachable(network, description) == []

        # Without its static neighbour entry a GPU ARPs for the gateway: the controller answers.
        port = intf("p0s0g0", 2)
        host = network[node("p0s0g0")]
        host.pexec("ip", "neigh", "del", GATEWAY_IP, "dev", port)
        assert unreachable(network, description) == []
        neigh, _err, _code = host.pexec("ip", "neigh", "show", GATEWAY_IP, "dev", port)
        assert GATEWAY_MAC in neigh and "PERMANENT" not in neigh, neigh

        # A restarted controller (same port) reads each switch's table and sends only the
        # difference: nothing here, so every route entry survives (the data plane is left
        # alone), while a foreign entry is removed.
        foreign = ["ovs-ofctl", "-O", "OpenFlow13", "add-flow", node("c0")]
        assert run([*foreign, "priority=100,ip,nw_dst=10.9.9.9,actions=drop"]).returncode == 0
        restart_began = time.monotonic()
        controller.restart()
        controller.wait_programmed(timeout=PROGRAM_TIMEOUT)
        restart_to_programmed = time.monotonic() - restart_began
        for switch in programmable_switches(description.fabric):
            ages = route_entry_ages(node(switch.name))
            assert len(ages) == status.switches[switch.dpid].rules
            assert min(ages.values()) > time.monotonic() - restart_began, switch.name
        assert (
            "10.9.9.9"
            not in run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", node("c0")]).stdout
        )
        assert unreachable(network, description) == []

    print(
        f"\nastral-small: {len(status.expected_dpids)} switches programmed "
        f"{connect_to_programmed:.2f} s after set-controller; "
        f"{restart_to_programmed:.2f} s from restart() to programmed again"
    )
