"""Fabric properties: paths and hops per GPU-pair class, tier capacities, bisection.

Expected values are derived by hand from the presets' wiring (comments say how) and the
path counts and bisection are also checked against independent networkx computations.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import networkx as nx
import pytest

from tests.helpers import preset_fabric
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind, Tier
from topologies.properties import PAIR_CLASSES, fabric_properties
from topologies.spec import parse_fabric_spec

G = 1e9


# (hops, ECMP paths) per class; None = absent.
EXPECTED_PAIRS: dict[str, dict[str, tuple[int, int] | None]] = {
    # Dual-ToR: 2 ToRs; then 2 aggs x 2 cores of that agg's group x 2 ToRs = 16.
    "astral-small": {
        "same-tor": (1, 2),
        "same-rail": None,  # one dual-ToR pair per rail plane
        "same-rail-other-pod": (5, 16),
        "cross-rail": (5, 16),
        "cross-rail-other-pod": (5, 16),
    },
    "hpn-like": {
        "same-tor": (1, 2),
        "same-rail": None,
        "same-rail-other-pod": (5, 16),
        "cross-rail": (5, 16),
        "cross-rail-other-pod": (5, 16),
    },
    # One server per edge: same-rail GPUs never share an edge; 2 aggs, then 2 cores per agg.
    "fat-tree-small": {
        "same-tor": None,
        "same-rail": (3, 2),
        "same-rail-other-pod": (5, 4),
        "cross-rail": (3, 2),
        "cross-rail-other-pod": (5, 4),
    },
    # 2 source leaves x 4 spines x 2 destination leaves.
    "rail-optimized-small": {
        "same-tor": (1, 2),
        "same-rail": None,
        "same-rail-other-pod": (3, 16),
        "cross-rail": (3, 16),
        "cross-rail-other-pod": (3, 16),
    },
    # Cross-rail: NVLink at either end (2 ways) x 2 leaves of the pair = 4, plus 2 rail
    # spines x 2 destination leaves across pods = 16.
    "rail-only-small": {
        "same-tor": (1, 2),
        "same-rail": None,
        "same-rail-other-pod": (3, 8),
        "cross-rail": (2, 4),
        "cross-rail-other-pod": (4, 16),
    },
}
MAX_HOPS = {
    "astral-small": 5,
    "hpn-like": 5,
    "fat-tree-small": 5,
    "rail-optimized-small": 3,
    "rail-only-small": 4,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PAIRS))
def test_pair_classes_on_presets(name: str) -> None:
    props = fabric_properties(preset_fabric(name))
    got = {p.cls: ((p.hops, p.paths) if p.present else None) for p in props.pairs}
    assert [p.cls for p in props.pairs] == list(PAIR_CLASSES)
    assert got == EXPECTED_PAIRS[name]
    assert props.max_hops == MAX_HOPS[name]
    for pair in props.pairs:
        if pair.present:
            assert pair.src == "p0s0g0"
            assert pair.example[0] == pair.src and pair.example[-1] == pair.dst
            assert len(pair.example) == pair.hops + pair.gpu_transits + 2


def test_rail_only_cross_rail_goes_through_nvlink() -> None:
    props = fabric_properties(preset_fabric("rail-only-small"))
    for pair in props.pairs:
        crossing = pair.cls.startswith("cross-rail")
        assert pair.nvlink_hops == (1 if crossing else 0)
        assert pair.gpu_transits == (1 if crossing else 0)


def test_other_kinds_never_use_nvlink_or_gpus() -> None:
    for name in ("astral-small", "fat-tree-small", "rail-optimized-small"):
        fabric = preset_fabric(name)
        for pair in fabric_properties(fabric).pairs:
            assert pair.nvlink_hops == 0 and pair.gpu_transits == 0
            assert all(n not in fabric.gpus for n in pair.example[1:-1])


def test_same_rail_other_tor_class() -> None:
    """With two dual-ToR pairs per plane the class exists: ToR - agg - ToR."""
    spec = parse_fabric_spec(
        {
            "name": "two-groups",
            "kind": "astral",
            "pods": 1,
            "servers_per_pod": 8,
            "gpus_per_server": 1,
            "nic_ports": 2,
            "switch": {"radix": 8, "down_ports": 4},
        }
    )
    props = fabric_properties(build_fabric(spec))
    pair = next(p for p in props.pairs if p.cls == "same-rail")
    # 2 source ToRs x 4 aggs x 2 destination ToRs; servers 0-3 are group 0, 4-7 group 1.
    assert (pair.src, pair.dst, pair.hops, pair.paths) == ("p0s0g0", "p0s4g0", 3, 16)
    assert props.max_hops == 3  # one pod, one rail: no core


def _count_paths_networkx(fabric: Fabric, src: str, dst: str) -> tuple[int, int]:
    """Independent count: networkx shortest paths, parallel links multiplied in."""
    graph = nx.Graph()
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK and not fabric.gpu_forwarding:
            continue
        weight = graph.get_edge_data(link.a, link.b, {}).get("n", 0)
        graph.add_edge(link.a, link.b, n=weight + 1)
    if not fabric.gpu_forwarding:
        graph.remove_nodes_from([g for g in fabric.gpus if g not in (src, dst)])
    total, length = 0, 0
    for path in nx.all_shortest_paths(graph, src, dst):
        kinds_ok = True
        for i in range(1, len(path) - 1):
            if path[i] in fabric.gpus:  # a transit GPU must turn NVLink <-> NIC
                nv = [fabric.switches.get(path[j]) for j in (i - 1, i + 1)]
                kinds_ok &= sum(1 for s in nv if s is not None and s.tier is Tier.NVLINK) == 1
        if not kinds_ok:
            continue
        product = 1
        for a, b in itertools.pairwise(path):
            product *= graph[a][b]["n"]
        total += product
        length = len(path)
    return total, length


@pytest.mark.parametrize("name", sorted(EXPECTED_PAIRS))
def test_path_counts_match_networkx(name: str) -> None:
    fabric = preset_fabric(name)
    for pair in fabric_properties(fabric).pairs:
        if not pair.present:
            continue
        assert pair.src is not None and pair.dst is not None
        paths, length = _count_paths_networkx(fabric, pair.src, pair.dst)
        assert paths == pair.paths, pair
        assert length == pair.hops + pair.gpu_transits + 2


# --- capacities and bisection --------------------------------------------------------------


def test_tier_capacities() -> None:
    hpn = {t.tier: t for t in fabric_properties(preset_fabric("hpn-like")).tiers}
    assert hpn[Tier.TOR].ratio == pytest.approx(1.0)
    assert hpn[Tier.AGG].ratio == pytest.approx(15.0)
    assert hpn[Tier.AGG].up_capacity == pytest.approx(16 * 200 * G / 15)
    assert hpn[Tier.CORE].ratio is None  # top tier
    leaf = fabric_properties(preset_fabric("rail-optimized-small")).tiers[0]
    # Each leaf uses 2 of its 4 down ports and all 4 up ports.
    assert (leaf.tier, leaf.switches, leaf.down_links, leaf.up_links) == (Tier.TOR, 8, 16, 32)
    assert leaf.ratio == pytest.approx(0.5) and leaf.worst_ratio == pytest.approx(0.5)


EXPECTED_CUTS = {
    # 4 GPUs x 400G on each side; the core carries all of it at 1:1.
    "astral-small": {"pods": 1600 * G, "servers": 1600 * G, "rails": 1600 * G},
    # Per pod 2 rails x 2 aggs x 2 uplinks x 200G/15 leave the pod; servers share their ToRs.
    "hpn-like": {"pods": 1600 * G / 15, "servers": 1600 * G, "rails": 1600 * G / 15},
    "fat-tree-small": {"pods": 1600 * G, "servers": 1600 * G, "rails": 1600 * G},
    "rail-optimized-small": {"pods": 1600 * G, "servers": 1600 * G, "rails": 1600 * G},
    # Rails are joined by NVLink only: 4 servers x 1 GPU per side x 3.6T.
    "rail-only-small": {"pods": 1600 * G, "servers": 1600 * G, "rails": 4 * 3600 * G},
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CUTS))
def test_bisection_cuts_on_presets(name: str) -> None:
    bisection = fabric_properties(preset_fabric(name)).bisection
    got = {cut.name: cut.capacity for cut in bisection.cuts}
    assert got == pytest.approx(EXPECTED_CUTS[name])
    assert bisection.capacity == pytest.approx(min(EXPECTED_CUTS[name].values()))


def test_bisection_ratio() -> None:
    assert fabric_properties(preset_fabric("astral-small")).bisection.ratio == pytest.approx(1.0)
    assert fabric_properties(preset_fabric("fat-tree-small")).bisection.per_gpu == pytest.approx(
        200 * G
    )
    assert fabric_properties(preset_fabric("hpn-like")).bisection.ratio == pytest.approx(1 / 15)


def test_tor_oversubscription_halves_the_server_cut() -> None:
    """Two single ToRs per plane with uplinks at 1/2: the server halves meet through them."""
    spec = parse_fabric_spec(
        {
            "name": "tor2",
            "kind": "astral",
            "pods": 1,
            "servers_per_pod": 4,
            "gpus_per_server": 2,
            "nic_ports": 1,
            "switch": {"radix": 4, "down_ports": 2},
            "oversubscription": {"tor": 2},
        }
    )
    props = fabric_properties(build_fabric(spec))
    cuts = {c.name: c.capacity for c in props.bisection.cuts}
    # Per plane the A ToR has 2 GPUs x 200G below and 2 x 100G above: 200G, 2 planes.
    assert cuts == pytest.approx({"servers": 400 * G, "rails": 400 * G})
    assert props.bisection.ratio == pytest.approx(0.5)


def _true_bisection(fabric: Fabric) -> float:
    """Minimum over *all* balanced partitions (brute force; tiny fabrics only)."""
    base = nx.DiGraph()
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK and not fabric.gpu_forwarding:
            continue
        for a, b in ((link.a, link.b), (link.b, link.a)):
            old = base.get_edge_data(a, b, {}).get("capacity", 0.0)
            base.add_edge(a, b, capacity=old + link.capacity)
    gpus = sorted(fabric.gpus)
    best = float("inf")
    for side in itertools.combinations(gpus[1:], len(gpus) // 2 - 1):
        side_a = {gpus[0], *side}
        graph = base.copy()
        for gpu in gpus:  # edges without capacity are unbounded in networkx
            if gpu in side_a:
                graph.add_edge("S", gpu)
            else:
                graph.add_edge(gpu, "T")
        best = min(best, nx.maximum_flow_value(graph, "S", "T"))
    return best


@pytest.mark.parametrize(
    "name", ["astral-small", "hpn-like", "rail-optimized-small", "rail-only-small"]
)
def test_aligned_cuts_find_the_true_bisection_of_the_presets(name: str) -> None:
    fabric = preset_fabric(name)
    assert fabric_properties(fabric).bisection.capacity == pytest.approx(_true_bisection(fabric))


def test_bisection_is_an_upper_bound_on_an_irregular_fabric() -> None:
    """A part-filled, oversubscribed fabric: the aligned cuts are never below the truth."""
    spec = parse_fabric_spec(
        {
            "name": "odd",
            "kind": "astral",
            "pods": 1,
            "servers_per_pod": 3,
            "gpus_per_server": 2,
            "nic_ports": 1,
            "switch": {"radix": 4, "down_ports": 2},
            "oversubscription": {"tor": 2, "agg": 3},
        }
    )
    fabric = build_fabric(spec)
    assert fabric_properties(fabric).bisection.capacity >= _true_bisection(fabric) * (1 - 1e-9)


# --- output and speed ----------------------------------------------------------------------


def test_to_dict_is_json() -> None:
    data: dict[str, Any] = json.loads(
        json.dumps(fabric_properties(preset_fabric("rail-only-small")).to_dict())
    )
    assert data["gpus"] == 8 and data["gpu_forwarding"] is True
    assert data["bisection"]["worst_cut"] in ("pods", "servers")
    assert {p["class"] for p in data["pairs"]} == set(PAIR_CLASSES)
    assert data["switches"] == {"nvlink": 4, "tor": 8, "agg": 4}


def test_fast_on_a_thousand_gpus() -> None:
    spec = parse_fabric_spec(
        {
            "name": "k",
            "kind": "astral",
            "pods": 2,
            "servers_per_pod": 64,
            "gpus_per_server": 8,
            "nic_ports": 2,
            "switch": {"radix": 32, "down_ports": 16},
        }
    )
    start = time.monotonic()
    fabric = build_fabric(spec)
    props = fabric_properties(fabric)
    elapsed = time.monotonic() - start
    assert props.gpus == 1024 and props.bisection.ratio == pytest.approx(1.0)
    assert elapsed < 15, f"{elapsed:.1f}s"  # about 1 s on the 2-core project machine
