"""Training workloads: the description validated (every mistake one sentence naming the
key), the per-iteration quantities against hand-computed figures for a tiny model and
against published totals (GPT-3 175B, DeepSeek-V3, Megatron-LM's FLOPs formula), the two
presets, and ``astral workload show``."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.workload.costs import (
    Communication,
    backward_flops,
    compute_seconds,
    dp_gradient_bytes,
    ep_alltoall_bytes,
    forward_flops,
    logits_flops,
    model_flops_per_iteration,
    model_parameters,
    pp_bytes,
    stage_communication,
    stage_flops,
    stage_parameters,
    tp_allreduce_bytes,
)
from orchestrator.workload.spec import (
    DEFAULT_BUCKET,
    BatchSpec,
    GpuSpec,
    ModelSpec,
    ParallelSpec,
    WorkloadSpec,
    load_workload,
    parse_flops,
    parse_workload,
)
from tests.helpers import REPO
from topologies.errors import ConfigError, WorkloadError

PRESETS = sorted((REPO / "workloads").glob("*.yaml"))

#: A tiny dense model whose figures are easy to compute by hand.
DENSE: dict[str, Any] = {
    "name": "tiny",
    "model": {"layers": 4, "hidden": 8, "heads": 2, "ffn_hidden": 32, "seq_len": 4, "vocab": 16},
    "parallel": {"tp": 2, "pp": 2, "dp": 2},
    "batch": {"micro_batch": 1, "global_batch": 2},
    "gpu": {"peak_flops": "1T", "efficiency": 0.5},
}
#: The same with experts: 4 routed (2 per ep rank), top 2, 1 shared, the first layer dense.
MOE: dict[str, Any] = {
    **DENSE,
    "name": "tiny-moe",
    "model": {
        **DENSE["model"],
        "experts": 4,
        "top_k": 2,
        "expert_ffn_hidden": 4,
        "shared_experts": 1,
        "dense_layers": 1,
    },
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "ep": 2},
}


def with_(document: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """``document`` with the dotted key ``path`` set to ``value`` (deleted if None)."""
    out = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    else:
        node[last] = value
    return out


def spec_of(
    model: ModelSpec, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, **kw: Any
) -> WorkloadSpec:
    """A spec of ``model`` (one micro-batch of one sequence per dp rank by default)."""
    return WorkloadSpec(
        name="m",
        model=model,
        parallel=ParallelSpec(tp, pp, dp, ep),
        batch=kw.pop("batch", BatchSpec(1, dp)),
        gpu=GpuSpec(989e12, 0.5),
        **kw,
    )


GPT3 = ModelSpec(layers=96, hidden=12288, heads=96, ffn_hidden=49152, seq_len=2048, vocab=50257)
DEEPSEEK_V3 = ModelSpec(
    layers=61,
    hidden=7168,
    heads=128,
    ffn_hidden=18432,
    seq_len=4096,
    vocab=129280,
    experts=256,
    top_k=8,
    expert_ffn_hidden=2048,
    shared_experts=1,
    dense_layers=3,
    gated_mlp=True,
)


# --- the description ---------------------------------------------------------------------


def test_a_dense_workload_reads_with_its_defaults() -> None:
    spec = parse_workload(DENSE)
    assert spec.model == ModelSpec(4, 8, 2, 32, 4, 16)
    assert not spec.model.moe and not spec.model.is_moe_layer(3)
    assert spec.parallel == ParallelSpec(2, 2, 2, 1)
    assert spec.gpu == GpuSpec(1e12, 0.5)
    assert (spec.dtype_bytes, spec.bucket_bytes, spec.recompute) == (2, DEFAULT_BUCKET, False)
    assert DEFAULT_BUCKET == 25 * 2**20  # PyTorch DDP's bucket_cap_mb=25
    assert spec.gpus == 8
    assert spec.micro_batches == 1
    assert [spec.layers_of(s) for s in (0, 1)] == [range(0, 2), range(2, 4)]
    with pytest.raises(ValueError):
        spec.layers_of(2)


def test_an_moe_workload_knows_its_moe_layers() -> None:
    spec = parse_workload(MOE)
    assert spec.model.moe
    assert [spec.model.is_moe_layer(i) for i in range(4)] == [False, True, True, True]


def test_every_key_is_read() -> None:
    document = {
        **DENSE,
        "description": "d",
        "source": "s",
        "precision": "fp32",
        "bucket": "1M",
        "recompute": True,
        "gpu": {"peak_flops": 989e12, "efficiency": 1},
    }
    spec = parse_workload(document)
    assert (spec.description, spec.source) == ("d", "s")
    assert (spec.dtype_bytes, spec.bucket_bytes, spec.recompute) == (4, 2**20, True)
    assert spec.gpu.peak_flops == 989e12


@pytest.mark.parametrize(
    ("text", "flops"),
    [
        ("989T", 989e12),
        ("1.98P", 1.98e15),
        ("9.89e14", 9.89e14),
        (312e12, 312e12),
        ("5 GFLOPS", 5e9),
    ],
)
def test_flop_figures_read_with_si_prefixes(text: object, flops: float) -> None:
    assert parse_flops(text) == pytest.approx(flops)


@pytest.mark.parametrize("text", ["fast", "", True, 0, -1, "0T", None])
def test_a_wrong_flop_figure_is_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_flops(text)


def test_dp_auto_takes_the_gpus_left() -> None:
    document = with_(with_(DENSE, "parallel.dp", "auto"), "batch.global_batch", 8)
    spec = parse_workload(document, gpus=16, gpus_per_server=4)
    assert spec.parallel.dp == 4
    assert spec.gpus == 16


@pytest.mark.parametrize(
    ("document", "options", "key", "words"),
    [
        ({**DENSE, "extra": 1}, {}, "extra", "known keys"),
        (with_(DENSE, "model.depth", 3), {}, "model.depth", "known keys"),
        (with_(DENSE, "model.vocab", None), {}, "model.vocab", "present"),
        (with_(DENSE, "gpu", None), {}, "gpu", "present"),
        (with_(DENSE, "name", "Not A Name"), {}, "name", "lower-case"),
        (with_(DENSE, "source", 3), {}, "source", "a text"),
        (with_(DENSE, "model.layers", 0), {}, "model.layers", ">= 1"),
        (with_(DENSE, "model.hidden", 2.5), {}, "model.hidden", "integer"),
        (with_(DENSE, "model.hidden", 9), {}, "model.hidden", "multiple of model.heads"),
        (with_(DENSE, "parallel.tp", 4), {}, "parallel.tp", "divisor of model.heads"),
        (with_(DENSE, "parallel.pp", 3), {}, "parallel.pp", "divisor of model.layers"),
        (with_(DENSE, "parallel.ep", 2), {}, "parallel.ep", "dense model"),
        (with_(DENSE, "model.top_k", 2), {}, "model.top_k", "dense model"),
        (with_(MOE, "parallel.ep", 3), {}, "parallel.ep", "divisor of model.experts"),
        (with_(with_(MOE, "model.experts", 8), "parallel.ep", 4), {}, "parallel.ep", "parallel.dp"),
        (with_(MOE, "model.top_k", 5), {}, "model.top_k", "at most model.experts"),
        (with_(MOE, "model.top_k", 0), {}, "model.top_k", "MoE model"),
        (with_(MOE, "model.dense_layers", 4), {}, "model.dense_layers", "fewer than"),
        (with_(DENSE, "batch.global_batch", 3), {}, "batch.global_batch", "micro_batch x"),
        (with_(DENSE, "parallel.dp", "auto"), {}, "parallel.dp", "GPU count"),
        (with_(DENSE, "parallel.dp", "auto"), {"gpus": 6}, "parallel.dp", "multiple of tp x pp"),
        (DENSE, {"gpus": 16}, "parallel", "16 GPUs"),
        (DENSE, {"gpus_per_server": 1}, "parallel.tp", "GPUs per server"),
        (with_(DENSE, "gpu.efficiency", 0), {}, "gpu.efficiency", "above 0"),
        (with_(DENSE, "gpu.efficiency", 1.5), {}, "gpu.efficiency", "between 0 and 1"),
        (with_(DENSE, "gpu.peak_flops", "fast"), {}, "gpu.peak_flops", "FLOP/s"),
        (with_(DENSE, "gpu.efficiency", None), {}, "gpu.efficiency", "present"),
        ({**DENSE, "precision": "fp8"}, {}, "precision", "bf16"),
        ({**DENSE, "bucket": "lots"}, {}, "bucket", "size"),
        ({**DENSE, "recompute": "yes"}, {}, "recompute", "true or false"),
    ],
)
def test_every_mistake_is_one_sentence_naming_its_key(
    document: dict[str, Any], options: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(WorkloadError) as caught:
        parse_workload(document, "w.yaml", **options)
    error = caught.value
    assert isinstance(error, ConfigError) and error.exit_status == 2
    assert error.key == key
    assert words in error.expected or words in error.detail
    assert str(error).startswith(f"w.yaml: key '{key}': expected ")


def test_a_missing_or_broken_file_is_a_workload_error(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="an existing workload file"):
        load_workload(tmp_path / "none.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(WorkloadError):
        load_workload(broken)
    dense = tmp_path / "dense.yaml"
    dense.write_text("name: x\nmodel: 3\nparallel: {}\nbatch: {}\ngpu: {}\n")
    with pytest.raises(WorkloadError, match=f"{dense}: key 'model'"):
        load_workload(dense)


# --- costs: a tiny model by hand ---------------------------------------------------------
# b 1, s 4, h 8, f 32, V 16, tp 2:
#   attention 8bsh^2 + 4bs^2h = 2048 + 512 = 2560; MLP 4bshf = 4096; a layer 6656 / 2 = 3328
#   logits 2bshV = 1024 / 2 = 512


def test_tiny_dense_flops_by_hand() -> None:
    spec = parse_workload(DENSE)
    assert forward_flops(spec, 0) == 3328
    assert backward_flops(spec, 0) == 2 * 3328
    assert backward_flops(replace(spec, recompute=True), 0) == 3 * 3328
    assert logits_flops(spec) == 512
    assert stage_flops(spec, 0) == 2 * 3 * 3328  # 1 micro-batch, 2 layers
    assert stage_flops(spec, 1) == 2 * 3 * 3328 + 3 * 512
    assert compute_seconds(spec, 1e12) == 2.0  # at half of 1 TFLOP/s


def test_tiny_moe_flops_by_hand() -> None:
    spec = parse_workload(MOE)
    # MoE MLP: (k 2 + shared 1) x 4bsh f_e (f_e 4) = 3 x 512 = 1536, router 2bshE = 256
    assert forward_flops(spec, 1) == (2560 + 1536 + 256) / 2
    assert forward_flops(spec, 0) == 3328  # the dense first layer
    gated = replace(spec, model=replace(spec.model, gated_mlp=True))
    assert forward_flops(gated, 1) == (2560 + 1.5 * 1536 + 256) / 2
    assert forward_flops(gated, 0) == (2560 + 1.5 * 4096) / 2


def test_tiny_bytes_by_hand() -> None:
    spec = parse_workload(MOE)
    assert tp_allreduce_bytes(spec) == 1 * 4 * 8 * 2  # b s h x 2 B
    assert ep_alltoall_bytes(spec) == 1 * 4 * 2 * 8 * 2 // 2  # b s k h x 2 B / tp
    assert pp_bytes(spec) == 1 * 4 * 8 * 2 // 2


def test_tiny_parameters_by_hand() -> None:
    dense = parse_workload(DENSE)
    # a layer 4h^2 + 2hf = 256 + 512; the embedding Vh = 128 on stage 0, the output on 1
    assert stage_parameters(dense, 0) == (2 * 768 + 128) // 2
    assert stage_parameters(dense, 1) == stage_parameters(dense, 0)
    assert dp_gradient_bytes(dense, 0) == (832 * 2, 0)
    moe = parse_workload(MOE)
    # an MoE layer: 4h^2 256 + router hE 32 + shared 2hf_e 64, and 2 of 4 experts of 64
    assert dp_gradient_bytes(moe, 1) == ((2 * (256 + 32 + 64) + 128) // 2 * 2, 0)
    assert stage_parameters(moe, 1) == (2 * (256 + 32 + 64) + 128 + 2 * 2 * 64) // 2
    # with dp 4 over ep 2, each expert is held twice: its gradients are all-reduced
    wider = replace(moe, parallel=ParallelSpec(2, 2, 4, 2), batch=BatchSpec(1, 4))
    assert dp_gradient_bytes(wider, 1).expert == 2 * 2 * 64 // 2 * 2
    alone = replace(dense, parallel=ParallelSpec(2, 2, 1, 1), batch=BatchSpec(1, 1))
    assert dp_gradient_bytes(alone, 0) == (0, 0)


def test_an_iteration_lists_each_communication_kind() -> None:
    spec = parse_workload(MOE)
    first, last = stage_communication(spec, 0), stage_communication(spec, 1)
    assert [c.kind for c in first] == [
        "tp-allreduce",
        "ep-alltoall",
        "pp-send-forward",
        "dp-allreduce",
    ]
    assert [c.kind for c in last] == [
        "tp-allreduce",
        "ep-alltoall",
        "pp-send-backward",
        "dp-allreduce",
    ]
    assert first[0] == Communication("tp-allreduce", 2, 4 * 2, 64)
    assert first[1].count == 4 * 1  # stage 0 holds one MoE layer
    assert last[1].count == 4 * 2
    assert first[3].total == dp_gradient_bytes(spec, 0).dense


# --- costs: published totals ---------------------------------------------------------------


def test_gpt3_175b_has_175_billion_parameters() -> None:
    counted = model_parameters(GPT3)
    assert counted.total == pytest.approx(175e9, rel=0.01)
    assert counted.activated == counted.total
    assert stage_parameters(spec_of(GPT3), 0) == counted.total


def test_deepseek_v3_totals_within_a_few_percent() -> None:
    """671B total and 37B activated; this count takes MLA's attention as MHA's 4h^2 (187.1M
    weights a layer against 205.5M), which overstates the activated figure by 3 points."""
    counted = model_parameters(DEEPSEEK_V3)
    assert counted.total == pytest.approx(671e9, rel=0.01)
    assert counted.activated == pytest.approx(37e9, rel=0.05)
    spread = spec_of(DEEPSEEK_V3, dp=8, ep=8)
    held = stage_parameters(spread, 0)
    assert held < counted.total and dp_gradient_bytes(spread, 0).expert == 0


@pytest.mark.parametrize("recompute", [True, False])
def test_iteration_flops_are_megatrons_formula(recompute: bool) -> None:
    """Narayanan et al. SC'21, eq. (3): 96Bslh^2 (1 + s/6h + V/16lh) FLOPs an iteration with
    recomputation; without it, 72Bslh^2 (1 + s/6h + V/12lh) (three passes, not four)."""
    B, s, L, h, V = 1536, 2048, 96, 12288, 50257
    spec = spec_of(GPT3, tp=8, pp=8, dp=4, batch=BatchSpec(1, B), recompute=recompute)
    total = spec.gpus // spec.parallel.pp * sum(stage_flops(spec, st) for st in range(8))
    if recompute:
        expected = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    else:
        expected = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert total == pytest.approx(expected, rel=1e-9)
    model = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    assert model_flops_per_iteration(spec) == pytest.approx(model, rel=1e-9)


# --- the presets ---------------------------------------------------------------------------


def test_both_presets_are_there() -> None:
    assert [p.stem for p in PRESETS] == ["deepseek-like", "gpt3-like"]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.stem)
def test_a_preset_fits_the_emulated_fabric(path: Path) -> None:
    """8 GPUs, 2 a server; ~0.5-2 ms of compute an iteration at real speed (10-30 s at the
    fabric's 0.6e-4) and a data-parallel all-reduce of a few MB."""
    spec = load_workload(path, gpus=8, gpus_per_server=2)
    assert "Sec." in spec.source or "Table" in spec.source
    assert (spec.parallel.tp, spec.parallel.pp, spec.parallel.dp) == (2, 2, 2)
    assert spec.parallel.ep == (2 if spec.model.moe else 1)
    for stage in range(spec.parallel.pp):
        seconds = compute_seconds(spec, stage_flops(spec, stage))
        assert 0.5e-3 <= seconds <= 2e-3
        assert 10 <= seconds / 0.6e-4 <= 40
        gradients = dp_gradient_bytes(spec, stage)
        assert 1e6 <= gradients.dense + gradients.expert <= 8e6


def test_the_moe_preset_is_moe() -> None:
    spec = load_workload(REPO / "workloads" / "deepseek-like.yaml", gpus=8, gpus_per_server=2)
    assert spec.model.moe and spec.model.gated_mlp and spec.model.dense_layers >= 1


# --- astral workload show -----------------------------------------------------------------


def test_show_prints_an_iteration(capsys: pytest.CaptureFixture[str]) -> None:
    path = REPO / "workloads" / "deepseek-like.yaml"
    assert main(["workload", "show", str(path), "--gpus", "8", "--gpus-per-server", "2"]) == 0
    out = capsys.readouterr().out
    spec = load_workload(path, gpus=8)
    assert "tp 2 x pp 2 x dp 2 = 8 GPUs, ep 2" in out
    assert f"{stage_parameters(spec, 1):,}" in out
    assert f"{stage_flops(spec, 1):.3e}" in out
    for kind in (
        "tp-allreduce",
        "ep-alltoall",
        "pp-send-forward",
        "pp-send-backward",
        "dp-allreduce",
    ):
        assert kind in out
    seconds = compute_seconds(spec, stage_flops(spec, 1))
    assert f"{seconds / 1e-4:.3g}" in main_output(["--scale", "1e-4"], path, capsys)


def main_output(extra: list[str], path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["workload", "show", str(path), "--gpus", "8", *extra]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["gpt3-like.yaml"], "auto needs the GPU count"),
        (["gpt3-like.yaml", "--gpus", "6"], "multiple of tp x pp"),
        (["gpt3-like.yaml", "--gpus", "8", "--gpus-per-server", "1"], "GPUs per server"),
        (["gpt3-like.yaml", "--gpus", "8", "--scale", "2"], "--scale"),
        (["gpt3-like.yaml", "--gpus", "0"], "--gpus"),
        (["none.yaml"], "an existing workload file"),
    ],
)
def test_show_refuses_in_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(REPO / "workloads" / argv[0])
    assert main(["workload", "show", path, *argv[1:]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("astral: error: ") and captured.err.count("\n") == 1
    assert words in captured.err
    assert "Traceback" not in captured.err
