"""A training iteration of a shipped workload replayed by ``astral run`` (an experiment with
``workload:``) on a real emulated astral-small, with a fault on a link the iteration uses:
every sub-collective of the iteration verifies, no iteration ends before its busiest rank's
compute alone would (the compute is slept, not skipped), the figures at real speed are
physical (MFU below 1), the bundle keeps the timeline per rank and slot beside the
forecast's, and the fault was applied and undone while the iteration ran.

Correctness only: how long an iteration takes, and how close the forecast comes, is the
benchmark's business (benchmarks/workloads.py).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import yaml

from orchestrator.collectives.program import PROGRAM
from orchestrator.pytest_plugin import FabricFactory
from orchestrator.results import ResultsBundle
from orchestrator.run.experiment import parse_experiment
from orchestrator.run.runner import RunOptions
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.timeline import KINDS
from tests.helpers import REPO

pytestmark = pytest.mark.integration

# the mixture of experts: every kind of communication (tp, ep, pp, dp); the dense preset
# composes and verifies in memory (tests/unit/test_workload_iteration.py) and replays in
# benchmarks/workloads.py, and the suite stays short. The shipped file, inline, with a
# quarter of its sequence: the same layout and kinds of traffic, a quarter of the
# all-to-all bytes and under a quarter of the compute (the iteration took ~70 s of the
# suite at 4096; the shipped file at full length replays in benchmarks/workloads.py)
SHIPPED = yaml.safe_load((REPO / "workloads" / "deepseek-like.yaml").read_text())
SHORTER = {**SHIPPED, "model": {**SHIPPED["model"], "seq_len": 1024}}
EXPERIMENT = {
    "name": "it-workload",
    "fabric": "astral-small",
    "policies": ["path-pinned"],
    "workload": SHORTER,
    "iterations": 1,
    "warmup": 0,
    # rank 0's NIC port 1 at a quarter of its rate, from the timed iteration's start
    "faults": [{"kind": "link-slow", "target": "p0s0g0-p0r0t0", "rate": 0.25, "at": "0s"}],
}


def test_an_iteration_replays_verified_timed_and_faulted_into_the_bundle(
    astral_fabric: FabricFactory, tmp_path: Path
) -> None:
    fabric = astral_fabric("astral-small", policy="path-pinned")
    spec = parse_experiment(EXPERIMENT, "test_workload_replay.py", REPO)
    out, bundle_dir = io.StringIO(), tmp_path / "bundle"
    outcome = fabric.run_experiment(spec, RunOptions(out=bundle_dir, plots=True), out=out)
    assert outcome.status == "ok", outcome.error
    printed = out.getvalue()
    assert "workload 'deepseek-like'" in printed and "path-pinned" in printed

    document = json.loads((bundle_dir / "workload.json").read_text())
    assert document["workload"] == "deepseek-like" and len(document["gpus"]) == 8
    record = document["policies"]["path-pinned"]
    assert record["wrong"] == 0 and record["iterations"] == 1
    assert record["floor_s"] > 0 and record["iteration_s"] >= record["floor_s"]
    assert 0 < record["mfu"] < 1 and math.isfinite(record["tokens_per_s"])
    assert set(record["exposed_s"]) == set(KINDS)
    assert sum(record["exposed_s"].values()) <= record["iteration_s"]
    measured, forecast = record["timeline"], record["forecast"]["timeline"]
    assert sorted(measured, key=int) == sorted(forecast, key=int) == [str(r) for r in range(8)]
    program = iteration_program(spec.workload, fabric.testbed.scale)
    for rank, spans in measured.items():
        # the slots the rank computes or communicates in, in order, in both timelines
        assert [s[0] for s in spans] == [s[0] for s in forecast[rank]]
        assert [s[0] for s in spans] == sorted({s[0] for s in spans})
        # each span's compute is kept to the microsecond
        compute = program.compute_of(int(rank))
        assert sum(s[3] for s in spans) == pytest.approx(compute, abs=1e-6 * len(spans))
        assert all(0 <= start <= end for _, start, end, _, _ in spans)
    assert max(s[2] for spans in record["timeline"].values() for s in spans) <= (
        record["iteration_s"] + 0.5
    )
    assert record["forecast"]["iteration_s"] > 0
    assert (bundle_dir / "plots" / "workload-path-pinned.png").stat().st_size > 0

    with ResultsBundle.open(bundle_dir) as bundle:
        (configuration,) = bundle.configurations()
        assert configuration.collective == PROGRAM
        assert bundle.iterations(configuration.id)  # the monitor's layers, as any launch's
        (fault,) = bundle.faults()
    assert fault.kind == "link-slow" and fault.applied is not None and fault.undone is not None
    assert fault.error is None
