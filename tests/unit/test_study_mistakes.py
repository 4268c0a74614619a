"""Mistakes around studies, each refused or said plainly: an ``--out`` in use, a check that
asks about something the study does not measure, a variant's experiment.yaml that cannot be
re-run from its bundle, a variant's bundle gone, ``astral diagnose`` on a study."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.calibration.capacity import Calibration
from orchestrator.cli import main
from orchestrator.run.experiment import load_experiment
from orchestrator.run.runner import RunOptions
from orchestrator.study import runner as study_runner
from orchestrator.study.spec import load_study, parse_study
from orchestrator.workload.spec import PRESETS_DIR as WORKLOAD_PRESETS
from tests.unit.test_study import synthetic_study
from topologies.catalog import preset_path
from topologies.errors import EmulationError, ExperimentError


def document(**extra: Any) -> dict[str, Any]:
    """A small study: astral-small, two variants that differ by an experiment key."""
    doc: dict[str, Any] = {
        "name": "mistakes",
        "fabric": "astral-small",
        "sweep": {"iterations": [1, 2]},
        "policies": ["path-pinned"],
        "collectives": ["all-reduce"],
        "sizes": {"min": "64K", "max": "256K", "factor": 4},
        "warmup": 0,
    }
    doc.update(extra)
    return doc


def write_study(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def no_bring_up(*args: Any, **kwargs: Any) -> Any:
    raise EmulationError("stub: no fabric is brought up in a unit test")


# --- --out ------------------------------------------------------------------------------------


def test_a_study_refuses_an_out_in_use_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the --out named, before the load guard (which may calibrate) and any
    bring-up; the directory is left as it was."""

    def judged(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the load guard ran before --out was checked")

    monkeypatch.setattr(study_runner, "Testbed", no_bring_up)
    monkeypatch.setattr(study_runner.StudyRunner, "judge_loads", judged)
    study = write_study(tmp_path / "study.yaml", document())
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    argv = ["run", str(study), "--out", str(out), "--no-calibrate", "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("astral: error: command line: key '--out': expected a new or empty")
    assert "not empty" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    assert main(["run", str(study), "--out", str(a_file), "--no-calibrate", "-q"]) == 2
    assert "a file" in capsys.readouterr().err and a_file.read_text() == "x"


def test_a_study_accepts_an_empty_out_as_a_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(study_runner, "Testbed", no_bring_up)
    study = parse_study(document(), "study.yaml")
    out = tmp_path / "empty"
    out.mkdir()
    capacity = Calibration(capacity_bps=1e12, bound="bracketed")
    runner = study_runner.StudyRunner(
        study, RunOptions(out=out, calibrate=False, plots=False), calibration=capacity
    )
    outcome = runner.run()  # the stub's bring-up fails: the study stops, its bundle written
    assert outcome.bundle == out and (out / "study.json").is_file()
    assert outcome.status == "failed" and "stub" in (outcome.error or "")


# --- checks -----------------------------------------------------------------------------------


def ratio_check(**fields: Any) -> dict[str, Any]:
    check = {"name": "c", "of": {"iterations": 2}, "to": {"iterations": 1}, "ratio": [0.5, 2]}
    check.update(fields)
    return check


def check_error(*checks: dict[str, Any], **extra: Any) -> ExperimentError:
    doc = document(study={"question": "q", "checks": list(checks)}, **extra)
    with pytest.raises(ExperimentError) as caught:
        parse_study(doc, "study.yaml")
    return caught.value


def test_a_check_at_a_size_the_study_does_not_run_is_refused_naming_the_sizes() -> None:
    error = check_error(ratio_check(size="128K"))
    assert error.key == "study.checks[0].size"
    assert "a size the study runs (64K, 256K)" in str(error) and error.found == "128K"
    for size in ("64K", "256K", "max", "min"):  # what it runs: accepted
        doc = document(study={"checks": [ratio_check(size=size)]})
        assert parse_study(doc, "study.yaml").checks[0].size is not None


def test_a_check_of_a_variant_against_itself_is_refused() -> None:
    error = check_error(ratio_check(of={"variant": 1}, to={"variant": 1}))
    assert error.key == "study.checks[0].to" and "itself" in str(error)
    # one variant's two policies are two figures: a fair ratio
    both = document(policies=["ecmp", "path-pinned"])
    both["study"] = {
        "checks": [ratio_check(of={"variant": 1, "policy": "ecmp"}, to={"variant": 1},
                               policy="path-pinned")]
    }  # fmt: skip
    check = parse_study(both, "study.yaml").checks[0]
    assert (check.of.policy, check.to and check.to.policy) == ("ecmp", "path-pinned")


def test_a_check_of_a_collective_one_side_does_not_run_is_refused() -> None:
    doc = document(sweep={"collectives": [["all-reduce", "all-to-all"], ["all-reduce"]]})
    doc["study"] = {
        "checks": [{"name": "c", "of": {"variant": 1}, "to": {"variant": 2},
                    "collective": "all-to-all", "ratio": [0.5, 2]}]
    }  # fmt: skip
    with pytest.raises(ExperimentError) as caught:
        parse_study(doc, "study.yaml")
    assert caught.value.key == "study.checks[0].collective"
    assert "variant 2" in str(caught.value) and "all-reduce (ring)" in str(caught.value)


def test_a_variant_number_out_of_range_says_how_many_there_are() -> None:
    error = check_error(ratio_check(of={"variant": 3}))
    assert error.key == "study.checks[0].of.variant" and "from 1 to 2" in str(error)


# --- a variant's experiment.yaml ----------------------------------------------------------------


def test_a_variants_experiment_yaml_runs_alone_from_its_bundle_moved(tmp_path: Path) -> None:
    """A fabric named by a path relative to the study file (with a sweep of experiment
    keys only, which leaves the fabric as the study wrote it) is inlined into the variant's
    experiment.yaml: it loads from the variant's directory, wherever the bundle is."""
    path = write_study(tmp_path / "studies" / "s.yaml", document(fabric="my-fabric.yaml"))
    shutil.copyfile(preset_path("astral-small"), path.parent / "my-fabric.yaml")
    study = load_study(path)
    variant = study.variants[1]
    moved = tmp_path / "elsewhere" / "variants" / variant.slug
    moved.mkdir(parents=True)
    (moved / "experiment.yaml").write_text(study_runner.variant_text(study, variant))
    spec = load_experiment(moved / "experiment.yaml")
    assert replace(spec.fabric, source="") == replace(variant.spec.fabric, source="")
    assert spec.iterations == 2


def test_a_variants_workload_file_is_inlined_too(tmp_path: Path) -> None:
    shutil.copyfile(WORKLOAD_PRESETS / "deepseek-like.yaml", tmp_path / "w.yaml")
    doc = document(workload="w.yaml", scale=0.6e-4)
    del doc["collectives"], doc["sizes"]
    study = load_study(write_study(tmp_path / "s.yaml", doc))
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "experiment.yaml").write_text(study_runner.variant_text(study, study.variants[0]))
    assert load_experiment(moved / "experiment.yaml").workload == study.variants[0].spec.workload


def test_a_preset_fabric_stays_named() -> None:
    study = parse_study(document(), "study.yaml")
    assert study.variants[0].document["fabric"] == "astral-small"


# --- report and diagnose ------------------------------------------------------------------------


def test_report_says_a_variants_bundle_is_missing_never_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_study(tmp_path / "study")
    shutil.rmtree(root / "variants" / "02-b")  # b completed (study.json), its bundle gone
    assert main(["report", str(root), "--no-plots"]) == 6
    captured = capsys.readouterr()
    row_b = [line for line in captured.out.splitlines() if line.strip().startswith("b ")]
    assert row_b and all(line.endswith("bundle missing") for line in row_b)
    assert "[bundle missing]" in captured.out
    assert "variant 2 (b), ok in study.json: its bundle" in captured.err
    assert "is missing" in captured.err
    row_c = next(line for line in captured.out.splitlines() if line.strip().startswith("c "))
    assert row_c.endswith("failed, no bundle")  # c failed and never wrote one
    assert "Traceback" not in captured.err


def test_report_of_a_whole_study_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_study(tmp_path / "study")
    (root / "variants" / "03-c").mkdir()
    shutil.copyfile(root / "variants" / "02-b" / "results.sqlite",
                    root / "variants" / "03-c" / "results.sqlite")  # fmt: skip
    shutil.copyfile(root / "variants" / "02-b" / "fabric.json",
                    root / "variants" / "03-c" / "fabric.json")  # fmt: skip
    assert main(["report", str(root), "--no-plots", "-q"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_diagnose_on_a_study_names_a_variant_to_diagnose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_study(tmp_path / "study")
    assert main(["diagnose", str(root)]) == 6
    err = capsys.readouterr().err
    assert "a study's bundle" in err
    assert f"astral diagnose {root / 'variants' / '01-a'}" in err
    assert "Traceback" not in err
