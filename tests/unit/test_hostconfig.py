"""The per-GPU namespace configuration, the wiring plan and batching: pure, no root."""

from __future__ import annotations

import pytest

from orchestrator.emulation.batch import plan_steps, script
from orchestrator.emulation.hostconfig import render_all, render_host_config
from orchestrator.emulation.probe import checksum, echo_request, parse_reply
from orchestrator.emulation.readiness import probe_plan, round_timeout
from orchestrator.emulation.shaping import shaping_commands
from orchestrator.emulation.wiring import check_name, plan_wiring
from tests.helpers import preset_description
from topologies.addressing import FABRIC_PREFIX, GATEWAY_IP, GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.errors import EmulationError
from topologies.generators import build_fabric
from topologies.model import LinkKind, Tier
from topologies.spec import parse_fabric_spec


@pytest.fixture(scope="module")
def astral() -> FabricDescription:
    return preset_description("astral-small")


def test_dual_tor_gpu_gets_its_plan_addresses_on_both_nic_ports(
    astral: FabricDescription,
) -> None:
    config = render_host_config(astral, "p0s1g1")
    plan = astral.addresses["p0s1g1"]
    assert [n.intf for n in plan.nics] == ["p0s1g1-eth1", "p0s1g1-eth2"]
    assert config.interfaces == ("p0s1g1-eth0", "p0s1g1-eth1", "p0s1g1-eth2")
    assert ["ip", "addr", "replace", f"{plan.nvlink.ip}/24", "dev", "p0s1g1-eth0"] in (
        config.addresses
    )
    for nic in plan.nics:
        assert ["ip", "addr", "replace", f"{plan.fabric_ip}/32", "dev", nic.intf] in (
            config.addresses
        )
        assert ["ip", "link", "set", "dev", nic.intf, "address", nic.mac] in config.links
        assert [
            "ip", "neigh", "replace", GATEWAY_IP, "lladdr", GATEWAY_MAC,
            "dev", nic.intf, "nud", "permanent",
        ] in config.neighbours  # fmt: skip


def test_fabric_route_has_one_onlink_nexthop_per_nic_port(astral: FabricDescription) -> None:
    config = render_host_config(astral, "p1s0g0")
    fabric_ip = astral.addresses["p1s0g0"].fabric_ip
    assert config.routes[0] == [
        "ip", "route", "replace", FABRIC_PREFIX, "src", fabric_ip, "congctl", "cubic",
        "nexthop", "via", GATEWAY_IP, "dev", "p1s0g0-eth1", "onlink",
        "nexthop", "via", GATEWAY_IP, "dev", "p1s0g0-eth2", "onlink",
    ]  # fmt: skip


def test_every_route_runs_cubic_whatever_the_machine_default(astral: FabricDescription) -> None:
    # The sysctl would be refused in a child namespace unless the root allows cubic.
    config = render_host_config(astral, "p1s0g0")
    nvlink = astral.addresses["p1s0g0"].nvlink
    assert config.routes[1] == [
        "ip", "route", "replace", "10.129.0.0/24", "dev", "p1s0g0-eth0", "proto", "kernel",
        "scope", "link", "src", nvlink.ip, "congctl", "cubic",
    ]  # fmt: skip
    for route in config.routes:
        assert route[route.index("congctl") + 1] == "cubic"
    assert not any("tcp_congestion_control" in key for key, _ in config.sysctls)


def test_single_nic_gpu_gets_a_plain_route() -> None:
    description = preset_description("fat-tree-small")
    config = render_host_config(description, "p0s0g0")
    assert len(description.addresses["p0s0g0"].nics) == 1
    route, _nvlink = config.routes
    assert "nexthop" not in route
    assert route[-5:] == ["via", GATEWAY_IP, "dev", "p0s0g0-eth1", "onlink"]


def test_sysctls_spread_flows_and_drop_dead_ports(astral: FabricDescription) -> None:
    sysctls = dict(render_host_config(astral, "p0s0g0").sysctls)
    assert sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"
    assert sysctls["net.ipv4.conf.all.ignore_routes_with_linkdown"] == "1"
    assert sysctls["net.ipv6.conf.all.disable_ipv6"] == "1"
    assert sysctls["net.ipv4.conf.all.arp_ignore"] == "1"
    assert sysctls["net.ipv4.conf.all.arp_announce"] == "2"
    assert sysctls["net.ipv4.ip_forward"] == "0"
    for intf in ("all", "default", "lo", "p0s0g0-eth0", "p0s0g0-eth1", "p0s0g0-eth2"):
        assert sysctls[f"net.ipv4.conf.{intf}.rp_filter"] == "0"


def test_rail_only_gpus_forward_and_route_other_rails_over_nvlink() -> None:
    description = preset_description("rail-only-small")
    assert description.fabric.gpu_forwarding
    config = render_host_config(description, "p0s1g0")
    sysctls = dict(config.sysctls)
    assert sysctls["net.ipv4.ip_forward"] == "1"
    assert sysctls["net.ipv4.conf.all.send_redirects"] == "0"
    # what it forwards leaves by the NIC port its source port's range names
    rules = [r for r in config.routes if r[:3] == ["ip", "rule", "add"]]
    tables = [r for r in config.routes if "table" in r and r[1] == "route"]
    assert [r[r.index("sport") + 1] for r in rules] == ["16384-24575", "24576-32767"]
    assert all(r[r.index("iif") + 1] == "p0s1g0-eth0" for r in rules)
    assert [r[r.index("lookup") + 1] for r in rules] == [t[t.index("table") + 1] for t in tables]
    assert [t[t.index("dev") + 1] for t in tables] == ["p0s1g0-eth1", "p0s1g0-eth2"]
    assert sysctls["net.ipv4.fib_multipath_hash_policy"] == "1"  # its own: the hash
    mate = description.addresses["p0s1g1"]  # the server's GPU on rail 1
    own = description.addresses["p0s1g0"]
    assert [
        "ip", "route", "replace", "10.1.0.0/16", "via", mate.nvlink.ip,
        "dev", "p0s1g0-eth0", "src", own.fabric_ip, "congctl", "cubic",
    ] in config.routes  # fmt: skip
    assert not any(r[3] == "10.0.0.0/16" for r in config.routes)  # own rail: fabric route


def test_every_port_is_shaped_to_its_emulated_rate(astral: FabricDescription) -> None:
    config = render_host_config(astral, "p0s0g0")
    scale = astral.fabric.spec.emulation.scale
    nvlink = astral.fabric.spec.speeds.nvlink * scale
    nic = astral.fabric.spec.speeds.nic * scale
    expected = [
        *shaping_commands("p0s0g0-eth0", nvlink, host_side=True),
        *shaping_commands("p0s0g0-eth1", nic, host_side=True),
        *shaping_commands("p0s0g0-eth2", nic, host_side=True),
    ]
    assert list(config.shaping) == expected
    # the switch ends get the switch-side recipe (orchestrator.emulation.wiring)
    shapers = {s.intf: s for s in plan_wiring(astral).shapers}
    assert shapers["p0r0t0-eth1"].commands() == shaping_commands("p0r0t0-eth1", nic)


def test_commands_order_sysctls_first_routes_after_links(astral: FabricDescription) -> None:
    commands = render_host_config(astral, "p0s0g0").commands()
    assert commands[0][:3] == ["sysctl", "-q", "-w"]
    first_route = next(i for i, c in enumerate(commands) if c[:3] == ["ip", "route", "replace"])
    last_up = max(i for i, c in enumerate(commands) if c[-1] == "up")
    assert last_up < first_route
    assert set(render_all(astral)) == set(astral.fabric.gpus)


def test_wiring_maps_switch_tiers_to_bridge_kinds(astral: FabricDescription) -> None:
    wiring = plan_wiring(astral)
    kinds = {b.name: b.kind for b in wiring.bridges}
    for switch in astral.fabric.switches.values():
        assert kinds[switch.name] == ("linux" if switch.tier is Tier.NVLINK else "ovs")
    tor = next(b for b in wiring.bridges if b.name == "p0r0t0")
    assert tor.dpid_hex == f"{astral.fabric.switches['p0r0t0'].dpid:016x}"
    assert len(tor.dpid_hex) == 16


def test_wiring_keeps_switch_ends_in_root_and_numbers_ports_as_the_model(
    astral: FabricDescription,
) -> None:
    wiring = plan_wiring(astral)
    assert len(wiring.veths) == len(astral.fabric.links)
    for veth in wiring.veths:
        assert veth.a_node in astral.fabric.switches
        assert veth.a_intf == f"{veth.a_node}-eth{veth.a_port}"
        if veth.kind in (LinkKind.NIC, LinkKind.NVLINK):
            assert veth.b_host == veth.b_node
            assert veth.b_mac is not None
        else:
            assert veth.b_host is None and veth.b_node in astral.fabric.switches
    ports = wiring.bridge_ports("p0r0t0")
    assert [p for p, _ in ports] == list(range(1, len(ports) + 1))
    root = wiring.root_interfaces()
    assert len(root) == len(set(root))
    assert not any(name.startswith("p0s0g0-") for name in root)
    # every root end is shaped once, to its link's emulated rate
    assert sorted(s.intf for s in wiring.shapers) == sorted(root)


def test_interface_names_are_checked() -> None:
    assert check_name("p0r0t0-eth12") == "p0r0t0-eth12"
    for bad in ("p0r0t0-eth123456", "a;rm -rf", "Upper", "-x", ""):
        with pytest.raises(EmulationError):
            check_name(bad)


def test_batches_group_consecutive_ip_and_tc_commands() -> None:
    steps = plan_steps(
        [
            ["sysctl", "-w", "a=1"],
            ["ip", "link", "set", "dev", "x", "up"],
            ["ip", "addr", "replace", "10.0.0.1/32", "dev", "x"],
            ["tc", "qdisc", "replace", "dev", "x", "root", "handle", "1:", "htb"],
            ["ip", "-n", "other", "link"],
        ]
    )
    assert [s.argv for s in steps] == [
        ["sysctl", "-w", "a=1"],
        ["ip", "-batch", "-"],
        ["tc", "-batch", "-"],
        ["ip", "-n", "other", "link"],
    ]
    assert steps[1].stdin == "link set dev x up\naddr replace 10.0.0.1/32 dev x\n"
    text = script([["ip", "link", "set", "dev", "x", "up"], ["echo", "it's"]])
    assert text.startswith("set -e\n")
    assert "ip -batch - <<'ASTRAL_EOF'\nlink set dev x up\nASTRAL_EOF" in text
    assert "echo 'it'\"'\"'s'" in text


def test_probe_plan_covers_every_pair_through_every_nic(astral: FabricDescription) -> None:
    plan = probe_plan(astral)
    gpus = len(astral.fabric.gpus)
    fabric = [t for t in plan["p0s0g0"] if t.kind == "fabric"]
    assert len(fabric) == (gpus - 1) * 2
    assert {t.dev for t in fabric} == {"p0s0g0-eth1", "p0s0g0-eth2"}
    nvlink = [t for t in plan["p0s0g0"] if t.kind == "nvlink"]
    assert [(t.dst, t.address) for t in nvlink] == [
        ("p0s0g1", astral.addresses["p0s0g1"].nvlink.ip)
    ]


def test_probe_plan_leaves_cross_rail_unbound_on_rail_only() -> None:
    description = preset_description("rail-only-small")
    plan = probe_plan(description)
    cross = [t for t in plan["p0s0g0"] if t.kind == "fabric" and t.dst.endswith("g1")]
    assert cross and all(t.dev is None for t in cross)


def test_inline_spec_renders_without_a_file() -> None:
    spec = parse_fabric_spec(
        {
            "name": "tiny",
            "kind": "astral",
            "pods": 1,
            "servers_per_pod": 1,
            "gpus_per_server": 1,
            "nic_ports": 2,
            "switch": {"radix": 4, "down_ports": 2},
        }
    )
    description = FabricDescription.of(build_fabric(spec))
    config = render_host_config(description, "p0s0g0")
    assert config.routes[0][:4] == ["ip", "route", "replace", FABRIC_PREFIX]


def test_a_probe_round_lasts_long_enough_to_send_every_echo_at_the_rate(
    astral: FabricDescription,
) -> None:
    plan = probe_plan(astral)
    echoes = sum(len(t) for t in plan.values())
    assert echoes == 8 * (7 * 2 + 1)
    assert round_timeout(plan, 3.0, 2000.0) == pytest.approx(3.0 + echoes / 2000.0)


def test_echo_request_checksums_and_replies_parse() -> None:
    request = echo_request(0x1234, 7)
    assert checksum(request) == 0  # a valid checksum makes the sum over the message zero
    ip_header = bytes([0x45]) + bytes(11) + bytes([10, 1, 1, 2]) + bytes([10, 0, 0, 1])
    reply = bytes([0, 0]) + request[2:]
    assert parse_reply(ip_header + reply) == ("10.1.1.2", 0x1234, 7)
    assert parse_reply(ip_header + request) is None  # a request is not a reply
    assert parse_reply(b"short") is None
