"""Training workloads: mistakes an outside tester found, each refused in one sentence naming
the key, or shown as it is compiled. A gradient bucket so small that its all-reduces would
fill memory, a GPU too slow for a replay ever to end, the dp-allreduce row of ``astral
workload show`` against the program's buckets, ``show`` of a preset without ``--gpus``, and
docs/workloads.md against the validator and the files it names."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.collectives.program import GroupCollective, ProgramError
from orchestrator.run.experiment import load_experiment
from orchestrator.workload import costs
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import load_workload, parse_workload
from tests.helpers import REPO
from topologies.errors import ExperimentError, WorkloadError

GPT3 = REPO / "workloads" / "gpt3-like.yaml"
DOC = REPO / "docs" / "workloads.md"

#: A tiny dense model: 1,664 bytes of gradients a stage (tests/unit/test_workload.py).
TINY: dict[str, Any] = {
    "name": "tiny",
    "model": {"layers": 4, "hidden": 8, "heads": 2, "ffn_hidden": 32, "seq_len": 4, "vocab": 16},
    "parallel": {"tp": 2, "pp": 2, "dp": 2},
    "batch": {"micro_batch": 1, "global_batch": 2},
    "gpu": {"peak_flops": "1T", "efficiency": 0.5},
}


def preset_document(**changes: object) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(GPT3.read_text())
    document.update(changes)
    return document


def write_workload(tmp_path: Path, document: dict[str, Any]) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


# --- 1. the gradient bucket ----------------------------------------------------------------


def test_a_bucket_making_more_buckets_than_the_limit_is_refused_naming_key_and_limit() -> None:
    with pytest.raises(WorkloadError) as caught:
        parse_workload({**TINY, "bucket": 1}, "w.yaml")
    error = caught.value
    assert error.key == "bucket" and error.found == 1
    least = costs.bucket_count(1664, costs.MAX_BUCKETS)
    assert f"at least {least} B" in error.expected
    assert f"at most {costs.MAX_BUCKETS} buckets" in error.detail and "all-reduce" in error.detail
    # the smallest bucket the message names is accepted, and compiles to at most the limit
    spec = parse_workload({**TINY, "bucket": least}, "w.yaml")
    program = iteration_program(spec, 0.6e-4)
    buckets = {o.label for s in program.slots for o in s.ops if "bucket" in o.label}
    assert 1 < len(buckets) <= costs.MAX_BUCKETS


def test_a_preset_with_a_one_byte_bucket_is_refused_at_once(tmp_path: Path) -> None:
    """gpt3-like with ``bucket: 1`` would make 3.4 million all-reduces a stage."""
    path = write_workload(tmp_path, preset_document(bucket=1))
    with pytest.raises(WorkloadError, match="key 'bucket': expected a bucket of at least"):
        load_workload(path, gpus=8, gpus_per_server=2)


def test_an_experiments_inline_workload_with_too_small_a_bucket_names_workload_bucket(
    tmp_path: Path,
) -> None:
    base = "name: replay\nfabric: astral-small\npolicies: [ecmp]\nscale: 0.6e-4\n"
    inline = yaml.safe_dump({"workload": preset_document(bucket=1700)}, sort_keys=False)
    path = tmp_path / "exp.yaml"
    path.write_text(base + inline, encoding="utf-8")
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    assert caught.value.key == "workload.bucket"


def test_the_program_refuses_a_spec_of_too_many_buckets_before_building_it() -> None:
    spec = replace(parse_workload(TINY), bucket_bytes=1)
    with pytest.raises(ProgramError, match=f"above the {costs.MAX_BUCKETS}"):
        iteration_program(spec, 0.6e-4)


def test_a_global_batch_of_too_many_micro_batches_is_refused_naming_the_largest() -> None:
    """16,384 micro-batches of 8 layers would be a program of a million slots."""
    with pytest.raises(WorkloadError) as caught:
        parse_workload(
            preset_document(batch={"micro_batch": 2, "global_batch": 65536}), "w.yaml", gpus=8
        )
    error = caught.value
    assert error.key == "batch.global_batch" and error.found == 65536
    assert "at most 8192 sequences" in error.expected
    assert f"above the {costs.MAX_LAYER_PASSES}" in error.detail
    largest = preset_document(batch={"micro_batch": 2, "global_batch": 8192})
    assert parse_workload(largest, gpus=8).micro_batches * 8 == costs.MAX_LAYER_PASSES


# --- 2. compute a replay can sleep ---------------------------------------------------------


@pytest.mark.parametrize("peak", [1, "1G", "989", "1E"])
def test_an_implausible_peak_flops_is_refused(peak: object) -> None:
    gpu = {"peak_flops": peak, "efficiency": 1}
    with pytest.raises(WorkloadError) as caught:
        parse_workload({**TINY, "gpu": gpu}, "w.yaml")
    assert caught.value.key == "gpu.peak_flops"
    assert "between 1T and 100P" in caught.value.expected


def test_compute_too_slow_for_a_replay_is_refused_by_forecast_and_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2T at 1 % efficiency: gpt3-like's longest step is 4,290 s emulated at 1e-4."""
    path = write_workload(tmp_path, preset_document(gpu={"peak_flops": "2T", "efficiency": 0.01}))
    with pytest.raises(WorkloadError) as caught:
        load_workload(path, gpus=8, gpus_per_server=2, scale=1e-4)
    assert caught.value.key == "gpu" and f"{costs.MAX_STEP_SECONDS:g} s" in caught.value.expected
    spec = load_workload(path, gpus=8, gpus_per_server=2)
    assert costs.longest_step_seconds(spec) / 1e-4 > costs.MAX_STEP_SECONDS
    with pytest.raises(ProgramError, match="longest compute step"):
        iteration_program(spec, 1e-4)
    assert main(["forecast", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"astral: error: {path}: key 'gpu': ") and err.count("\n") == 1


def test_the_presets_compute_stays_well_inside_the_step_limit() -> None:
    for path in sorted((REPO / "workloads").glob("*.yaml")):
        spec = load_workload(path, gpus=8, gpus_per_server=2, scale=0.6e-4)
        assert costs.longest_step_seconds(spec) / 0.6e-4 < costs.MAX_STEP_SECONDS / 10


# --- 3. show's dp-allreduce row is the buckets ---------------------------------------------


def test_show_counts_the_buckets_the_program_all_reduces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_workload(tmp_path, preset_document(bucket="1M"))
    spec = load_workload(path, gpus=8, gpus_per_server=2)
    program = iteration_program(spec, 0.6e-4)
    ops = [o for s in program.slots for o in s.ops if isinstance(o, GroupCollective)]
    stage0 = {o.label for o in ops if "bucket" in o.label and 0 in o.group}
    assert len(stage0) == 4  # 3.25 MiB of gradients in 1 MiB buckets
    (row,) = [c for c in costs.stage_communication(spec, 0) if c.kind == "dp-allreduce"]
    assert (row.count, row.bytes_each, row.last_bytes) == (4, 2**20, 2**18)
    assert row.total == costs.dp_gradient_bytes(spec, 0).dense
    assert main(["workload", "show", str(path), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"dp-allreduce\s+2\s+4\s+1\.00 MiB, last 0\.25 MiB\s+3\.25 MiB", out)


def test_one_bucket_is_shown_as_one_all_reduce_of_everything() -> None:
    spec = load_workload(GPT3, gpus=8, gpus_per_server=2)  # 3.25 MiB in 25 MiB buckets
    (row,) = [c for c in costs.stage_communication(spec, 1) if c.kind == "dp-allreduce"]
    assert (row.count, row.last_bytes, row.total) == (1, 0, row.bytes_each)


# --- 4. show of a preset without --gpus ----------------------------------------------------


def test_show_of_a_dp_auto_preset_without_gpus_says_which_option_to_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["workload", "show", str(GPT3)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "key 'parallel.dp'" in captured.err and "--gpus N" in captured.err
    assert "--gpus 8 --gpus-per-server 2" in captured.err


def test_the_docs_show_command_gives_the_gpus() -> None:
    text = " ".join(DOC.read_text().split())
    for command in re.findall(r"`astral workload show [^`]*`", text):
        assert "--gpus" in command, command


# --- 5. and 6. docs/workloads.md against the validator and the repository ------------------


def test_the_docs_name_rule_is_the_validators() -> None:
    line = next(x for x in DOC.read_text().splitlines() if x.startswith("name: deepseek-like"))
    assert "_" not in line.split("#", 1)[1]
    with pytest.raises(WorkloadError, match="key 'name'"):
        parse_workload({**TINY, "name": "my_work"})
    parse_workload({**TINY, "name": "my-work"})


def test_every_file_docs_workloads_names_exists() -> None:
    text = DOC.read_text()
    links = [m for m in re.findall(r"\]\(([^)#\s]+)", text) if not m.startswith("http")]
    missing = [link for link in links if not (DOC.parent / link).exists()]
    paths = re.findall(r"\b(docs/[A-Za-z0-9_./-]+\.md)\b", text)
    missing += [path for path in paths if not (REPO / path).exists()]
    assert not missing
    assert (
        "docs/monitoring.md" in text and "## Faults" in (DOC.parent / "monitoring.md").read_text()
    )


def test_show_refuses_before_printing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_workload(tmp_path, preset_document(bucket=1))
    assert main(["workload", "show", str(path), "--gpus", "8"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.startswith(f"astral: error: {path}: key 'bucket'")
