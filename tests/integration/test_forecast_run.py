"""A short real run stores and prints the forecast beside every measurement.

Through the pytest plugin's fabric (a real emulated astral-small: Mininet, Open vSwitch,
the controller, the workers): one policy, one collective, two sizes. The runner forecasts
each configuration before it runs it (orchestrator/forecast); the test checks that the
printed table names the forecast and its error beside each measured row, that the bundle
keeps one forecast per configuration (the ``forecasts`` table, summary.json's ``forecast``)
and that ``astral compare --forecast`` reads them back. It does not judge the forecast's
accuracy: that is benchmarks/forecast.py's (docs/forecast.md).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.pytest_plugin import FabricFactory
from orchestrator.results.store import ResultsBundle
from orchestrator.run.experiment import parse_experiment
from orchestrator.run.runner import RunOptions
from tests.helpers import REPO

pytestmark = pytest.mark.integration

EXPERIMENT = {
    "name": "it-forecast",
    "fabric": "astral-small",
    "policies": ["path-pinned"],
    "collectives": [{"op": "all-reduce", "algorithm": "ring"}],
    "sizes": {"min": "256K", "max": "1M", "factor": 4},
    "iterations": 2,
    "warmup": 1,
}


def test_a_run_prints_and_stores_the_forecast_beside_each_measurement(
    astral_fabric: FabricFactory, tmp_path: Path
) -> None:
    fabric = astral_fabric("astral-small", policy="path-pinned")
    spec = parse_experiment(EXPERIMENT, "test_forecast_run.py", REPO)
    out = io.StringIO()
    bundle_dir = tmp_path / "bundle"
    outcome = fabric.run_experiment(spec, RunOptions(out=bundle_dir, plots=False), out=out)
    assert outcome.status == "ok", outcome.error
    rows = [line for line in out.getvalue().splitlines() if re.match(r"^\s+\d+\s", line)]
    assert len(rows) == 2
    for row in rows:
        assert re.search(r"forecast busbw \d+\.\d\d real \([+-]\d+\.\d%\)", row), row

    with ResultsBundle.open(bundle_dir) as bundle:
        configurations = bundle.configurations()
        forecasts = bundle.forecasts()
    assert {c.id for c in configurations} == set(forecasts)
    for forecast in forecasts.values():
        assert forecast.time_us > 0 and forecast.busbw > 0
        assert forecast.hash_draws == 1  # path-pinned: nothing left to a hash

    summary = json.loads((bundle_dir / "summary.json").read_text())
    for record in summary["configurations"]:
        assert record["forecast"]["busbw"] > 0
        measured = record["busbw_GBps"]
        error = (record["forecast"]["busbw"] - measured) / measured
        assert record["forecast"]["busbw_error"] == pytest.approx(error)

    compared = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "compare", str(bundle_dir), "--forecast"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert compared.returncode == 0, compared.stderr
    assert "2 cells: median |error|" in compared.stdout
