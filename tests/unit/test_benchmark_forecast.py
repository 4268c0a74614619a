"""The pure part of benchmarks/forecast.py: the summary keeps each collective's errors apart."""

from __future__ import annotations

import math
from typing import Any

from tests.helpers import load_benchmark
from topologies.spec import NAME_PATTERN


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


def test_ecmps_band_is_judged_on_the_hash_draws_and_the_runs_planned_forecast_apart() -> None:
    """A run forecasts its cells with the source ports it planned, which on a GPU with two
    NIC ports decide ECMP's paths (one draw). The band's target is about forecasting the
    hash without the run: its ecmp cells are the draws' forecast, the run's own kept
    beside them and reported on a line of its own; deterministic cells stay the run's."""
    bench = load_benchmark("forecast")

    def full(policy: str, size: int, error: float, draws: int, inside: bool) -> dict[str, Any]:
        return cell(policy, "all-reduce (ring)", error) | {
            "size": size, "draws": draws, "inside": inside,
        }  # fmt: skip

    stored = [full("path-pinned", 1, 0.02, 1, True), full("ecmp", 1, 0.01, 1, True)]
    drawn = [full("path-pinned", 1, 0.30, 1, False), full("ecmp", 1, -0.20, 8, False)]
    cells = bench.with_hash_draws(stored, drawn)
    assert cells == [stored[0], drawn[1], stored[1] | {"planned": True}]
    lines = bench.report(cells, "f")
    assert "# f: ecmp, 1 cells: measured inside p10-p90 in 0 (0%; target 80 %)" in lines[-2]
    assert lines[-1] == (
        "# f: ecmp with the run's planned ports (the run's own forecast), 1 cells: "
        "median |error| 1.0%, max 1.0%"
    )
    # a run that drew as many (one NIC port: nothing planned decides more) adds nothing
    assert bench.with_hash_draws([full("ecmp", 1, 0.01, 8, True)], drawn) == [drawn[1]]


def test_a_long_fabric_file_name_still_makes_a_valid_experiment_name() -> None:
    """The benchmark names its experiment after the fabric; a fabric file's name may be
    longer than an experiment's 32 characters (one was refused as ``forecast-`` + it)."""
    bench = load_benchmark("forecast")
    for fabric in ("astral-small", "astral-1pod-4x2-nic2-r8-tor2", "x" * 40 + "-y"):
        name = bench.experiment_name(fabric)
        assert NAME_PATTERN.match(name), name
    assert bench.experiment_name("astral-small") == "fc-astral-small"


def test_unmeasured_cells_are_left_out_of_the_statistics_and_counted_apart() -> None:
    """A cell whose run failed or hung before a timed iteration has no busbw (nan), so no
    error (nan) and no place in a band: it must not enter a median, a max or the band's
    share (a nan there makes the figure nan, or silently wrong once sorted), and it must
    not vanish either: the summary counts and names it."""
    bench = load_benchmark("forecast")
    nan = float("nan")

    def full(policy: str, size: int, error: float, inside: bool = True) -> dict[str, Any]:
        measured = nan if math.isnan(error) else 40.0
        return cell(policy, "all-reduce (ring)", error) | {
            "fabric": "f", "size": size, "measured": measured, "forecast": 41.0,
            "p10": 39.0, "p90": 43.0, "draws": 8 if policy == "ecmp" else 1,
            "inside": inside, "saturated": False, "unmeasured": math.isnan(measured),
        }  # fmt: skip

    cells = [
        full("path-pinned", 1, 0.01),
        full("shortest", 1, -0.03),
        full("path-pinned", 4, nan, inside=False),  # its workers hung: not measured
        full("ecmp", 1, 0.02),
        full("ecmp", 4, nan, inside=False),
    ]
    lines = bench.report(cells, "f")
    assert lines[0] == (
        "# f: deterministic paths, 2 cells: median |error| 2.0%, max 3.0% (targets 3 %, 8 %)"
    )
    assert lines[1].startswith("# f: all-reduce (ring), 2 deterministic cells: median |error| 2.0%")
    assert lines[2].startswith("# f: ecmp, 1 cells: measured inside p10-p90 in 1 (100%;")
    assert lines[-1] == (
        "# f: 2 cells unmeasured (no busbw: left out of the figures above): "
        "f path-pinned all-reduce (ring) 4, f ecmp all-reduce (ring) 4"
    )
    assert not any("nan" in line for line in lines)
    # nothing measured at all: no statistics, no crash, every cell counted unmeasured
    assert bench.report([cells[2], cells[4]], "f") == [lines[-1]]
    # the per-cell line says so instead of printing nan and OUT
    line = bench.cell_line(cells[4])
    assert "nan" not in line and "OUT" not in line and line.endswith("UNMEASURED")
