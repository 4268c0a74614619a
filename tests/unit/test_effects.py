"""A policy comparison split into the switch policy's and the host ports' effects
(orchestrator/results/effects.py), and the policy benchmark's summary built on it."""

from __future__ import annotations

import math
from types import ModuleType, SimpleNamespace

import pytest

from orchestrator.results.effects import (
    baseline_of,
    host_port_effect,
    ratio,
    split_gap,
    switch_policy_effect,
)
from tests.helpers import load_benchmark

# achieved/ideal of four arms: the hash costs ecmp 0.8 and path-pinned 0.75 of balanced
VALUES = {
    ("ecmp", "hash"): 0.48,
    ("ecmp", "balanced"): 0.60,
    ("path-pinned", "hash"): 0.72,
    ("path-pinned", "balanced"): 0.96,
}


def test_each_effect_holds_the_other_cause_still() -> None:
    assert host_port_effect(VALUES, "ecmp") == pytest.approx(0.60 / 0.48)
    assert host_port_effect(VALUES, "path-pinned") == pytest.approx(0.96 / 0.72)
    assert switch_policy_effect(VALUES, "path-pinned", "balanced", "ecmp") == pytest.approx(1.6)
    assert switch_policy_effect(VALUES, "path-pinned", "hash", "ecmp") == pytest.approx(1.5)


def test_the_old_gap_is_the_product_of_the_two() -> None:
    gap = split_gap(VALUES, "path-pinned", "ecmp")
    assert gap.total == pytest.approx(0.96 / 0.48)
    assert gap.total == pytest.approx(gap.host_ports_first * gap.switch_policy_then)
    assert gap.total == pytest.approx(gap.switch_policy_first * gap.host_ports_then)
    assert gap.describe() == (
        "ecmp/hash -> path-pinned/balanced: x2.00 = host ports x1.25 (ecmp) x switch policy "
        "x1.60 (balanced) = switch policy x1.50 (hash) x host ports x1.33 (path-pinned)"
    )


def test_missing_arms_and_zeros_give_nan_not_errors() -> None:
    only_hash = {k: v for k, v in VALUES.items() if k[1] == "hash"}
    assert math.isnan(host_port_effect(only_hash, "ecmp"))
    assert math.isnan(switch_policy_effect(VALUES, "adaptive", "hash", "ecmp"))
    assert math.isnan(ratio(1.0, 0.0)) and math.isnan(ratio(math.nan, 1.0))
    assert math.isnan(split_gap(only_hash, "path-pinned", "ecmp").total)


def test_the_baseline_is_the_wanted_policy_if_measured() -> None:
    assert baseline_of(["path-pinned", "ecmp"], "ecmp") == "ecmp"
    assert baseline_of(["path-pinned", "adaptive"], "ecmp") == "path-pinned"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("policies")


def test_the_policy_benchmark_reports_both_effects_side_by_side(bench: ModuleType) -> None:
    runs = []
    for (policy, ports), value in VALUES.items():
        for repeat, wobble in enumerate((-0.02, 0.02)):  # two repeats around the value
            result = SimpleNamespace(aggregate_bps=(value + wobble) * 8 * 10e6, flows=[None] * 8)
            runs.append(bench.PolicyRun(policy, ports, repeat, result, 10e6, 16, 32, 0.0))
    means = bench.means(runs)
    assert means == pytest.approx(VALUES)
    lines = bench.summary(runs, ["ecmp", "path-pinned"], ["hash", "balanced"], "ecmp")
    assert lines[0] == "  mean achieved/ideal over 2 repeat(s)"
    assert lines[1].split() == ["hash", "balanced", "balanced/hash"]
    assert lines[2].split() == ["ecmp", "0.48", "0.60", "1.25"]
    assert lines[3].split() == ["path-pinned", "0.72", "0.96", "1.33"]
    assert "switch-policy effect" in lines[4] and lines[5].split() == [
        "path-pinned",
        "1.50",
        "1.60",
    ]
    assert lines[-1].strip() == split_gap(VALUES, "path-pinned", "ecmp").describe()
    expected = bench.expectations(runs)
    assert "  path-pinned/balanced >= 0.9 of ideal: yes" in expected
    assert "  ecmp/hash about 0.6 of ideal (random hashing): 0.48" in expected


def test_the_collectives_benchmark_reports_both_effects_per_collective() -> None:
    module = load_benchmark("collectives")
    medians = {
        (arm, op, alg): value for arm, value in VALUES.items() for op, alg, _ in module.ALGORITHMS
    }
    lines = module.effect_lines(medians, ["path-pinned", "ecmp"], ["hash", "balanced"], "ecmp")
    ring = next(line for line in lines if "all-reduce (ring)" in line)
    assert "host ports ecmp 1.25" in ring and "host ports path-pinned 1.33" in ring
    assert "switch policy path-pinned/ecmp hash 1.50" in ring
    assert "switch policy path-pinned/ecmp balanced 1.60" in ring
    assert sum("x2.00 = host ports x1.25 (ecmp)" in line for line in lines) == len(
        module.ALGORITHMS
    )
