"""A user's mistakes on the command line said as mistakes, and nothing set there ignored.

- ``--set`` (``astral forecast``, a study's ``sweep``) of a fabric key that the experiment's
  own key replaces for the run (``emulation.scale`` under the experiment's ``scale``) takes
  effect, or is an error naming the key to set (orchestrator/run/overrides.py); a key the
  forecast does not model is an error (orchestrator/commands/whatif.py).
- ``astral compare`` with a policy its side did not run names the side and the policies it
  ran (exit 2), instead of "no configuration in common" (orchestrator/commands/compare.py).
- A fabric description or a training workload given where an experiment is expected says
  what the file is and how an experiment refers to it (orchestrator/run/experiment.py).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.commands.whatif import with_settings
from orchestrator.run.experiment import load_experiment, parse_experiment
from orchestrator.study.spec import parse_study
from tests.helpers import REPO
from tests.unit.test_results import write_synthetic_bundle
from tests.unit.test_study import synthetic_study
from topologies.catalog import preset_path
from topologies.errors import ConfigError, ExperimentError
from topologies.yamlfile import read_yaml

DEFAULT = REPO / "experiments" / "default.yaml"


def default_document() -> dict[str, Any]:
    document = read_yaml(DEFAULT, ExperimentError, "experiment")
    assert isinstance(document, dict) and document["scale"] == pytest.approx(2.0e-4)
    return document


# --- --set of a key the experiment's own would replace -----------------------------------------


def test_set_emulation_scale_takes_effect_over_the_experiments_scale() -> None:
    """experiments/default.yaml sets ``scale: 2.0e-4``: ``--set emulation.scale=1e-4`` was
    written into the fabric and then replaced by it, a variant equal to the baseline."""
    changed = with_settings(default_document(), ["emulation.scale=1e-4"], DEFAULT.parent)
    spec = parse_experiment(changed, str(DEFAULT), DEFAULT.parent)
    assert spec.fabric.emulation.scale == pytest.approx(1e-4)
    # ... and the experiment's own key, set after it, is the last word
    later = with_settings(
        default_document(), ["emulation.scale=1e-4", "scale=3e-4"], DEFAULT.parent
    )
    assert parse_experiment(later, str(DEFAULT), DEFAULT.parent).fabric.emulation.scale == (
        pytest.approx(3e-4)
    )


def test_a_study_sweeping_the_fabric_scale_runs_each_scale() -> None:
    document = default_document()
    document["sweep"] = {"emulation.scale": [1e-4, 3e-4]}
    study = parse_study(document, str(DEFAULT), DEFAULT.parent)
    scales = [variant.spec.fabric.emulation.scale for variant in study.variants]
    assert scales == [pytest.approx(1e-4), pytest.approx(3e-4)]


def test_a_fabric_latency_the_experiments_latency_names_takes_effect() -> None:
    document = default_document()
    document["latency"] = {"nic": "2us", "switch_hop": "1us"}
    changed = with_settings(document, ["fabric.latency.nic=0.1us"], DEFAULT.parent)
    assert changed["latency"] == {"switch_hop": "1us"}  # the component gave way, no other
    latency = parse_experiment(changed, str(DEFAULT), DEFAULT.parent).fabric.latency
    assert latency.nic == pytest.approx(0.1e-6) and latency.switch_hop == pytest.approx(1e-6)


def test_a_fabric_latency_under_the_experiments_latency_off_is_an_error_naming_it() -> None:
    document = default_document()
    document["latency"] = "off"
    with pytest.raises(ConfigError) as caught:
        with_settings(document, ["fabric.latency.nic=1us"], DEFAULT.parent)
    text = str(caught.value)
    assert text.startswith("--set: key 'fabric.latency.nic': expected a fabric key the ")
    assert "latency: off in the experiment" in text and "set latency instead" in text


@pytest.mark.parametrize(
    ("setting", "hint"),
    [
        ("faults=[{kind: link-down, target: p0s0g0-p0r0t0, at: 0s}]", "--fail LINK|SWITCH"),
        ("monitor=light", "what a run records"),
        ("load_limit.force=true", "whether a run starts"),
    ],
)
def test_a_key_the_forecast_does_not_model_is_an_error_not_an_equal_variant(
    setting: str, hint: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        with_settings(default_document(), [setting], DEFAULT.parent)
    key = setting.partition("=")[0]
    assert str(caught.value).startswith(f"--set: key '{key}': expected a key the forecast models")
    assert hint in str(caught.value)


# --- astral compare: a policy its side did not run ---------------------------------------------


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("compare")
    a = write_synthetic_bundle(root / "a", policies=("ecmp", "path-pinned"))
    b = write_synthetic_bundle(root / "b", policies=("path-pinned",))
    return str(a), str(b)


def test_a_policy_bundle_a_did_not_run_names_a_and_its_policies(
    bundles: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = bundles
    assert main(["compare", a, b, "--a-policy", "nope", "--b-policy", "path-pinned"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("astral: error: command line: key '--a-policy': expected a policy")
    assert f"bundle A ({a}) ran: ecmp, path-pinned, found 'nope'" in err
    assert "no configuration in common" not in err and "Traceback" not in err


def test_a_policy_bundle_b_did_not_run_names_b(
    bundles: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = bundles
    assert main(["compare", a, b, "--a-policy", "ecmp", "--b-policy", "ecmp"]) == 2
    err = capsys.readouterr().err
    assert "key '--b-policy'" in err and f"bundle B ({b}) ran: path-pinned, found 'ecmp'" in err
    # one policy alone picks it on both sides: which side lacks it, and what picks B's
    assert main(["compare", a, b, "--b-policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "key '--b-policy'" in err and "bundle A" in err and "--a-policy picks A's" in err


def test_forecast_comparison_takes_a_policy_of_a_and_refuses_one_of_b(
    bundles: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    a, _ = bundles
    assert main(["compare", a, "--forecast", "--a-policy", "nope"]) == 2
    assert "ran: ecmp, path-pinned, found 'nope'" in capsys.readouterr().err
    assert main(["compare", a, "--forecast", "--b-policy", "ecmp"]) == 2
    assert "no --b-policy with --forecast" in capsys.readouterr().err
    main(["compare", a, "--forecast", "--a-policy", "path-pinned"])
    out = capsys.readouterr().out
    assert "policy path-pinned" in out and "policy ecmp" not in out


def test_workload_replays_name_the_policies_each_side_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replay = {"real_ms": 3.0, "iteration_s": 30.0, "tokens_per_s": 1e5, "mfu": 0.1,
              "exposed_s": {"tp": 0.0, "ep": 0.0, "pp": 0.0, "dp": 1.0}, "wrong": 0}  # fmt: skip
    sides = []
    for name, policies in (("a", ("ecmp", "path-pinned")), ("b", ("ecmp",))):
        (tmp_path / name).mkdir()
        document = {"workload": "gpt3-like", "scale": 1e-4,
                    "policies": {p: copy.deepcopy(replay) for p in policies}}  # fmt: skip
        (tmp_path / name / "workload.json").write_text(json.dumps(document))
        sides.append(str(tmp_path / name))
    assert main(["compare", *sides, "--a-policy", "adaptive"]) == 2
    assert "bundle A" in (err := capsys.readouterr().err) and "found 'adaptive'" in err
    assert main(["compare", *sides, "--a-policy", "path-pinned"]) == 2
    assert f"bundle B ({sides[1]}) ran: ecmp, found 'path-pinned'" in capsys.readouterr().err
    assert main(["compare", sides[0], "--forecast", "--a-policy", "ecmp"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert [row.split()[0] for row in rows] == ["ecmp"]


def test_a_policy_no_variant_of_a_study_ran_is_a_mistake(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_study(tmp_path / "study")
    assert main(["compare", str(root), "--a-policy", "nope"]) == 2
    assert f"study A ({root}) ran: ecmp, path-pinned, found 'nope'" in capsys.readouterr().err
    # the first variant ran ecmp, the one it is set beside did not
    assert main(["compare", str(root), "--a-policy", "ecmp"]) == 2
    assert "study B" in capsys.readouterr().err
    assert main(["compare", str(root), "--a-policy", "path-pinned"]) == 0


# --- another kind of file where an experiment is expected ---------------------------------------


def test_a_preset_fabric_file_given_as_an_experiment_says_how_to_name_it() -> None:
    path = preset_path("astral-small")
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)  # what `astral run FABRIC.yaml` validates before anything
    text = str(caught.value)
    assert text.startswith(f"{path}: expected an experiment (name, fabric, collectives, sizes")
    assert "found 'a fabric description (kind: astral)'" in text
    assert "`fabric: astral-small`" in text and "unknown key" not in text


def test_a_fabric_file_given_to_forecast_says_how_to_refer_to_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fabric = tmp_path / "mine.yaml"
    fabric.write_text(preset_path("fat-tree-small").read_text())
    # --set would otherwise look for the fabric the file does not name
    assert main(["forecast", str(fabric), "--set", "speeds.nic=400G"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"astral: error: {fabric}: expected an experiment")
    assert f"`fabric: {fabric}`" in err and "experiment file's directory" in err


def test_a_workload_given_as_an_experiment_says_an_experiment_replays_it() -> None:
    path = REPO / "workloads" / "gpt3-like.yaml"
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    text = str(caught.value)
    assert "found 'a training workload (model: ...)'" in text
    assert f"`workload: {path}`" in text and "experiments/workload-replay.yaml" in text


def test_an_experiment_with_a_stray_kind_key_is_still_told_its_unknown_key() -> None:
    document = default_document()
    document["kind"] = "astral"
    with pytest.raises(ExperimentError, match="key 'kind': expected one of the known keys"):
        parse_experiment(document, str(DEFAULT), DEFAULT.parent)
