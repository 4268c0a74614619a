"""A workload's iteration by link class (orchestrator/forecast/fullsize.py): against the
flow-by-flow program forecast it aggregates where both run, the representative replicas
against the full layout's groups, and the full-size pod's forecast through the command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.collectives.program import GroupCollective
from orchestrator.commands.workload_forecast import forecast_iteration
from orchestrator.forecast.aggregate import ScaleModel
from orchestrator.forecast.fullsize import FullSizeForecaster, Reduction, kept_replicas
from orchestrator.forecast.model import FabricModel
from orchestrator.forecast.program import ProgramForecaster
from orchestrator.workload.iteration import Placement, iteration_program
from orchestrator.workload.spec import WorkloadSpec, load_workload, parse_workload
from tests.helpers import REPO
from topologies.description import FabricDescription
from topologies.errors import ConfigError
from topologies.fabricspec import FabricSpec
from topologies.generators import build_fabric
from topologies.plan import PlanInput
from topologies.planner import plan_spec

FULL_POD = REPO / "workloads" / "full-size" / "gpt3-175b.yaml"

#: tp 8 on a server, the rest data parallel: 8 replicas on a 64-GPU Astral of 2 ToR groups,
#: played as 2 (every data-parallel ring has pairs in one ToR group and pairs across two)
DENSE: dict[str, Any] = {
    "name": "dense-64",
    "model": {
        "layers": 8,
        "hidden": 1024,
        "heads": 8,
        "ffn_hidden": 4096,
        "seq_len": 2048,
        "vocab": 4096,
    },
    "parallel": {"tp": 8, "pp": 1, "dp": "auto"},
    "batch": {"micro_batch": 1, "global_batch": 16},
    "gpu": {"peak_flops": "989T", "efficiency": 0.45},
}


def by_flow_real(spec: FabricSpec, workload: WorkloadSpec, policy: str) -> float:
    """The flow-by-flow program forecast without calibration (the bare model) and without
    the emulator's token buckets (the full-size model has neither), real s."""
    fabric = build_fabric(spec)
    gpus = [g.name for g in fabric.gpus_by_rank()]
    description = FabricDescription.of(fabric)
    bare = FabricModel.of(description, buckets=False)
    forecaster = ProgramForecaster(description, gpus, policy=policy, fabric=bare)
    played = forecaster.forecast(iteration_program(workload, spec.emulation.scale))
    return played.seconds * spec.emulation.scale


def by_class_real(spec: FabricSpec, workload: WorkloadSpec, policy: str) -> float:
    return FullSizeForecaster(ScaleModel(spec), workload, policy=policy).forecast().played.seconds


@pytest.mark.parametrize("name", ["gpt3-like", "deepseek-like"])
def test_by_class_equals_flow_by_flow_on_the_emulated_fabric(name: str) -> None:
    """astral-small, path-pinned: every group's op by link class is its flow-by-flow time
    (the aggregated model's own agreement, docs/forecast.md), so the iterations agree to
    rounding; no replica is left out here (dp = 2 ep or dp 2)."""
    spec = plan_spec_of("astral-small")
    workload = load_workload(
        REPO / "workloads" / f"{name}.yaml", gpus=8, gpus_per_server=spec.gpus_per_server
    )
    assert by_class_real(spec, workload, "path-pinned") == pytest.approx(
        by_flow_real(spec, workload, "path-pinned"), rel=1e-6
    )


def test_representative_replicas_agree_with_every_replica_within_1_percent() -> None:
    """A 64-GPU Astral (one pod, 2 ToR groups of 4 servers), 8 replicas of tp 8 played as 2:
    the data-parallel rings by link class (7 of 8 pairs in a ToR group, 1 across) against
    every rank flow by flow. Measured +0.05 % (docs/workloads.md); held to 1 %."""
    spec = plan_spec("astral", PlanInput(radix=8, pods=1))
    workload = parse_workload(DENSE, gpus=64, gpus_per_server=8)
    assert (workload.parallel.dp, kept_replicas(workload)) == (8, 2)
    by_class = by_class_real(spec, workload, "path-pinned")
    assert by_class == pytest.approx(by_flow_real(spec, workload, "path-pinned"), rel=0.01)


def test_a_kept_group_stands_for_the_full_layouts_groups() -> None:
    """dp 16, ep 4: 8 replicas kept (two expert-parallel blocks); kept replica d stands for
    the full replicas with the same position in a block of the same parity."""
    document = {
        **DENSE,
        "model": {
            **DENSE["model"],
            "experts": 8,
            "top_k": 2,
            "expert_ffn_hidden": 256,
        },
        "parallel": {"tp": 2, "pp": 2, "dp": 16, "ep": 4},
        "batch": {"micro_batch": 1, "global_batch": 32},
    }
    workload = parse_workload(document)
    reduction = Reduction.of(workload)
    kept, full = reduction.kept, reduction.full
    assert (kept.dp, full.dp) == (8, 16)
    assert reduction.replicas(5).tolist() == [5, 13]  # block 1, position 1; and block 3
    tp = GroupCollective("all-reduce", "ring", tuple(kept.tp_groups(1)[5]), 8, "tp x")
    assert reduction.represented(tp).tolist() == [
        [full.rank(1, 5, t) for t in range(2)],
        [full.rank(1, 13, t) for t in range(2)],
    ]
    dp = GroupCollective("all-reduce", "ring", kept.dp_groups(0)[1], 16, "dp bucket 0")
    assert reduction.represented(dp).tolist() == [list(full.dp_groups(0)[1])]
    ep = GroupCollective("all-to-all", "direct", kept.ep_groups(0)[1], 16, "ep x")
    assert reduction.represented(ep).tolist() == [list(full.ep_groups(0)[i]) for i in (1, 3)]
    edp = GroupCollective("all-reduce", "ring", kept.expert_dp_groups(0)[2], 8, "expert dp 0")
    assert reduction.represented(edp).tolist() == [list(full.expert_dp_groups(0)[2])]
    pair = GroupCollective("p2p", "direct", (kept.rank(0, 3, 1), kept.rank(1, 3, 1)), 4, "pp f")
    assert reduction.represented(pair).tolist() == [
        [full.rank(0, d, 1), full.rank(1, d, 1)] for d in (3, 11)
    ]


def test_the_full_pod_is_forecast_by_representative_ranks() -> None:
    forecast = forecast_iteration(FULL_POD, None, "path-pinned", full_size=True)
    assert (forecast.gpus, forecast.ranks_played, forecast.by_class) == (65536, 128, True)
    assert forecast.shapes == {"dp": 1, "pp": 1, "tp": 1}  # the planned pod is symmetric
    assert forecast.seconds > forecast.floor > 0  # no iteration beats its compute
    assert 0 < forecast.mfu < 0.45  # below the GPU's assumed efficiency
    assert forecast.exposed["dp"] > 0 and forecast.exposed["pp"] > 0


def test_the_command_prints_the_full_size_forecast_at_real_speed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["forecast", str(FULL_POD), "--full-size", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["iteration"]
    assert out["emulation_scale"] is None and out["model"].startswith("link classes")
    assert out["iteration_real_ms"] == pytest.approx(out["iteration_s"] * 1e3)


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"settings": ["scale=1e-4"]}, "scale"),
        ({"failures": ["p0r0t0-p0r0a0"]}, "p0r0t0-p0r0a0"),
        ({"policy": "adaptive"}, "adaptive"),
        ({"pods": 2, "full_size": False}, "--pods"),
    ],
)
def test_what_the_full_size_forecast_refuses_is_named(options: dict[str, Any], key: str) -> None:
    kwargs: dict[str, Any] = {"policy": "path-pinned", "full_size": True, **options}
    with pytest.raises(ConfigError, match=key):
        forecast_iteration(FULL_POD, None, **kwargs)


def plan_spec_of(preset: str) -> FabricSpec:
    from topologies.catalog import resolve_fabric
    from topologies.spec import load_fabric_spec

    return load_fabric_spec(resolve_fabric(preset))


def test_placement_is_the_iterations() -> None:
    """The reduction decodes kept ranks with the iteration's own placement."""
    workload = load_workload(FULL_POD, gpus=65536, gpus_per_server=8)
    reduction = Reduction.of(workload)
    kept = reduction.kept
    assert kept == Placement(8, 8, 2, 1)
    for stage, d, t in [(0, 0, 0), (3, 1, 5), (7, 1, 7)]:
        assert reduction.where(kept.rank(stage, d, t)) == (stage, d, t)
    assert Path(FULL_POD).is_file()
