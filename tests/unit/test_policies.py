"""The policy registry and the built-in policies' plans: groups, salts, failover, pinning."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from controllers.multipath import DETOUR_PRIORITY
from controllers.pinning import (
    PinnedPaths,
    assign_paths,
    directed_links,
    paths_document,
    port_layout,
)
from controllers.plan import FlowEntry, ForwardingPlan, Group, GroupEntry, GroupType, Output, Packet
from controllers.policies import PolicyRegistry, default_registry
from controllers.policies.ecmp import switch_basis
from controllers.policies.ecmp_polarized import POLARIZED_BASIS
from controllers.policies.options import split_policy
from controllers.policies.path_pinned import PIN_PRIORITY
from controllers.policies.shortest import ShortestPathPolicy
from controllers.routing import RoutingGraph, programmable_switches, shortest_path_plan
from controllers.tracer import follow, trace_all
from tests.helpers import parallel_links_description, preset_description
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.model import Link, LinkKind, Tier

POLICIES = ["shortest", "ecmp", "ecmp-polarized", "path-pinned", "adaptive"]
WORKER_PORT = 29500


@cache
def description(preset: str = "astral-small") -> FabricDescription:
    return preset_description(preset)


@cache
def plan(
    policy: str, preset: str = "astral-small", failed: frozenset[Link] = frozenset()
) -> ForwardingPlan:
    return default_registry().create(policy).render(description(preset), failed)


# --- registry and options --------------------------------------------------------------------


def test_unknown_policy_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(
        ConfigError,
        match="expected one of adaptive, ecmp, ecmp-polarized, path-pinned, shortest, "
        "found 'hedera'",
    ):
        default_registry().create("hedera")


def test_registries_are_independent_and_refuse_duplicates() -> None:
    mine = default_registry()
    mine.register("other", ShortestPathPolicy)
    assert mine.names() == sorted([*POLICIES, "other"])
    assert default_registry().names() == sorted(POLICIES)
    with pytest.raises(ValueError, match="already registered"):
        mine.register("shortest", ShortestPathPolicy)
    assert PolicyRegistry().names() == []


def test_create_returns_a_fresh_instance() -> None:
    registry = default_registry()
    assert registry.create("shortest") is not registry.create("shortest")


def test_policy_options() -> None:
    assert split_policy("ecmp:fast_failover=off") == ("ecmp", {"fast_failover": "off"})
    assert split_policy(" ecmp : fast-failover = on ,") == ("ecmp", {"fast_failover": "on"})
    registry = default_registry()
    assert registry.create("ecmp:fast_failover=off").fast_failover is False  # type: ignore[attr-defined]
    assert registry.create("shortest:fast_failover=yes").fast_failover is True  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="options the policy ecmp takes"):
        registry.create("ecmp:salt=3")
    with pytest.raises(ConfigError, match="must be on or off"):
        registry.create("ecmp:fast_failover=maybe")
    with pytest.raises(ConfigError, match="key=value"):
        registry.create("ecmp:fast_failover")


def test_shortest_policy_renders_the_shortest_path_plan() -> None:
    desc = description()
    policy = default_registry().create("shortest")
    rendered = policy.render(desc, frozenset())
    assert rendered.policy == policy.name == "shortest"
    assert rendered == shortest_path_plan(desc)


# --- what a policy asks of the hosts --------------------------------------------------------


def test_policies_declare_their_host_side_work_on_the_class() -> None:
    registry = default_registry()
    pinning = {name for name in registry.names() if registry.get(name).pins_source_ports}
    assert pinning == {"path-pinned"}
    for name in registry.names():  # the instance says what its class says
        assert registry.create(name).pins_source_ports is registry.get(name).pins_source_ports
    with pytest.raises(ConfigError, match=r"expected one of adaptive, .*found 'hedera'"):
        registry.get("hedera", source="testbed")


def test_the_testbed_pins_source_ports_when_its_policy_declares_it(tmp_path: Path) -> None:
    from orchestrator.testbed.testbed import Testbed  # not started: no root needed

    assert Testbed("astral-small", policy="path-pinned", state_base=tmp_path).pins_source_ports
    bed = Testbed("astral-small", policy="ecmp", state_base=tmp_path)
    assert not bed.pins_source_ports
    with pytest.raises(ConfigError, match=r"testbed.*found 'hedera'"):
        bed.use_policy("hedera")
    with pytest.raises(ConfigError, match="found 'ecmp:fast_failover=off'"):
        Testbed("astral-small", policy="ecmp:fast_failover=off", state_base=tmp_path)


# --- every policy: complete, loop-free, shortest ------------------------------------------------


def cross_pairs(desc: FabricDescription) -> list[tuple[str, str]]:
    gpus = [g.name for g in desc.fabric.gpus_by_rank()]
    return [(s, d) for s in gpus for d in gpus if s != d]


@pytest.mark.parametrize("policy", [*POLICIES, "shortest:fast_failover=on"])
def test_every_policy_reaches_every_gpu_on_shortest_paths_only(policy: str) -> None:
    desc = description()
    rendered = plan(policy)
    assert set(rendered.tables) == {s.dpid for s in programmable_switches(desc.fabric)}
    for table in rendered.tables.values():
        keys = [e.key for e in table.flows]
        assert len(keys) == len(set(keys)), f"{table.switch}: one entry per match"
        ids = {g.group_id for g in table.groups}
        assert len(ids) == len(table.groups)
        used = {gid for e in table.flows for gid in e.group_ids}
        assert used <= ids, f"{table.switch} points at missing groups"
        assert ids <= used, f"{table.switch} has unused groups"
    for src, dst in cross_pairs(desc):
        src_ip, dst_ip = desc.addresses[src].fabric_ip, desc.addresses[dst].fabric_ip
        for nic in desc.addresses[src].nics:
            # Select groups branch over every bucket: one port covers them.
            for sport in (16384, 16385, 16386, 16387) if "pinned" in policy else (16384,):
                packet = Packet.tcp(src_ip, dst_ip, sport, WORKER_PORT)
                for path in trace_all(desc, rendered, nic.peer, packet):
                    assert path[-1] == dst
                    hops = len(path) - 1
                    assert hops == len(follow(desc, shortest_path_plan(desc), nic.peer, dst_ip)) - 1


# --- ecmp ----------------------------------------------------------------------------------------


def select_groups(rendered: ForwardingPlan) -> list[GroupEntry]:
    return [g for g in rendered.groups() if g.type is GroupType.SELECT]


@pytest.mark.parametrize("policy", ["ecmp", "ecmp-polarized"])
def test_ecmp_has_a_select_group_wherever_there_are_equal_cost_hops(policy: str) -> None:
    desc = description()
    rendered = plan(policy)
    graph = RoutingGraph(desc.fabric)
    for gpu, addr in desc.addresses.items():
        dist = graph.distances_to(gpu)
        for switch in programmable_switches(desc.fabric):
            entry = rendered.lookup(switch.dpid, addr.fabric_ip)
            assert entry is not None
            paths = trace_all(desc, rendered, switch.name, addr.fabric_ip)
            next_hops = {p[1] for p in paths}
            equal_cost = {h.neighbor for h in graph.next_hops(switch.name, gpu, dist)}
            assert next_hops == equal_cost, "every equal-cost next hop is used"
            if len(next_hops) > 1:
                (gid,) = entry.group_ids
                group = rendered.tables[switch.dpid].group(gid)
                assert group.type is GroupType.SELECT
                assert group.selection is not None and group.selection.method == "hash"
                assert {"ipv4_src", "ipv4_dst", "ip_proto", "tcp_src", "tcp_dst"} <= set(
                    group.selection.fields
                )
                assert len(group.buckets) == len(next_hops)
                for bucket in group.buckets:
                    assert bucket.watch_port == bucket.out_ports[0]


def test_ecmp_salts_differ_per_switch_and_polarized_ones_do_not() -> None:
    salted = {(g.switch, g.selection.basis) for g in select_groups(plan("ecmp")) if g.selection}
    per_switch = dict(salted)
    assert len(per_switch) == len(salted), "one basis per switch"
    assert len(set(per_switch.values())) == len(per_switch), "every switch its own basis"
    dpids = {s.name: s.dpid for s in programmable_switches(description().fabric)}
    assert all(basis == switch_basis(dpids[sw]) for sw, basis in per_switch.items())
    polarized = {g.selection.basis for g in select_groups(plan("ecmp-polarized")) if g.selection}
    assert polarized == {POLARIZED_BASIS}
    assert len(select_groups(plan("ecmp"))) == len(select_groups(plan("ecmp-polarized")))


def test_destinations_with_the_same_hops_share_one_group() -> None:
    rendered = plan("ecmp", "astral-64")
    tor = rendered.tables[description("astral-64").fabric.switches["p0r0t0"].dpid]
    uplinks = [g for g in tor.groups if g.type is GroupType.SELECT]
    assert len(uplinks) == 1, "every remote destination of a ToR goes through one group"


def test_ecmp_without_fast_failover_watches_nothing() -> None:
    rendered = plan("ecmp:fast_failover=off")
    assert all(g.type is GroupType.SELECT for g in rendered.groups())
    assert all(b.watch_port is None for g in rendered.groups() for b in g.buckets)
    assert not any(e.priority == DETOUR_PRIORITY for e in rendered.flows())


# --- fast failover ---------------------------------------------------------------------------


FAILOVER_POLICIES = ["shortest:fast_failover=on", "ecmp", "path-pinned"]


@pytest.mark.parametrize("policy", FAILOVER_POLICIES)
def test_fast_failover_buckets_watch_the_port_they_output_to(policy: str) -> None:
    rendered = plan(policy)
    groups = [g for g in rendered.groups() if g.type is GroupType.FAST_FAILOVER]
    assert groups
    for group in groups:
        assert len(group.buckets) > 1
        for bucket in group.buckets:
            (port,) = bucket.out_ports
            assert bucket.watch_port == port
        ports = [b.watch_port for b in group.buckets]
        assert len(set(ports)) == len(ports)


def nic_link(desc: FabricDescription, gpu: str, port: int) -> Link:
    return next(x for x in desc.fabric.nic_links(gpu) if x.port_of(gpu) == port)


@pytest.mark.parametrize("policy", FAILOVER_POLICIES)
def test_a_dead_last_hop_detours_through_the_other_tor_in_the_data_plane(policy: str) -> None:
    """The plan is the one rendered before the failure: only groups react (watch ports).
    Every NIC link of every GPU, from every source: whichever aggregation switch a packet
    comes down from, the ToR must not send it back up that port (the tracer refuses an
    output to the input port, as a switch drops it)."""
    desc = description()
    rendered = plan(policy)
    for gpu in desc.addresses:
        for port in (1, 2):
            dead = nic_link(desc, gpu, port)
            tor = dead.other(gpu)
            other_tor = nic_link(desc, gpu, 3 - port).other(gpu)
            down = [(tor, dead.port_of(tor)), (gpu, port)]
            dst_ip = desc.addresses[gpu].fabric_ip
            for src in desc.addresses:
                if src == gpu:
                    continue
                src_ip = desc.addresses[src].fabric_ip
                for nic in desc.addresses[src].nics:
                    for sport in range(16384, 16392) if "pinned" in policy else (16385,):
                        packet = Packet.tcp(src_ip, dst_ip, sport, WORKER_PORT)
                        for path in trace_all(desc, rendered, nic.peer, packet, down=down):
                            assert path[-2:] == [other_tor, gpu], path
    # The ToR itself: a fast-failover group, delivery first, then the uplinks; for packets
    # that came down an uplink, delivery first, then the other uplink only.
    gpu = "p1s0g1"
    dead = nic_link(desc, gpu, 1)
    tor = desc.fabric.switches[dead.other(gpu)]
    dst_ip = desc.addresses[gpu].fabric_ip
    entry = rendered.lookup(tor.dpid, dst_ip)
    assert entry is not None
    group = rendered.tables[tor.dpid].group(entry.group_ids[0])
    assert group.type is GroupType.FAST_FAILOVER
    assert group.buckets[0].watch_port == dead.port_of(tor.name)
    assert len(group.buckets) == 3
    uplinks = {b.watch_port for b in group.buckets[1:]}
    returns = [
        e for e in rendered.tables[tor.dpid].flows if e.ipv4_dst == dst_ip and e.in_port is not None
    ]
    assert {e.in_port for e in returns} == uplinks
    for e in returns:
        assert e.priority == DETOUR_PRIORITY
        group = rendered.tables[tor.dpid].group(e.group_ids[0])
        assert group.type is GroupType.FAST_FAILOVER
        assert [b.watch_port for b in group.buckets] == [
            dead.port_of(tor.name),
            *(uplinks - {e.in_port}),
        ]


@pytest.mark.parametrize("policy", FAILOVER_POLICIES)
def test_a_dead_uplink_is_avoided_in_the_data_plane(policy: str) -> None:
    desc = description()
    rendered = plan(policy)
    uplink = next(x for x in desc.fabric.links_of_kind(LinkKind.TOR_AGG) if x.a == "p0r0t0")
    down = [(uplink.a, uplink.a_port), (uplink.b, uplink.b_port)]
    for src, dst in cross_pairs(desc):
        src_ip, dst_ip = desc.addresses[src].fabric_ip, desc.addresses[dst].fabric_ip
        for nic in desc.addresses[src].nics:
            for sport in range(16384, 16392) if "pinned" in policy else (16384,):
                packet = Packet.tcp(src_ip, dst_ip, sport, WORKER_PORT)
                for path in trace_all(desc, rendered, nic.peer, packet, down=down):
                    assert path[-1] == dst
                    assert (uplink.a, uplink.b) not in directed_links(path)


def test_without_fast_failover_a_plan_has_no_groups_to_fail_over() -> None:
    assert not list(plan("shortest").groups())
    assert not list(plan("path-pinned:fast_failover=off").groups())


# --- path pinning ----------------------------------------------------------------------------


def permutation(desc: FabricDescription, shift_rail: bool) -> list[tuple[str, str]]:
    """Every GPU sends to the GPU half the ranks away (the other pod; the next rail too)."""
    gpus = desc.fabric.gpus_by_rank()
    n = len(gpus)
    rails = desc.fabric.spec.rails
    flows = []
    for gpu in gpus:
        peer = (gpu.rank + n // 2) % n
        if shift_rail:
            base = peer - peer % rails
            peer = base + (peer % rails + 1) % rails
        flows.append((gpu.name, gpus[peer].name))
    return flows


@pytest.mark.parametrize("preset", ["astral-small", "astral-64"])
@pytest.mark.parametrize("shift_rail", [False, True])
def test_a_permutation_across_the_core_gets_link_disjoint_paths(
    preset: str, shift_rail: bool
) -> None:
    desc = description(preset)
    flows = permutation(desc, shift_rail)
    pinned = PinnedPaths(desc)
    assignments = assign_paths(pinned, flows)
    load: Counter[tuple[str, str]] = Counter()
    for a in assignments:
        load.update(a.links())
    assert max(load.values()) == 1, [x for x, n in load.items() if n > 1]
    # Every path crosses the core.
    cores = {s.name for s in desc.fabric.switches_in(Tier.CORE)}
    assert all(cores & set(p) for a in assignments for p in a.paths.values())
    # The rules realize them: follow the plan with the chosen source port, from each NIC.
    rendered = plan("path-pinned", preset)
    for a in assignments:
        src, dst = desc.addresses[a.src], desc.addresses[a.dst]
        for nic in src.nics:
            packet = Packet.tcp(src.fabric_ip, dst.fabric_ip, a.source_port, WORKER_PORT)
            assert [a.src, *follow(desc, rendered, nic.peer, packet)] == list(a.paths[nic.port])


def test_pinned_rules_match_source_port_bits_per_distance() -> None:
    desc = description()
    layout = port_layout(desc)
    assert [(f.distance, f.width) for f in layout.fields] == [(2, 1), (4, 1), (5, 1)]
    rendered = plan("path-pinned")
    pinned = [e for e in rendered.flows() if e.priority == PIN_PRIORITY]
    assert pinned
    for entry in pinned:
        assert entry.ip_proto == 6 and entry.tcp_src_mask is not None
        assert bin(entry.tcp_src_mask).count("1") == 1
    # Rules grow with destinations and hops, not flows: per switch at most 2 per destination
    # plus the default and the detour guards.
    for table in rendered.tables.values():
        assert len(table.flows) <= 8 * 2 + 8 + 4


def test_repeated_flows_get_distinct_ports_with_the_same_bits() -> None:
    desc = description()
    pinned = PinnedPaths(desc)
    a, b = assign_paths(pinned, [("p0s0g0", "p1s0g0"), ("p0s0g0", "p1s0g0")])
    assert a.source_port != b.source_port
    assert assign_paths(pinned, [("p0s0g0", "p1s0g0")], taken=[a.source_port])[0].source_port != (
        a.source_port
    )


def test_pinned_paths_follow_the_rerendered_plan_after_a_failure() -> None:
    desc = description()
    dead = next(x for x in desc.fabric.links_of_kind(LinkKind.AGG_CORE))
    failed = frozenset({dead})
    rendered = plan("path-pinned", "astral-small", failed)
    pinned = PinnedPaths(desc, failed)
    for src, dst in cross_pairs(desc):
        s, d = desc.addresses[src], desc.addresses[dst]
        for nic in s.nics:
            for sport in range(16384, 16392):
                expected = pinned.path(src, dst, nic.port, sport)
                packet = Packet.tcp(s.fabric_ip, d.fabric_ip, sport, WORKER_PORT)
                assert [src, *follow(desc, rendered, nic.peer, packet)] == expected
                assert (dead.a, dead.b) not in directed_links(expected)
                assert (dead.b, dead.a) not in directed_links(expected)


def test_paths_document() -> None:
    desc = description()
    doc = paths_document(PinnedPaths(desc))
    doc = json.loads(json.dumps(doc))
    assert doc["version"] == 1 and doc["layout"]["bits"] == 3
    assert len(doc["pairs"]) == 8 * 7
    rendered = plan("path-pinned")
    names = doc["switches"]
    base = doc["layout"]["base"]
    for pair in doc["pairs"]:
        values = {p["value"] for p in pair["paths"]}
        for path in pair["paths"]:
            nic = next(n for n in desc.addresses[pair["src"]].nics if n.port == path["nic"])
            packet = Packet.tcp(pair["src_ip"], pair["dst_ip"], base + path["value"], 1)
            hops = follow(desc, rendered, nic.peer, packet)[:-1]
            assert hops == [names[i] for i in path["hops"]]
        assert len(values) == len({tuple(p["hops"][1:]) for p in pair["paths"]}) or values


def test_paths_document_of_a_rail_only_fabric_has_no_path_between_rails() -> None:
    """Rail-only: a ToR of one rail cannot reach another rail's GPUs over the fabric (that
    traffic crosses NVLink first); the document says so with an empty list of paths
    instead of failing (it once raised KeyError, and the controller published nothing)."""
    desc = description("rail-only-small")
    doc = paths_document(PinnedPaths(desc))
    rails = {g.name: g.local_rank for g in desc.fabric.gpus.values()}
    assert len(doc["pairs"]) == 8 * 7
    for pair in doc["pairs"]:
        same_rail = rails[pair["src"]] == rails[pair["dst"]]
        assert bool(pair["paths"]) == same_rail, pair


def test_group_ids_survive_an_unrelated_failure() -> None:
    desc = description()
    before = {(g.switch, g.group_id): g for g in plan("ecmp").groups()}
    dead = desc.fabric.links_of_kind(LinkKind.AGG_CORE)[0]
    after = {
        (g.switch, g.group_id): g for g in plan("ecmp", "astral-small", frozenset({dead})).groups()
    }
    unchanged = [k for k in before if k in after and before[k] == after[k]]
    assert len(unchanged) >= len(before) - 8


def test_entries_carry_only_what_they_match() -> None:
    for policy in POLICIES:
        for entry in plan(policy).flows():
            assert isinstance(entry, FlowEntry)
            for action in entry.actions:
                assert isinstance(action, Output | Group) or action.field in ("eth_src", "eth_dst")


# --- parallel links --------------------------------------------------------------------------


@cache
def twins_description() -> FabricDescription:
    return parallel_links_description()


def test_pinned_flows_spread_over_parallel_links_and_the_rules_take_them() -> None:
    """Two values that differ only in which of a leaf's parallel uplinks they take are two
    paths: the assignment spreads a permutation over all of them (it once put every
    connection on the first, a quarter of the uplink), and the rules forward each flow out
    of the port its assignment counted."""
    desc = twins_description()
    fabric = desc.fabric
    (spine,) = [s.name for s in fabric.switches_in(Tier.AGG)]
    uplinks = [x for x in fabric.links if spine in (x.a, x.b)]
    assert len({frozenset((x.a, x.b)) for x in uplinks}) < len(uplinks)  # twins
    by_rail: dict[int, list[str]] = {}
    for gpu in fabric.gpus_by_rank():
        by_rail.setdefault(gpu.rail, []).append(gpu.name)
    (zero, one) = by_rail.values()
    # every GPU to the other rail's GPU on the next server, both ways: 4 flows per leaf
    # uplink direction, as many as it has parallel links
    flows = [(a, one[(i + 1) % len(one)]) for i, a in enumerate(zero)]
    flows += [(b, zero[(i + 1) % len(zero)]) for i, b in enumerate(one)]
    assignments = assign_paths(PinnedPaths(desc), flows)
    up: Counter[tuple[str, int]] = Counter()
    for a in assignments:
        up.update((x[0], x[2]) for x in a.lanes if x[1] == spine)
    per_leaf: dict[str, list[int]] = {}
    for (leaf, _), n in up.items():
        per_leaf.setdefault(leaf, []).append(n)
    assert per_leaf and all(max(n) == 1 for n in per_leaf.values()), up
    rendered = default_registry().create("path-pinned").render(desc, frozenset())
    for a in assignments:
        src, dst = desc.addresses[a.src], desc.addresses[a.dst]
        (nic,) = src.nics
        packet = Packet.tcp(src.fabric_ip, dst.fabric_ip, a.source_port, WORKER_PORT)
        leaf = nic.peer
        entry = rendered.lookup_packet(fabric.switches[leaf].dpid, packet)
        assert entry is not None
        (lane,) = [x for x in a.lanes if x[0] == leaf]
        assert lane[2] in output_ports(rendered, fabric.switches[leaf].dpid, entry)


def output_ports(rendered: ForwardingPlan, dpid: int, entry: FlowEntry) -> set[int]:
    """The ports an entry sends out of: its output, or its group's first bucket's."""
    ports = set()
    for action in entry.actions:
        if isinstance(action, Output):
            ports.add(action.port)
        elif isinstance(action, Group):
            group = rendered.tables[dpid].group(action.group_id)
            ports |= {a.port for a in group.buckets[0].actions if isinstance(a, Output)}
    return ports


def test_the_paths_file_names_the_parallel_link_each_path_takes() -> None:
    desc = twins_description()
    document = paths_document(PinnedPaths(desc))
    names = document["switches"]
    for pair in document["pairs"]:
        seen = set()
        for path in pair["paths"]:
            assert len(path["ports"]) == len(path["hops"])
            for i, port in zip(path["hops"], path["ports"], strict=True):
                assert port in {x.port_of(names[i]) for x in desc.fabric.links_of(names[i])}
            seen.add((path["nic"], tuple(path["hops"]), tuple(path["ports"])))
        assert len(seen) == len(pair["paths"])  # no two values give the same lanes
