"""Mistakes an outside tester found in how results are reported and forecasts are judged.

- a configuration whose workers hung before a timed iteration read as verified, with
  ``nan`` figures, ``0 OK`` and a forecast error of ``+nan%``;
- the report's fault section printed epoch seconds as offsets from a first operation the
  run never had;
- a forecast of many short operations (latency off) came out above its busbw ceiling by
  far more than the shapers' buckets can add, and a figure equal to the ceiling but for
  float rounding was marked above it.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.collectives.ceilings import Ceiling
from orchestrator.collectives.nccl import count_column
from orchestrator.monitor.faultreport import fault_section
from orchestrator.results.compare import compare_forecasts
from orchestrator.results.report import render_bundle
from orchestrator.results.store import (
    ForecastRecord,
    InjectedFault,
    ResultsBundle,
    ResultsWriter,
    Versions,
)
from tests.helpers import preset_description

T0 = 1_796_601_000.0
RANKS = 8


def failed_bundle(path: Path) -> Path:
    """A run whose one configuration never finished a timed iteration (its workers hung),
    with a ceiling, a forecast and a fault applied while it hung."""
    versions = Versions(python="3.11.2", mininet="2.3.0", os_ken="4.2.2", ovs="3.1.0")
    with ResultsWriter(path, preset_description("astral-small")) as results:
        results.add_run(experiment="hung", host="h", versions=versions, started=T0)
        config = results.add_configuration(
            policy="path-pinned", collective="all-reduce", algorithm="ring", size=262144,
            count=count_column("all-reduce", 262144, "uint32", RANKS), dtype="uint32",
            ranks=RANKS, iterations=2, warmup=0, host_ports="balanced",
        )  # fmt: skip
        results.add_ceiling(config, Ceiling(rail=0.0025, fabric_share=1.0, burst_s=0.01))
        results.add_forecast(
            config, ForecastRecord(2.6e6, 2.6e6, 2.6e6, 1.7e-4, 1.7e-4, 1.7e-4, 1, False)
        )
        results.add_faults(
            [InjectedFault(1, "switch-down", "p0s0nv", {"at": "0s"}, T0 + 0.5, T0 + 0.52, T0 + 30)]
        )
        results.finish(status="failed", finished=T0 + 40)
    return path


def test_a_configuration_without_a_timed_iteration_reads_as_not_measured(
    tmp_path: Path,
) -> None:
    path = failed_bundle(tmp_path / "hung")
    render_bundle(path, plots=False)
    record = json.loads((path / "summary.json").read_text())["configurations"][0]
    assert (record["verified"], record["wrong"], record["time_us"]) == (False, None, None)
    assert record["not_measured"] and "no timed iteration" in record["not_measured"]
    assert record["marks"] == ["NOT MEASURED"]
    assert record["forecast"]["busbw_error"] is None
    table = (path / "tables" / "path-pinned__all-reduce-ring.txt").read_text()
    row = next(line for line in table.splitlines() if not line.startswith("#"))
    assert "NOT MEASURED" in row and " N/A " in row
    assert "nan%" not in table
    assert "# Out of bounds values : not verified" in table
    assert "0 OK" not in table
    assert "ABOVE CEILING =" not in table  # no legend for marks the table does not show
    with (path / "tables" / "path-pinned__all-reduce-ring.csv").open() as source:
        assert [row["wrong"] for row in csv.DictReader(source)] == [""]
    with ResultsBundle.open(path) as bundle:
        text = compare_forecasts(bundle).text
    assert "nan%" not in text
    assert "median" not in text  # no measured cell: no median
    assert "1 of 1 cells with a forecast not measured" in text


def test_the_fault_section_of_a_run_without_operations_counts_from_its_start(
    tmp_path: Path,
) -> None:
    path = failed_bundle(tmp_path / "hung")
    with ResultsBundle.open(path) as bundle:
        lines = fault_section(bundle)
    assert "times from the run's start: no operation was recorded" in lines[0]
    assert "scheduled +0.500 s, applied +0.520 s" in lines[2]
    assert "+29.500 s" not in lines[2] and "undone +30.000 s" in lines[2]
    assert not any("+17966" in line for line in lines)


def test_a_figure_equal_to_the_ceiling_or_within_the_buckets_is_not_above_it() -> None:
    ceiling = Ceiling(rail=0.005, fabric_share=1.0, burst_s=0.01)
    top = ceiling.busbw
    assert ceiling.marks(top * (1 + 4e-16), 70.0) == []  # float rounding: equal
    # a 2.5 s batch: one 10 ms bucket adds at most 0.4 %, named, not a fault
    assert ceiling.marks(top * 1.004, 2.5) == ["bucket <= 0.4%"]
    assert ceiling.marks(top * 1.01, 2.5) == ["ABOVE CEILING x1.010"]
    assert ceiling.marks(top * 1.10, 2.5) == ["ABOVE CEILING x1.100"]


def test_a_long_batch_of_short_operations_is_not_forecast_above_its_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """236 operations of a 64 KiB hierarchical all-reduce (latency off): the play-out
    plays 8 and counts the rest at the last one's time, which was still spending the
    bucket the batch began with; that came out at 1.10 times the ceiling. A batch can
    carry at most its links' rate plus one bucket."""
    import orchestrator.forecast.calibration as calibration

    monkeypatch.setattr(calibration, "load_forecast_calibration", lambda _path: None)
    experiment = tmp_path / "hier.yaml"
    experiment.write_text(
        "name: hier\nfabric: astral-small\npolicies: [path-pinned]\n"
        "collectives: [{op: all-reduce, algorithm: hierarchical}]\n"
        "sizes: {min: 64K, max: 64K}\niterations: 3\nwarmup: 3\nlatency: 'off'\n"
    )
    assert main(["forecast", str(experiment), "--json"]) == 0
    records = json.loads(capsys.readouterr().out)["configurations"]
    assert records
    for r in records:
        assert r["iterations"] > 8  # lengthened past the operations played
        batch_s = r["iterations"] * r["time_us"] / 1e6
        allowed = 1 + r["ceiling"]["burst_s"] / batch_s
        assert r["ceiling_share"] <= allowed * (1 + 1e-9), r
        assert not any(m.startswith("ABOVE") for m in r["marks"]), r


def test_compare_takes_the_median_error_over_measured_cells_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    """One cell measured (forecast 10 % high), one hung: the median is the measured one's
    and the other is counted as left out, not averaged in as nan."""
    from orchestrator.results.store import IterationRecord
    from orchestrator.results.summary import summarize

    path = tmp_path / "mixed"
    versions = Versions(python="3.11.2", mininet="2.3.0", os_ken="4.2.2", ovs="3.1.0")
    with ResultsWriter(path, preset_description("astral-small")) as results:
        results.add_run(experiment="mixed", host="h", versions=versions, started=T0)
        for size in (65536, 262144):
            config = results.add_configuration(
                policy="path-pinned", collective="all-reduce", algorithm="ring", size=size,
                count=count_column("all-reduce", size, "uint32", RANKS), dtype="uint32",
                ranks=RANKS, iterations=1, warmup=0, host_ports="balanced",
            )  # fmt: skip
            if size == 65536:
                results.add_iterations(
                    config, [IterationRecord(0, r, 1000.0, size, 0) for r in range(RANKS)]
                )
                busbw = 1.1 * size / 1e-3 / 1e9 * 2 * (RANKS - 1) / RANKS
            else:
                busbw = 1e-3
            results.add_forecast(config, ForecastRecord(1, 1, 1, busbw, busbw, busbw, 1, False))
        results.finish(status="failed", finished=T0 + 40)
    with ResultsBundle.open(path) as bundle:
        assert [r.measured for r in summarize(bundle)] == [True, False]
        text = compare_forecasts(bundle).text
    assert "# 1 cells: median |error| 10.0%, max 10.0%" in text
    assert "# 1 of 2 cells with a forecast not measured" in text
    assert "nan%" not in text
