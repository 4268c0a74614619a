"""The pure parts of benchmarks/policies.py: the permutation, the ideal, the expectation."""

from __future__ import annotations

import random
from collections import Counter
from types import ModuleType

import pytest

from tests.helpers import load_benchmark, preset_fabric
from topologies.generators import build_fabric
from topologies.model import Fabric
from topologies.spec import parse_fabric_spec


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("policies")


@pytest.fixture(scope="module")
def fabric() -> Fabric:
    return preset_fabric("astral-small")


def test_the_permutation_crosses_pods_and_depends_on_the_seed(
    bench: ModuleType, fabric: Fabric
) -> None:
    pairs = bench.cross_pod_permutation(fabric, 1)
    gpus = [g.name for g in fabric.gpus_by_rank()]
    assert [s for s, _ in pairs] == gpus
    assert sorted(d for _, d in pairs) == sorted(gpus)
    assert all(fabric.gpus[s].pod != fabric.gpus[d].pod for s, d in pairs)
    assert pairs == bench.cross_pod_permutation(fabric, 1)
    assert any(bench.cross_pod_permutation(fabric, k) != pairs for k in range(2, 6))


def test_an_18_gpu_fabric_gets_a_cross_pod_permutation_for_every_seed(bench: ModuleType) -> None:
    # two pods of 9 GPUs: 1 random permutation in 48620 crosses pods, which is where
    # rejection sampling (10000 tries) gave up in a benchmark's second repeat
    fabric = build_fabric(
        parse_fabric_spec(
            {"name": "t18", "kind": "astral", "pods": 2, "servers_per_pod": 3,
             "gpus_per_server": 3, "nic_ports": 2, "switch": {"radix": 6, "down_ports": 3}}
        )
    )  # fmt: skip
    assert Counter(g.pod for g in fabric.gpus.values()) == {0: 9, 1: 9}
    for seed in range(200):
        pairs = bench.cross_pod_permutation(fabric, seed)
        assert sorted(d for _, d in pairs) == sorted(fabric.gpus)
        assert all(fabric.gpus[s].pod != fabric.gpus[d].pod for s, d in pairs)


def random_layout(rng: random.Random) -> list[int]:
    """Group labels for 1 to 40 members in 1 to 7 groups of random sizes, shuffled."""
    sizes = [rng.randint(1, 12) for _ in range(rng.randint(1, 7))]
    labels = [g for g, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(labels)
    return labels


def test_the_derangement_always_crosses_groups_when_it_can(bench: ModuleType) -> None:
    rng = random.Random(2024)
    possible = impossible = 0
    for _ in range(2000):
        groups = random_layout(rng)
        n, largest = len(groups), max(Counter(groups).values())
        seed = rng.randrange(1 << 30)
        if 2 * largest > n:
            impossible += 1
            with pytest.raises(ValueError, match=f"holds {largest} of the {n} GPUs"):
                bench.cross_group_derangement(groups, random.Random(seed))
            continue
        possible += 1
        targets = bench.cross_group_derangement(groups, random.Random(seed))
        assert sorted(targets) == list(range(n)), groups
        assert all(groups[i] != groups[t] for i, t in enumerate(targets)), groups
        assert targets == bench.cross_group_derangement(groups, random.Random(seed))
    assert possible > 500 and impossible > 100  # both branches really ran


def test_the_derangement_is_not_always_the_same_rotation(bench: ModuleType) -> None:
    groups = [0] * 4 + [1] * 4 + [2] * 4
    seen = {tuple(bench.cross_group_derangement(groups, random.Random(k))) for k in range(50)}
    assert len(seen) > 40
    # every member reaches every member of the other groups over the seeds
    for i in range(len(groups)):
        reached = {targets[i] for targets in seen}
        assert reached == {j for j in range(len(groups)) if groups[j] != groups[i]}


def test_exactly_half_in_one_pod_is_possible_more_is_an_error(bench: ModuleType) -> None:
    half = [0, 0, 0, 1, 2, 3]
    targets = bench.cross_group_derangement(half, random.Random(1))
    assert all(half[t] != 0 for i, t in enumerate(targets) if half[i] == 0)
    with pytest.raises(ValueError, match="pod 0 holds 4 of the 7 GPUs, more than half"):
        bench.cross_group_derangement([0, 0, 0, 0, 1, 2, 3], random.Random(1))
    with pytest.raises(ValueError, match="more than half"):
        bench.cross_group_derangement([5], random.Random(1))
    assert bench.cross_group_derangement([], random.Random(1)) == []


def test_ideal_is_the_nic_rate_on_a_non_blocking_fabric(bench: ModuleType, fabric: Fabric) -> None:
    pairs = bench.cross_pod_permutation(fabric, 3)
    nic = fabric.spec.emulation.emulated(fabric.spec.speeds.nic)
    assert bench.ideal_flow_bps(fabric, pairs) == pytest.approx(nic * 1460 / 1514)


def test_random_hashing_expectation(bench: ModuleType) -> None:
    assert bench.hashing_expectation(1) == 1.0
    assert bench.hashing_expectation(4) == pytest.approx(1 - 0.75**4)
    assert bench.hashing_expectation(1000) == pytest.approx(1 - 1 / 2.718281828, abs=1e-3)


def test_ideal_with_several_flows_per_gpu_shares_its_nic_ports(
    bench: ModuleType, fabric: Fabric
) -> None:
    pairs = bench.cross_pod_permutation(fabric, 1)
    nic = fabric.spec.emulation.emulated(fabric.spec.speeds.nic)
    four = [pair for pair in pairs for _ in range(4)]
    # 4 flows on 2 ports of 20M: 10M each; the pods' core uplinks allow as much (1:1)
    assert bench.ideal_flow_bps(fabric, four) == pytest.approx(nic / 2 * 1460 / 1514)
