"""The planner: the paper's figures at full size, and agreement with generated fabrics."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from topologies.errors import FabricSpecError
from topologies.generators import build_fabric
from topologies.model import LinkKind, Tier
from topologies.planner import (
    PlanInput,
    Unreachable,
    common_reach,
    compare,
    max_gpus,
    plan,
    plan_astral,
    plan_for_gpus,
    uniform_uplinks,
)
from topologies.properties import fabric_properties
from topologies.spec import FabricSpec, parse_fabric_spec

G = 1e9
PAPER = PlanInput()  # 256 x 200G, 128 down / 128 up, 8 rails, dual-ToR, 8 pods


def test_paper_figures() -> None:
    """docs/astral.md: 128 GPUs per ToR, 8,192 per rail plane, 65,536 per pod, ~512K, 3.2T."""
    p = plan_astral(PAPER)
    assert p.gpus_per_tor == 128
    assert p.gpus_per_plane == 8_192
    assert p.gpus_per_pod == 65_536
    assert p.gpus == 524_288
    assert p.server_bandwidth == pytest.approx(3.2e12)
    assert p.gpu_bandwidth == pytest.approx(400 * G)
    assert p.spec.switch.radix * p.spec.speeds.nic == pytest.approx(51.2e12)


def test_paper_switches_links_transceivers() -> None:
    p = plan_astral(PAPER)
    # Per rail plane 128 ToRs (64 pairs) and 128 aggs; 64 planes; cores: 128 groups of
    # ceil(64 planes x 128 uplinks / 256) = 32.
    assert p.switches == {
        Tier.TOR: 8_192,
        Tier.AGG: 8_192,
        Tier.CORE: 4_096,
        Tier.NVLINK: 65_536,
    }
    assert p.network_switches == 20_480
    assert p.links == {
        LinkKind.NIC: 1_048_576,  # 524,288 GPUs x 2 ports
        LinkKind.TOR_AGG: 1_048_576,
        LinkKind.AGG_CORE: 1_048_576,
        LinkKind.NVLINK: 524_288,
    }
    assert p.switch_transceivers == 4_194_304
    assert p.nic_transceivers == 2_097_152
    assert p.transceivers == 6_291_456
    assert p.tier_ratios() == {Tier.TOR: 1.0, Tier.AGG: 1.0}
    assert p.max_hops == 5
    assert p.bisection == pytest.approx(524_288 / 2 * 400 * G)
    assert p.bisection_per_gpu == pytest.approx(400 * G)
    assert uniform_uplinks(p.spec)


def test_paper_with_an_hpn_core() -> None:
    p = plan_astral(PlanInput(oversubscription_agg=15))
    assert p.tier_ratios()[Tier.AGG] == pytest.approx(15)
    assert p.cuts["pods"] == pytest.approx(524_288 / 2 * 400 * G / 15)
    assert p.cuts["servers"] == pytest.approx(524_288 / 2 * 400 * G)  # stays in the plane
    assert p.bisection_per_gpu == pytest.approx(400 * G / 15)


def test_comparison_at_the_paper_size() -> None:
    results = {r.kind: r for r in compare(524_288, PAPER)}
    fat = results["fat-tree"]
    assert not isinstance(fat, Unreachable)
    # k = 256: 16,384 hosts per pod -> 32 pods of 128 edge + 128 agg; 128 core groups of 16.
    assert (fat.pods, fat.gpus, fat.network_switches) == (32, 524_288, 10_240)
    assert fat.bisection_per_gpu == pytest.approx(200 * G)  # one NIC port per host
    assert fat.max_hops == 5
    for kind, most in (("rail-optimized", 16_384), ("rail-only", 131_072)):
        result = results[kind]
        assert isinstance(result, Unreachable)
        assert result.max_gpus == most == max_gpus(kind, PAPER)
    assert common_reach(PAPER) == 16_384


def test_comparison_where_all_reach() -> None:
    results = compare(16_384, PAPER)
    assert all(not isinstance(r, Unreachable) for r in results)
    hops = {r.kind: r.max_hops for r in results if not isinstance(r, Unreachable)}
    assert hops == {"astral": 5, "fat-tree": 3, "rail-optimized": 3, "rail-only": 4}
    for result in results:
        assert not isinstance(result, Unreachable)
        assert result.gpus >= 16_384


def test_plan_for_gpus_rounds_up_and_rejects_the_impossible() -> None:
    small = PlanInput(radix=8, rails=2, nic_ports=2, pods=1)
    result = plan_for_gpus("astral", 9, small)
    assert not isinstance(result, Unreachable) and result.gpus >= 9
    assert isinstance(plan_for_gpus("rail-optimized", 10_000, small), Unreachable)


def test_bad_inputs_are_spec_errors() -> None:
    with pytest.raises(FabricSpecError) as info:
        plan_astral(PlanInput(down_ports=256))
    assert info.value.key == "switch.down_ports"
    with pytest.raises(FabricSpecError) as info:
        plan_astral(PlanInput(pods=100))
    assert info.value.key == "pods"


# --- planner == generator at small sizes ---------------------------------------------------


def _spec(kind: str, radix: int, down: int, **fields: Any) -> FabricSpec:
    doc = {"name": "p", "kind": kind, "switch": {"radix": radix, "down_ports": down}, **fields}
    return parse_fabric_spec(doc, "test")


SMALL = [
    _spec("astral", 4, 2, pods=2, servers_per_pod=2, gpus_per_server=2, nic_ports=2),
    _spec("astral", 8, 4, pods=2, servers_per_pod=6, gpus_per_server=2, nic_ports=2),
    _spec("astral", 8, 4, pods=1, gpus_per_server=2, nic_ports=1),
    _spec("astral", 8, 4, pods=2, servers_per_pod=4, gpus_per_server=4, nic_ports=1),
    _spec(
        "astral",
        4,
        2,
        pods=2,
        servers_per_pod=2,
        gpus_per_server=2,
        oversubscription={"tor": 2, "agg": 3},
    ),
    _spec("astral", 8, 2, pods=1, servers_per_pod=2, gpus_per_server=1, nic_ports=2),
    _spec("fat-tree", 4, 2, pods=4, gpus_per_server=2),
    _spec("fat-tree", 6, 3, pods=2, gpus_per_server=3),
    _spec("fat-tree", 8, 4, pods=3, servers_per_pod=5, gpus_per_server=2),
    _spec("fat-tree", 8, 4, pods=1, gpus_per_server=8, oversubscription={"tor": 2}),
    _spec("fat-tree", 4, 2, pods=2, gpus_per_server=1, oversubscription={"agg": 4}),
    _spec("rail-optimized", 8, 4, pods=2, servers_per_pod=2, gpus_per_server=2, nic_ports=2),
    _spec("rail-optimized", 4, 2, pods=1, servers_per_pod=4, gpus_per_server=2, nic_ports=1),
    _spec("rail-optimized", 16, 8, pods=2, gpus_per_server=2, nic_ports=2),
    _spec("rail-optimized", 12, 6, pods=1, servers_per_pod=8, gpus_per_server=3, nic_ports=1),
    _spec("rail-only", 4, 2, pods=2, servers_per_pod=2, gpus_per_server=2, nic_ports=2),
    _spec("rail-only", 4, 2, pods=1, servers_per_pod=2, gpus_per_server=4, nic_ports=2),
    _spec("rail-only", 8, 4, pods=1, gpus_per_server=2, nic_ports=2),
    _spec(
        "rail-only",
        8,
        4,
        pods=2,
        servers_per_pod=6,
        gpus_per_server=2,
        nic_ports=1,
        oversubscription={"tor": 4},
    ),
]


@pytest.fixture(params=SMALL, ids=[f"{s.kind}-{i}" for i, s in enumerate(SMALL)])
def small(request: pytest.FixtureRequest) -> FabricSpec:
    spec: FabricSpec = request.param
    return spec


def test_counts_agree_with_the_generator(small: FabricSpec) -> None:
    fabric = build_fabric(small)
    p = plan(small)
    assert p.gpus == len(fabric.gpus)
    assert p.servers == len(fabric.servers)
    assert p.switches == dict(Counter(s.tier for s in fabric.switches.values()))
    assert p.links == dict(Counter(link.kind for link in fabric.links))


def test_hops_and_bisection_agree_with_the_properties(small: FabricSpec) -> None:
    assert uniform_uplinks(small)
    props = fabric_properties(build_fabric(small))
    p = plan(small)
    assert p.max_hops == props.max_hops
    measured = {cut.name: cut.capacity for cut in props.bisection.cuts}
    assert p.cuts, "every small spec has at least one aligned cut"
    for name, capacity in p.cuts.items():
        if name in measured:  # properties reports identical partitions once
            assert capacity == pytest.approx(measured[name]), name
    if set(p.cuts) == set(measured):
        assert p.bisection == pytest.approx(props.bisection.capacity)


def test_non_uniform_core_is_only_an_upper_bound() -> None:
    """Astral with 2 cores per group but 3 uplinks per agg: the rails cut is narrower than
    the closed form, which the planner says through uniform_uplinks()."""
    spec = _spec("astral", 6, 3, pods=2, gpus_per_server=2, nic_ports=1)
    assert not uniform_uplinks(spec)
    measured = {c.name: c.capacity for c in fabric_properties(build_fabric(spec)).bisection.cuts}
    planned = plan(spec).cuts
    assert measured["rails"] < planned["rails"]
    assert all(measured[name] <= planned[name] * (1 + 1e-9) for name in planned)
