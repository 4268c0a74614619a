"""A training iteration of a shipped workload replayed on a real emulated astral-small
(orchestrator/run/replay.py): every sub-collective of the iteration verifies, and no
iteration ends before its busiest rank's compute alone would (the compute is slept, not
skipped); the figures at real speed are physical (MFU below 1).

Correctness only: how long an iteration takes is the benchmark's business.
"""

from __future__ import annotations

import math

import pytest

from orchestrator.pytest_plugin import FabricFactory, FabricHandle
from orchestrator.run.replay import replay
from orchestrator.workload.spec import load_workload
from tests.helpers import REPO

pytestmark = pytest.mark.integration

# the mixture of experts: every kind of communication (tp, ep, pp, dp); the dense preset
# composes and verifies in memory (tests/unit/test_workload_iteration.py) and replays in
# benchmarks/workloads.py, and the suite stays short
WORKLOADS = [REPO / "workloads" / "deepseek-like.yaml"]


@pytest.fixture(scope="module")
def fabric(astral_fabric: FabricFactory) -> FabricHandle:
    return astral_fabric("astral-small", policy="path-pinned")


@pytest.mark.parametrize("path", WORKLOADS, ids=[p.stem for p in WORKLOADS])
def test_an_iteration_replays_verified_and_no_faster_than_its_compute(
    fabric: FabricHandle, path: object
) -> None:
    testbed = fabric.testbed
    spec = load_workload(path, gpus=len(testbed.workers(None)), gpus_per_server=2)
    result = replay(testbed, spec, warmup=0, iterations=1)
    assert result.wrong == 0
    floor = max(result.compute_s(rank) for rank in range(spec.gpus))
    assert floor > 0
    assert result.iteration_s >= floor
    assert 0 < result.mfu < 1 and math.isfinite(result.tokens_per_s)
