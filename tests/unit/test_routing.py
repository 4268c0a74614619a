"""The shortest-path plan on every preset: complete, loop-free, shortest, fails over, stable.

Hop counts are checked against networkx on an independently built graph, not against the
BFS in controllers.routing.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from functools import cache

import networkx as nx
import pytest

from controllers.plan import ForwardingPlan, Output, SetField
from controllers.ports import PortMap
from controllers.routing import (
    FABRIC_LINK_KINDS,
    RoutingError,
    failed_links_at,
    programmable_switches,
    shortest_path_plan,
    tie_break,
)
from controllers.tracer import follow
from tests.helpers import REPO, preset_description
from topologies.addressing import GATEWAY_MAC
from topologies.catalog import preset_names
from topologies.description import FabricDescription
from topologies.model import Link, LinkKind, Tier

PRESETS = preset_names()


@cache
def description(preset: str) -> FabricDescription:
    return preset_description(preset)


def reference_graph(desc: FabricDescription, failed: frozenset[Link] = frozenset()) -> nx.Graph:
    graph = nx.Graph()
    for link in desc.fabric.links:
        if link.kind in FABRIC_LINK_KINDS and link not in failed:
            graph.add_edge(link.a, link.b)
    return graph


def reference_hops(desc: FabricDescription, graph: nx.Graph, switch: str, gpu: str) -> int | None:
    """Shortest switch-to-GPU distance where no other GPU carries traffic."""
    others = [g for g in desc.fabric.gpus if g != gpu]
    sub = graph.subgraph(n for n in graph if n not in others)
    try:
        return int(nx.shortest_path_length(sub, switch, gpu))
    except (nx.NetworkXNoPath, nx.NodeNotFound):
        return None


def check_plan(desc: FabricDescription, plan: ForwardingPlan, failed: frozenset[Link]) -> None:
    """Every switch that can reach a GPU has an entry, and following entries is shortest."""
    graph = reference_graph(desc, failed)
    for switch in programmable_switches(desc.fabric):
        for gpu, addr in desc.addresses.items():
            hops = reference_hops(desc, graph, switch.name, gpu)
            entry = plan.lookup(switch.dpid, addr.fabric_ip)
            if hops is None:
                assert entry is None, f"{switch.name} has an entry for unreachable {gpu}"
                continue
            path = follow(desc, plan, switch.name, addr.fabric_ip)
            assert path[-1] == gpu
            assert len(path) - 1 == hops, f"{switch.name} -> {gpu}: {path}, shortest {hops}"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_programmable_switch_has_a_table(preset: str) -> None:
    desc = description(preset)
    plan = shortest_path_plan(desc)
    expected = {s.dpid for s in desc.fabric.switches.values() if s.tier is not Tier.NVLINK}
    assert set(plan.tables) == expected
    for table in plan.tables.values():
        assert all(e.dpid == table.dpid and e.switch == table.switch for e in table.flows)
        keys = [e.key for e in table.flows]
        assert len(keys) == len(set(keys)), "one entry per match"


@pytest.mark.parametrize("preset", PRESETS)
def test_paths_are_loop_free_and_shortest(preset: str) -> None:
    desc = description(preset)
    check_plan(desc, shortest_path_plan(desc), frozenset())


@pytest.mark.parametrize("preset", PRESETS)
def test_every_gpu_pair_on_a_rail_is_connected_from_every_nic_port(preset: str) -> None:
    desc = description(preset)
    plan = shortest_path_plan(desc)
    for src in desc.addresses.values():
        for dst in desc.addresses.values():
            if src is dst or (desc.fabric.gpu_forwarding and src.rail != dst.rail):
                continue
            for nic in src.nics:
                path = follow(desc, plan, nic.peer, dst.fabric_ip)
                assert path[-1] == dst.gpu
                assert all(node in desc.fabric.switches for node in path[:-1])


def test_rail_only_switches_carry_only_their_own_rail() -> None:
    desc = description("rail-only-small")
    assert desc.fabric.gpu_forwarding
    plan = shortest_path_plan(desc)
    for table in plan.tables.values():
        rail = desc.fabric.switches[table.switch].rail
        assert table.flows, f"{table.switch} has no entries"
        assert {int(e.ipv4_dst.split(".")[1]) for e in table.flows} == {rail}


@pytest.mark.parametrize("preset", PRESETS)
def test_last_hop_rewrites_macs_and_others_only_forward(preset: str) -> None:
    desc = description(preset)
    plan = shortest_path_plan(desc)
    nic_by_end = {
        (nic.peer, nic.peer_port): nic for addr in desc.addresses.values() for nic in addr.nics
    }
    for entry in plan.flows():
        (port,) = entry.out_ports
        nic = nic_by_end.get((entry.switch, port))
        if nic is None:
            assert entry.actions == (Output(port),)
        else:
            assert nic.ip == entry.ipv4_dst, "a GPU port only gets its own GPU's traffic"
            assert entry.actions == (
                SetField("eth_src", GATEWAY_MAC),
                SetField("eth_dst", nic.mac),
                Output(port),
            )


def nic_link(desc: FabricDescription, gpu: str, port: int) -> Link:
    return next(x for x in desc.fabric.nic_links(gpu) if x.port_of(gpu) == port)


@pytest.mark.parametrize("preset", ["astral-small", "hpn-like", "rail-optimized-small"])
def test_nic_link_failure_moves_traffic_to_the_other_tor(preset: str) -> None:
    desc = description(preset)
    gpu = "p1s0g1"
    dst = desc.addresses[gpu]
    dead = nic_link(desc, gpu, 1)
    tor = dead.other(gpu)
    before = shortest_path_plan(desc).lookup(desc.fabric.switches[tor].dpid, dst.fabric_ip)
    assert before is not None and before.out_ports == (dead.port_of(tor),)
    failed = frozenset({dead})
    after = shortest_path_plan(desc, failed)
    check_plan(desc, after, failed)
    alive = nic_link(desc, gpu, 2)
    for switch in programmable_switches(desc.fabric):
        path = follow(desc, after, switch.name, dst.fabric_ip)
        assert path[-2] == alive.other(gpu), f"{switch.name} still ends at {path[-2]}"
    for entry in after.flows():
        assert (entry.switch, entry.out_ports[0]) != (tor, dead.port_of(tor))


def test_single_tor_gpu_whose_link_failed_is_unreachable() -> None:
    desc = description("fat-tree-small")
    (dead,) = desc.fabric.nic_links("p0s0g0")
    failed = frozenset({dead})
    plan = shortest_path_plan(desc, failed)
    ip = desc.addresses["p0s0g0"].fabric_ip
    assert all(e.ipv4_dst != ip for e in plan.flows())
    check_plan(desc, plan, failed)


@pytest.mark.parametrize("preset", ["astral-small", "fat-tree-small"])
def test_uplink_failures_are_routed_around(preset: str) -> None:
    desc = description(preset)
    failed = frozenset(
        [
            desc.fabric.links_of_kind(LinkKind.AGG_CORE)[0],
            desc.fabric.links_of_kind(LinkKind.TOR_AGG)[1],
        ]
    )
    plan = shortest_path_plan(desc, failed)
    check_plan(desc, plan, failed)
    dead_ends = {(x.a, x.a_port) for x in failed} | {(x.b, x.b_port) for x in failed}
    assert not any((e.switch, e.out_ports[0]) in dead_ends for e in plan.flows())


def test_failed_links_at_maps_switch_ports_to_fabric_links() -> None:
    desc = description("astral-small")
    link = nic_link(desc, "p0s0g0", 1)
    tor = link.other("p0s0g0")
    nv = next(x for x in desc.fabric.links_of("p0s0g0") if x.kind is LinkKind.NVLINK)
    down = [(tor, link.port_of(tor)), (nv.b, nv.b_port), ("p0r0t0", 99)]
    assert failed_links_at(desc.fabric, down) == frozenset({link})


@pytest.mark.parametrize("preset", PRESETS)
def test_plan_is_deterministic(preset: str) -> None:
    desc = description(preset)
    failed = frozenset({desc.fabric.links_of_kind(LinkKind.TOR_AGG)[0]})
    assert shortest_path_plan(desc, failed) == shortest_path_plan(desc, failed)


def test_plan_is_the_same_in_another_process() -> None:
    """Python's str hash is salted per process; the tie-break must not depend on it."""
    script = (
        "from controllers.routing import shortest_path_plan\n"
        "from tests.helpers import preset_description\n"
        "d = preset_description('astral-small')\n"
        "print(repr(list(shortest_path_plan(d).flows())))\n"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outputs) == 1
    assert (
        outputs.pop() == repr(list(shortest_path_plan(description("astral-small")).flows())) + "\n"
    )


def test_tie_break_spreads_destinations_over_every_core() -> None:
    """A linear hash (CRC) correlated the tiers' choices and left half the cores idle."""
    desc = description("astral-small")
    plan = shortest_path_plan(desc)
    use: Counter[str] = Counter()
    for src in desc.addresses.values():
        for dst in desc.addresses.values():
            if src.rail != dst.rail or src.pod != dst.pod:
                for nic in src.nics:
                    path = follow(desc, plan, nic.peer, dst.fabric_ip)
                    use.update(n for n in path if n in desc.fabric.switches and n.startswith("c"))
    assert set(use) == {s.name for s in desc.fabric.switches_in(Tier.CORE)}


def test_tie_break_is_in_range_and_rejects_no_choice() -> None:
    assert {tie_break("s", f"10.0.0.{i}", 3) for i in range(50)} == {0, 1, 2}
    with pytest.raises(ValueError):
        tie_break("s", "10.0.0.1", 0)


def test_follow_reports_missing_entries() -> None:
    desc = description("astral-small")
    plan = shortest_path_plan(desc)
    with pytest.raises(RoutingError, match="no entry"):
        follow(desc, plan, "p0r0t0", "10.99.0.1")


def test_port_map_translates_both_ways_and_defaults_to_identity() -> None:
    desc = description("astral-small")
    desc = FabricDescription(desc.fabric, desc.addresses, {"ofports": {"p0r0t0": {"1": 7}}})
    ports = PortMap.of(desc)
    assert ports.ofport("p0r0t0", 1) == 7
    assert ports.model_port("p0r0t0", 7) == 1
    assert ports.ofport("p0r0t0", 2) == 2
    assert ports.ofport("c0", 1) == 1
    assert PortMap.of(description("astral-small")).model_port("c0", 3) == 3
