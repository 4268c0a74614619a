"""One training iteration compiled into the workers' program (orchestrator/workload/
iteration.py) and forecast from it (orchestrator/forecast/program.py), without emulation:
the shipped presets compose on 8 ranks and every rank's sub-collectives verify when the
plans are run in memory; the 1F1B order and the placement are Megatron-LM's; the forecast
plays the same slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import (
    Compute,
    GroupCollective,
    PointToPoint,
    compose_all,
    expected,
)
from orchestrator.forecast.program import ProgramForecaster
from orchestrator.workload import costs
from orchestrator.workload.iteration import (
    BACKWARD,
    FORWARD,
    Pass,
    Placement,
    iteration_program,
    schedule,
)
from orchestrator.workload.spec import load_workload
from orchestrator.workload.timeline import kind_of
from tests.helpers import REPO, preset_description
from tests.unit.simulation import simulate

SCALE = 0.6e-4
PRESETS = sorted((REPO / "workloads").glob("*.yaml"))
LAYOUT = Layout.regular(8, 2)


def preset(path: Path):  # type: ignore[no-untyped-def]
    return load_workload(path, gpus=8, gpus_per_server=2)


def test_1f1b_runs_warmup_forwards_then_alternates_then_drains() -> None:
    order = schedule(pp=2, micro_batches=3)
    stage0 = [(p.kind[0], p.micro_batch) for p in order if p.stage == 0]
    stage1 = [(p.kind[0], p.micro_batch) for p in order if p.stage == 1]
    assert stage0 == [("f", 0), ("f", 1), ("b", 0), ("f", 2), ("b", 1), ("b", 2)]
    assert stage1 == [("f", 0), ("b", 0), ("f", 1), ("b", 1), ("f", 2), ("b", 2)]
    # every pass comes after what it consumes
    seen: set[Pass] = set()
    for p in order:
        if p.kind == FORWARD and p.stage > 0:
            assert Pass(FORWARD, p.stage - 1, p.micro_batch) in seen
        if p.kind == BACKWARD:
            assert Pass(FORWARD, p.stage, p.micro_batch) in seen
            if p.stage < 1:
                assert Pass(BACKWARD, p.stage + 1, p.micro_batch) in seen
        seen.add(p)


def test_placement_keeps_tensor_parallelism_in_a_server_and_data_parallelism_on_a_rail() -> None:
    at = Placement(tp=2, pp=2, dp=2, ep=2)
    for stage in range(2):
        for group in at.tp_groups(stage):
            assert len({LAYOUT.servers[r] for r in group}) == 1
        for group in at.dp_groups(stage) + at.ep_groups(stage):
            assert len({LAYOUT.local_ranks[r] for r in group}) == 1
            assert len({LAYOUT.servers[r] for r in group}) == len(group)
    assert sorted(r for s in range(2) for r in at.stage_ranks(s)) == list(range(8))


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_a_presets_iteration_composes_and_verifies_in_memory(path: Path) -> None:
    spec = preset(path)
    program = iteration_program(spec, SCALE)
    plans = compose_all(program, LAYOUT)
    results = [expected(program, LAYOUT, rank) for rank in range(8)]
    assert simulate(plans, results=results) == [0] * 8
    ops = [op for slot in program.slots for op in slot.ops]
    kinds = {kind_of(op.name) for op in ops if isinstance(op, GroupCollective)}
    kinds |= {"pp"} if any(isinstance(op, PointToPoint) for op in ops) else set()
    assert {"tp", "pp", "dp"} <= kinds
    assert ("ep" in kinds) == spec.model.moe
    # every rank computes its stage's FLOPs of an iteration, stretched by 1 / scale
    for rank in range(8):
        stage = rank // 4
        seconds = sum(op.of(rank) for op in ops if isinstance(op, Compute))
        flops = costs.stage_flops(spec, stage)
        assert seconds == pytest.approx(costs.compute_seconds(spec, flops) / SCALE, rel=1e-6)


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_the_forecast_plays_the_same_slots(path: Path) -> None:
    spec = preset(path)
    program = iteration_program(spec, SCALE)
    description = preset_description("astral-small")
    gpus = [g.name for g in description.fabric.gpus_by_rank()]
    predicted = ProgramForecaster(description, gpus, policy="path-pinned").forecast(program)
    compute = max(predicted.compute)
    assert predicted.seconds >= compute > 0  # no iteration beats its compute
    last = predicted.exposed[predicted.last_rank]
    assert set(last) >= {"tp", "ep", "pp", "dp"}
    # what is not compute on the rank that ends last is waiting or exposed communication
    assert sum(last.values()) <= predicted.seconds - predicted.compute[predicted.last_rank] + 1e-9


def test_a_program_of_one_collective_takes_the_collectives_forecast() -> None:
    """The program is one operation: its ops pay the operation latency and overhead once,
    before the first slot, so a program of one collective is forecast as that collective."""
    from orchestrator.collectives.program import Program, Slot
    from orchestrator.forecast.calibration import ForecastCalibration
    from orchestrator.forecast.model import ConfigurationModel
    from orchestrator.worker.spec import workers_from_description

    description = preset_description("astral-small")
    gpus = [g.name for g in description.fabric.gpus_by_rank()]
    calibration = ForecastCalibration(operation_overhead_s=0.003)
    ring = GroupCollective("all-reduce", "ring", tuple(range(8)), 1 << 18, "dp all")
    program = Program("one", (Slot((ring,)),))
    forecaster = ProgramForecaster(description, gpus, policy="path-pinned", calibration=calibration)
    alone = ConfigurationModel(
        description,
        workers_from_description(description, gpus),
        calibration,
        channels=description.fabric.spec.nic_ports,
    ).forecast("path-pinned", "all-reduce", "ring", 4 << 18)
    assert forecaster.forecast(program).seconds == pytest.approx(alone.time_us / 1e6, rel=1e-9)
    assert forecaster.entry() > 0.003  # the operation latency and the overhead, once


def test_astral_forecast_of_a_workload_prints_the_iteration_and_a_what_if(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from orchestrator.cli import main

    path = str(REPO / "workloads" / "gpt3-like.yaml")
    assert main(["forecast", path, "--json", "--set", "speeds.nic=800G"]) == 0
    out = json.loads(capsys.readouterr().out)
    base, faster = out["iteration"], out["variant"]["iteration"]
    assert base["fabric"] == "astral-small" and base["policy"] == "path-pinned"
    assert base["iteration_s"] >= base["compute_floor_s"] > 0
    assert 0 < base["mfu"] < 1
    assert faster["iteration_s"] < base["iteration_s"]  # a faster NIC: a shorter iteration
    assert faster["compute_floor_s"] == base["compute_floor_s"]
    assert main(["forecast", path, "--set", "iterations=3"]) == 2
    assert "a fabric key" in capsys.readouterr().err
    assert main(["forecast", path, "--fail", "p0r0a0-c0", "--policy", "ecmp"]) == 0
    text = capsys.readouterr().out
    assert "policy ecmp" in text and "fail p0r0a0-c0" in text and "variant / baseline" in text


def test_a_workload_what_if_that_cuts_a_gpu_off_is_a_clear_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Both NIC ports of a GPU down leave its connections no route: an error naming the
    failures (exit 2), not the forecast's RoutingError traceback."""
    from orchestrator.cli import main

    path = str(REPO / "workloads" / "gpt3-like.yaml")
    cut = ["--fail", "p0s0g0-p0r0t0", "--fail", "p0s0g0-p0r0t1"]
    assert main(["forecast", path, *cut]) == 2
    err = capsys.readouterr().err
    assert "--fail: key 'p0s0g0-p0r0t0, p0s0g0-p0r0t1'" in err and "without a route" in err
