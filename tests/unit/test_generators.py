"""Generators: counts against closed forms at several sizes, wiring invariants, names, ports."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from tests.helpers import preset_fabric
from topologies.catalog import preset_names, preset_path
from topologies.errors import FabricSpecError
from topologies.generators import build_fabric, default_registry
from topologies.model import Fabric, LinkKind, Tier
from topologies.planner import uniform_uplinks
from topologies.spec import FabricSpec, load_fabric_spec, parse_fabric_spec

PRESETS = [preset_path(name) for name in preset_names()]


def make(kind: str, **fields: Any) -> FabricSpec:
    doc: dict[str, Any] = {"name": "t", "kind": kind, "gpus_per_server": 2, "pods": 1}
    radix = fields.pop("radix", 4)
    down = fields.pop("down", radix // 2)
    doc["switch"] = {"radix": radix, "down_ports": down}
    doc.update(fields)
    return parse_fabric_spec(doc, "test")


def tiers(fabric: Fabric) -> Counter[Tier]:
    return Counter(s.tier for s in fabric.switches.values())


def kinds(fabric: Fabric) -> Counter[LinkKind]:
    return Counter(link.kind for link in fabric.links)


def test_registry_holds_the_four_kinds() -> None:
    assert default_registry().kinds() == ["astral", "fat-tree", "rail-only", "rail-optimized"]


# --- counts against closed forms -------------------------------------------------------


@pytest.mark.parametrize(("k", "gpus"), [(4, 1), (4, 2), (4, 4), (6, 1), (6, 3), (8, 2), (8, 8)])
def test_full_fat_tree_counts(k: int, gpus: int) -> None:
    """The k-ary fat-tree: k pods of k/2 edge + k/2 agg, (k/2)^2 cores, k^3/4 hosts."""
    half = k // 2
    fabric = build_fabric(make("fat-tree", radix=k, pods=k, gpus_per_server=gpus))
    assert len(fabric.gpus) == k**3 // 4
    assert len(fabric.servers) == k**3 // 4 // gpus
    assert tiers(fabric) == {
        Tier.TOR: k * half,
        Tier.AGG: k * half,
        Tier.CORE: half * half,
        Tier.NVLINK: k**3 // 4 // gpus,
    }
    assert kinds(fabric)[LinkKind.NIC] == k**3 // 4
    assert kinds(fabric)[LinkKind.TOR_AGG] == k * half * half
    assert kinds(fabric)[LinkKind.AGG_CORE] == k * half * half
    # Classic wiring: every core has one link to every pod, no parallel links anywhere.
    pairs = Counter(tuple(sorted((link.a, link.b))) for link in fabric.links)
    assert max(pairs.values()) == 1
    for core in fabric.switches_in(Tier.CORE):
        pods = Counter(
            fabric.switches[link.other(core.name)].pod for link in fabric.links_of(core.name)
        )
        assert pods == {pod: 1 for pod in range(k)}


@pytest.mark.parametrize(
    ("k", "pods", "cores"), [(4, 1, 0), (4, 2, 2), (4, 3, 4), (8, 2, 4), (8, 6, 16)]
)
def test_partial_fat_tree_cores(k: int, pods: int, cores: int) -> None:
    """Fewer pods: ceil(pods/2) cores per group, rounded up to a divisor of k/2; none for 1 pod."""
    fabric = build_fabric(make("fat-tree", radix=k, pods=pods))
    assert tiers(fabric)[Tier.CORE] == cores
    assert kinds(fabric)[LinkKind.AGG_CORE] == (pods * (k // 2) ** 2 if cores else 0)


def test_fat_tree_servers_stay_under_one_edge() -> None:
    fabric = build_fabric(make("fat-tree", radix=8, pods=2, gpus_per_server=2))
    for server in fabric.servers.values():
        edges = {fabric.nic_links(g)[0].other(g) for g in server.gpus}
        assert len(edges) == 1


@pytest.mark.parametrize(
    ("radix", "down", "pods", "servers", "gpus", "nic_ports"),
    [
        (4, 2, 2, 2, 2, 2),
        (4, 2, 1, 3, 2, 1),
        (8, 4, 2, 6, 4, 2),
        (8, 4, 3, 8, 2, 1),
        (8, 4, 1, 4, 1, 2),
        (6, 3, 2, 5, 2, 1),
    ],
)
def test_astral_counts(
    radix: int, down: int, pods: int, servers: int, gpus: int, nic_ports: int
) -> None:
    spec = make(
        "astral",
        radix=radix,
        down=down,
        pods=pods,
        servers_per_pod=servers,
        gpus_per_server=gpus,
        nic_ports=nic_ports,
    )
    fabric = build_fabric(spec)
    up = radix - down
    tors = -(-servers // down) * nic_ports  # per rail plane
    planes = pods * gpus
    cores = up * -(-(planes * up) // radix) if planes > 1 else 0
    assert tiers(fabric) == {
        Tier.TOR: planes * tors,
        Tier.AGG: planes * up,
        Tier.NVLINK: pods * servers,
        **({Tier.CORE: cores} if cores else {}),
    }
    assert kinds(fabric) == {
        LinkKind.NVLINK: pods * servers * gpus,
        LinkKind.NIC: pods * servers * gpus * nic_ports,
        LinkKind.TOR_AGG: planes * tors * up,
        **({LinkKind.AGG_CORE: planes * up * up} if cores else {}),
    }


def test_astral_default_pod_is_full() -> None:
    """Without servers_per_pod a pod holds D * D / nic_ports servers (D down ports)."""
    fabric = build_fabric(make("astral", radix=8, down=4, gpus_per_server=1, nic_ports=2))
    assert len(fabric.servers) == 4 * 4 // 2
    tor_downs = Counter(link.other(g) for g in fabric.gpus for link in fabric.nic_links(g))
    assert set(tor_downs.values()) == {4}  # every ToR port used


@pytest.mark.parametrize(
    ("radix", "pods", "servers", "gpus", "nic_ports", "spines"),
    [
        (8, 2, 2, 2, 2, 4),
        (4, 1, 4, 2, 1, 2),
        (8, 1, 8, 2, 2, 4),
        (16, 2, 8, 2, 1, 2),
        (8, 1, 2, 1, 1, 1),
    ],
)
def test_rail_optimized_counts(
    radix: int, pods: int, servers: int, gpus: int, nic_ports: int, spines: int
) -> None:
    down = up = radix // 2
    spec = make(
        "rail-optimized",
        radix=radix,
        pods=pods,
        servers_per_pod=servers,
        gpus_per_server=gpus,
        nic_ports=nic_ports,
    )
    fabric = build_fabric(spec)
    leaves = pods * gpus * -(-servers // down) * nic_ports
    assert tiers(fabric) == {Tier.TOR: leaves, Tier.AGG: spines, Tier.NVLINK: pods * servers}
    assert kinds(fabric)[LinkKind.NIC] == pods * servers * gpus * nic_ports
    assert kinds(fabric)[LinkKind.TOR_AGG] == leaves * up
    # Every leaf reaches every spine, equally often.
    for leaf in fabric.switches_in(Tier.TOR):
        spread = Counter(
            link.other(leaf.name)
            for link in fabric.links_of(leaf.name)
            if link.kind is LinkKind.TOR_AGG
        )
        assert len(spread) == spines and len(set(spread.values())) == 1


def test_rail_optimized_default_fills_the_spines() -> None:
    fabric = build_fabric(make("rail-optimized", radix=8, gpus_per_server=2, nic_ports=2))
    assert len(fabric.servers) == 8 // (2 * 2) * 4  # groups per rail x D
    spine_ports = Counter(
        link.other(s.name)
        for s in fabric.switches_in(Tier.TOR)
        for link in fabric.links_of(s.name)
        if link.kind is LinkKind.TOR_AGG
    )
    assert max(spine_ports.values()) <= 8


@pytest.mark.parametrize(
    ("radix", "pods", "servers", "gpus", "nic_ports", "spines_per_rail"),
    [
        (4, 2, 2, 2, 2, 2),
        (4, 1, 2, 2, 2, 0),
        (4, 1, 4, 2, 2, 2),
        (8, 1, 4, 4, 1, 0),
        (8, 3, 4, 2, 1, 2),
        (8, 1, 12, 2, 1, 2),
    ],
)
def test_rail_only_counts(
    radix: int, pods: int, servers: int, gpus: int, nic_ports: int, spines_per_rail: int
) -> None:
    down = up = radix // 2
    spec = make(
        "rail-only",
        radix=radix,
        pods=pods,
        servers_per_pod=servers,
        gpus_per_server=gpus,
        nic_ports=nic_ports,
    )
    fabric = build_fabric(spec)
    assert fabric.gpu_forwarding
    leaves_per_rail = pods * -(-servers // down) * nic_ports
    expected = {Tier.TOR: gpus * leaves_per_rail, Tier.NVLINK: pods * servers}
    if spines_per_rail:
        expected[Tier.AGG] = gpus * spines_per_rail
    assert tiers(fabric) == expected
    assert kinds(fabric)[LinkKind.TOR_AGG] == (
        gpus * leaves_per_rail * up if spines_per_rail else 0
    )
    # Nothing joins two rails but NVLink.
    for link in fabric.links:
        if link.kind is LinkKind.TOR_AGG:
            assert fabric.switches[link.a].rail == fabric.switches[link.b].rail


def test_only_rail_only_forwards_through_gpus() -> None:
    for path in PRESETS:
        fabric = build_fabric(load_fabric_spec(path))
        assert fabric.gpu_forwarding == (fabric.kind == "rail-only")


# --- invariants on every preset and a spread of specs --------------------------------------


def _specs() -> list[FabricSpec]:
    specs = [load_fabric_spec(path) for path in PRESETS]
    specs += [
        make("astral", radix=8, down=4, pods=2, servers_per_pod=5, gpus_per_server=4, nic_ports=2),
        make("astral", radix=6, down=3, pods=2, servers_per_pod=3, gpus_per_server=2, nic_ports=1),
        make("fat-tree", radix=6, pods=3, gpus_per_server=3),
        make("fat-tree", radix=8, pods=2, gpus_per_server=8, servers_per_pod=2),
        make(
            "rail-optimized", radix=16, pods=2, servers_per_pod=11, gpus_per_server=2, nic_ports=2
        ),
        make("rail-only", radix=8, pods=2, servers_per_pod=7, gpus_per_server=4, nic_ports=2),
    ]
    return specs


SPECS = _specs()


@pytest.fixture(params=SPECS, ids=[f"{s.kind}:{s.name}:{i}" for i, s in enumerate(SPECS)])
def fabric(request: pytest.FixtureRequest) -> Fabric:
    return build_fabric(request.param)


def test_ports_are_numbered_densely_and_fit_the_radix(fabric: Fabric) -> None:
    ports: dict[str, list[int]] = {}
    for link in fabric.links:
        ports.setdefault(link.a, []).append(link.a_port)
        ports.setdefault(link.b, []).append(link.b_port)
    radix = fabric.spec.switch.radix
    for node, numbers in ports.items():
        if node in fabric.gpus:
            assert sorted(numbers) == list(range(fabric.spec.nic_ports + 1)), node
        else:
            assert sorted(numbers) == list(range(1, len(numbers) + 1)), node
            if fabric.switches[node].tier is not Tier.NVLINK:
                assert len(numbers) <= radix, node


def test_gpu_ports(fabric: Fabric) -> None:
    """Port 0 is NVLink; ports 1..nic_ports go to ToRs; dual-ToR ports to two ToRs of the rail."""
    for name, gpu in fabric.gpus.items():
        links = fabric.links_of(name)
        nv = [link for link in links if link.port_of(name) == 0]
        assert len(nv) == 1 and nv[0].kind is LinkKind.NVLINK
        assert nv[0].other(name) == fabric.servers[gpu.server].nvswitch
        nics = fabric.nic_links(name)
        assert [link.port_of(name) for link in nics] == list(range(1, fabric.spec.nic_ports + 1))
        tors = [fabric.switches[link.other(name)] for link in nics]
        assert all(t.tier is Tier.TOR for t in tors)
        assert len({t.name for t in tors}) == len(tors)
        if fabric.kind != "fat-tree":
            assert {t.rail for t in tors} == {gpu.rail}
            assert {t.pod for t in tors} == {gpu.pod}


def test_switch_downlinks_come_before_uplinks(fabric: Fabric) -> None:
    below = {Tier.TOR: LinkKind.NIC, Tier.AGG: LinkKind.TOR_AGG, Tier.CORE: LinkKind.AGG_CORE}
    for switch in fabric.switches.values():
        if switch.tier is Tier.NVLINK:
            continue
        links = fabric.links_of(switch.name)
        down = [link.port_of(switch.name) for link in links if link.kind is below[switch.tier]]
        up = [link.port_of(switch.name) for link in links if link.kind is not below[switch.tier]]
        if down and up:
            assert max(down) < min(up), switch.name


def test_dpids_unique_and_ordered_by_tier(fabric: Fabric) -> None:
    ordered = sorted(fabric.switches.values(), key=lambda s: s.dpid)
    assert [s.dpid for s in ordered] == list(range(1, len(ordered) + 1))
    ranks = [s.tier.rank for s in ordered]
    assert ranks == sorted(ranks)


def test_upper_tiers_are_uniform(fabric: Fabric) -> None:
    """A lower switch links equally often to each upper switch it reaches (always for the
    fat-tree and rail kinds; for astral when the core group size divides the uplinks)."""
    if not uniform_uplinks(fabric.spec):
        pytest.skip("astral's core group size does not divide the uplinks")
    for switch in fabric.switches.values():
        if switch.tier not in (Tier.TOR, Tier.AGG):
            continue
        rank = switch.tier.rank
        spread = Counter(
            link.other(switch.name)
            for link in fabric.links_of(switch.name)
            if link.other(switch.name) in fabric.switches
            and fabric.switches[link.other(switch.name)].tier.rank > rank
        )
        assert len(set(spread.values())) <= 1, (switch.name, spread)


def test_generation_is_deterministic(fabric: Fabric) -> None:
    again = build_fabric(fabric.spec)
    assert again.links == fabric.links
    assert again.switches == fabric.switches
    assert again.gpus == fabric.gpus


def test_names_fit_interface_limits(fabric: Fabric) -> None:
    """GPU names <= 10 characters; every Mininet interface name <node>-eth<port> <= 15."""
    for name in fabric.gpus:
        assert len(name) <= 10, name
    for link in fabric.links:
        for node, port in ((link.a, link.a_port), (link.b, link.b_port)):
            assert len(f"{node}-eth{port}") <= 15, (node, port)


def test_names_fit_at_the_largest_emulated_sizes() -> None:
    """Interface names stay short up to 8 pods x 32 servers x 8 GPUs (2,048 GPUs)."""
    specs = [
        make(
            "astral", radix=64, down=32, pods=8, servers_per_pod=32, gpus_per_server=8, nic_ports=2
        ),
        make("fat-tree", radix=32, pods=8, gpus_per_server=8, servers_per_pod=32),
        make("rail-only", radix=64, pods=8, servers_per_pod=32, gpus_per_server=8, nic_ports=2),
    ]
    for spec in specs:
        fabric = build_fabric(spec)
        longest_gpu = max(len(name) for name in fabric.gpus)
        longest_intf = max(
            len(f"{node}-eth{port}")
            for link in fabric.links
            for node, port in ((link.a, link.a_port), (link.b, link.b_port))
        )
        assert longest_gpu <= 10 and longest_intf <= 15, (spec.kind, longest_gpu, longest_intf)


def test_port_numbering_snapshot() -> None:
    """The numbering contract of model.py on the default preset, pinned."""
    fabric = preset_fabric("astral-small")
    by_end = {(link.a, link.b): (link.a_port, link.b_port) for link in fabric.links}
    assert by_end[("p0s0g0", "p0s0nv")] == (0, 1)
    assert by_end[("p0s0g0", "p0r0t0")] == (1, 1)
    assert by_end[("p0s0g0", "p0r0t1")] == (2, 1)
    assert by_end[("p0s1g0", "p0r0t0")] == (1, 2)
    assert by_end[("p0r0t0", "p0r0a0")] == (3, 1)
    assert by_end[("p0r0t0", "p0r0a1")] == (4, 1)
    assert by_end[("p0r0a0", "c0")] == (3, 1)
    assert by_end[("p0r0a0", "c1")] == (4, 1)
    assert (
        fabric.switches["p0r0t0"].dpid < fabric.switches["p0r0a0"].dpid < fabric.switches["c0"].dpid
    )


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        (lambda: make("fat-tree", radix=4, nic_ports=2), "nic_ports"),
        (lambda: make("fat-tree", radix=8, down=3), "switch.down_ports"),
        (lambda: make("fat-tree", radix=4, pods=5), "pods"),
        (lambda: make("astral", radix=4, down=1, nic_ports=2), "switch.down_ports"),
        (lambda: make("astral", radix=4, servers_per_pod=3, nic_ports=2), "servers_per_pod"),
        (lambda: make("rail-optimized", radix=4, pods=3, nic_ports=2), "pods"),
        (
            lambda: make("rail-optimized", radix=4, gpus_per_server=4, nic_ports=2),
            "gpus_per_server",
        ),
        (lambda: make("rail-only", radix=4, servers_per_pod=5, nic_ports=2), "servers_per_pod"),
    ],
)
def test_unwirable_specs_are_rejected_with_the_key(spec: Any, key: str) -> None:
    with pytest.raises(FabricSpecError) as info:
        build_fabric(spec())
    assert info.value.key == key
    assert info.value.file == "test"
