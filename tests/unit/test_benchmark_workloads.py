"""The pure part of benchmarks/workloads.py: each policy's effect on the iteration time."""

from __future__ import annotations

from tests.helpers import load_benchmark


def test_a_policys_effect_is_its_iteration_over_the_first_policys_replayed_and_forecast() -> None:
    bench = load_benchmark("workloads")
    cells = {
        ("moe", "path-pinned", False): (30.0, 29.0),
        ("moe", "ecmp", False): (31.5, 30.45),
        ("moe", "path-pinned", True): (36.0, 35.0),
        ("moe", "ecmp", True): (36.0, 42.0),
    }
    lines = bench.policy_effects(cells, ["path-pinned", "ecmp"])
    assert lines == [
        "# policy effect, moe (healthy): ecmp / path-pinned iteration time 1.050x replayed, "
        "1.050x forecast",
        "# policy effect, moe (link down): ecmp / path-pinned iteration time 1.000x replayed, "
        "1.200x forecast",
    ]
    # one policy: nothing to compare
    assert bench.policy_effects({("moe", "ecmp", False): (1.0, 1.0)}, ["ecmp"]) == []
