"""The pure parts of benchmarks/policies.py: the permutation, the ideal, the expectation."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.helpers import load_benchmark, preset_fabric
from topologies.model import Fabric


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
