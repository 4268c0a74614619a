"""The pure part of benchmarks/forecast.py: the summary keeps each collective's errors apart."""

from __future__ import annotations

from typing import Any

from tests.helpers import load_benchmark


def cell(policy: str, collective: str, error: float, paths: str | None = None) -> dict[str, Any]:
    return {"policy": policy, "collective": collective, "error": error, "paths": paths}


def test_each_collectives_deterministic_errors_are_reported_apart() -> None:
    bench = load_benchmark("forecast")
    cells = [
        cell("path-pinned", "all-reduce (ring)", 0.01),
        cell("shortest", "all-reduce (ring)", -0.03),
        cell("path-pinned", "all-to-all (direct)", 0.80),
        cell("shortest", "all-to-all (direct)", -0.05),
        cell("shortest", "all-to-all (direct)", 0.42),
        # hashed paths and recorded paths are judged by their own lines, not these
        cell("ecmp", "all-reduce (ring)", 0.50),
        cell("ecmp", "all-reduce (ring)", 0.50, paths="8/8"),
    ]
    assert bench.by_collective(cells, "f") == [
        "# f: all-reduce (ring), 2 deterministic cells: median |error| 2.0%, max 3.0%, "
        "within 8 % 2",
        "# f: all-to-all (direct), 3 deterministic cells: median |error| 42.0%, max 80.0%, "
        "within 8 % 1",
    ]
    assert bench.by_collective([cell("ecmp", "all-reduce (ring)", 0.1)], "f") == []
