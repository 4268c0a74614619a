"""Studies without emulation: expansion into variants, their validation, the checks and
the study bundle's rendering (orchestrator/study). The runs themselves:
tests/integration/test_study_run.py."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.cli import main
from orchestrator.results.summary import ConfigurationResult
from orchestrator.run.experiment import parse_experiment
from orchestrator.study.bundle import STUDY_FILE
from orchestrator.study.checks import Verdict
from orchestrator.study.report import render_study
from orchestrator.study.spec import load_study, parse_study
from tests.unit.test_results import write_synthetic_bundle
from topologies.errors import ConfigError, ExperimentError

REPO = Path(__file__).resolve().parents[2]
STUDIES = sorted((REPO / "experiments" / "studies").glob("*.yaml"))


def base(**extra: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "name": "s",
        "fabric": "astral-small",
        "policies": ["path-pinned"],
        "collectives": ["all-reduce", "all-to-all"],
        "sizes": {"min": "256K", "max": "1M", "factor": 4},
        "iterations": 2,
        "warmup": 1,
    }
    document.update(extra)
    return document


def error_of(document: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        parse_study(document, "study.yaml", REPO / "experiments")
    return caught.value


# --- expansion ----------------------------------------------------------------------------


def test_a_product_over_fabrics_and_swept_keys_in_file_order_the_first_slowest() -> None:
    document = {k: v for k, v in base().items() if k != "fabric"}
    document["fabrics"] = ["astral-small", "hpn-like"]
    document["sweep"] = {"oversubscription.tor": [1, 2], "iterations": [2, 5]}
    study = parse_study(document, "study.yaml")
    assert [v.label for v in study.variants][:3] == [
        "astral-small, oversubscription.tor=1, iterations=2",
        "astral-small, oversubscription.tor=1, iterations=5",
        "astral-small, oversubscription.tor=2, iterations=2",
    ]
    assert len(study.variants) == 8
    assert study.axes == ("fabric", "oversubscription.tor", "iterations")
    last = study.variants[-1].spec
    assert (last.fabric.name, last.fabric.oversubscription.tor, last.iterations) == (
        "hpn-like",
        2.0,
        5,
    )
    assert last.fabric.oversubscription.agg == 15  # the rest of hpn-like stays
    # variants that differ by experiment keys only share a fabric: one bring-up for both
    assert [len(group) for group in study.by_fabric()] == [2, 2, 2, 2]


def test_zip_pairs_the_lists_and_wants_them_of_one_length() -> None:
    study = parse_study(
        base(sweep={"scale": [0.5e-4, 1e-4], "iterations": [3, 6]}, sweep_mode="zip"), "s.yaml"
    )
    assert [(v.spec.fabric.emulation.scale, v.spec.iterations) for v in study.variants] == [
        (0.5e-4, 3),
        (1e-4, 6),
    ]
    err = error_of(base(sweep={"scale": [0.5e-4, 1e-4], "iterations": [3]}, sweep_mode="zip"))
    assert err.key == "sweep" and "scale: 2, iterations: 1" in str(err)


def test_a_null_sweep_value_leaves_the_key_out() -> None:
    study = parse_study(
        base(
            sweep={"faults": [None, [{"kind": "link-down", "target": "p0s0g0-p0r0t0"}]]},
        ),
        "s.yaml",
    )
    assert [len(v.spec.faults) for v in study.variants] == [0, 1]
    assert study.variants[0].label == "faults=none"


def test_a_named_preset_is_changed_inline_and_its_file_untouched() -> None:
    preset = REPO / "topologies" / "presets" / "astral-small.yaml"
    before = preset.read_text()
    study = parse_study(base(sweep={"speeds.nic": ["200G", "400G"]}), "s.yaml")
    assert [v.spec.fabric.speeds.nic for v in study.variants] == [200e9, 400e9]
    assert study.variants[1].document["fabric"]["name"] == "astral-small"
    assert preset.read_text() == before


# (change to a valid study, the key the error names, a phrase of its sentence)
BAD_STUDIES: list[tuple[dict[str, Any], str, str]] = [
    ({"study": {"plot": {"metric": "latency"}}}, "study.plot.metric", "busbw, algbw"),
    ({"study": {"plot": {"colour": "red"}}}, "study.plot.colour", "known keys"),
    (
        {"study": {"plot": {"x": "pods"}}, "sweep": {"iterations": [2, 3]}},
        "study.plot.x",
        "a key the study varies: iterations",
    ),
    ({"sweep": {"oversubscription.agg": [1, 0]}}, "fabric.oversubscription.agg", "variant 2"),
    ({"sweep": {"iterations": [3, "many"]}}, "iterations", "variant 2 (iterations=many)"),
    ({"sweep": {"warp.factor": [1]}}, "warp.factor", "an experiment key"),
    ({"sweep": {"name": ["a", "b"]}}, "sweep.name", "fabrics: names several"),
    ({"sweep": {"iterations": []}}, "sweep.iterations", "a non-empty list"),
    ({"sweep": {"iterations": [2, 2]}}, "sweep.iterations[1]", "each value once"),
    ({"sweep": []}, "sweep", "a mapping of dotted keys"),
    ({"sweep_mode": "shuffle", "sweep": {"iterations": [2]}}, "sweep_mode", "product, zip"),
    ({"fabrics": ["astral-small", "hpn-like"]}, "fabrics", "not both"),
    ({"fabrics": []}, "fabrics", "a non-empty list"),
    ({"study": {"questoin": "?"}}, "study.questoin", "known keys"),
    ({"sweep": {"placement.gpus": [4, 99]}}, "placement.gpus", "variant 2"),
]


@pytest.mark.parametrize(("change", "key", "text"), BAD_STUDIES)
def test_a_bad_study_names_its_key_and_variant(change: dict[str, Any], key: str, text: str) -> None:
    err = error_of(base(**change))
    assert err.key == key, str(err)
    assert text in str(err)


def test_an_unknown_fabric_in_fabrics_names_its_variant() -> None:
    document = {k: v for k, v in base().items() if k != "fabric"}
    document["fabrics"] = ["astral-small", "no-such-fabric"]
    err = error_of(document)
    assert "variant 2" in str(err) and "no-such-fabric" in str(err)


def test_a_plain_experiment_refuses_a_studys_keys() -> None:
    with pytest.raises(ExperimentError) as caught:
        parse_experiment(base(sweep={"iterations": [1, 2]}), "e.yaml")
    assert caught.value.key == "sweep" and "astral run runs a study" in str(caught.value)


# --- checks ---------------------------------------------------------------------------------

CHECK = {
    "name": "15:1 cuts all-to-all",
    "of": {"oversubscription.agg": 15},
    "to": {"oversubscription.agg": 1},
    "collective": "all-to-all",
    "ratio": [0.05, 0.5],
}


def bad_check(change: dict[str, Any]) -> dict[str, Any]:
    """CHECK with ``change`` applied (a None value removes the key)."""
    return {k: v for k, v in (CHECK | change).items() if v is not None}


def study_with(*checks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A study document: astral-small at 1:1 and 15:1, with ``checks``."""
    document = base(sweep={"oversubscription.agg": [1, 15]}, **extra)
    document["study"] = {"question": "q", "checks": list(checks)}
    return document


def checked(*checks: dict[str, Any], **extra: Any) -> Any:
    return parse_study(study_with(*checks, **extra), "s.yaml")


# (change to a valid check, the key the error names, a phrase of its sentence)
BAD_CHECKS: list[tuple[dict[str, Any], str, str]] = [
    ({"of": {"oversubscription.agg": 4}}, "study.checks[0].of", "exactly one variant"),
    ({"of": {"oversubscription.tor": 1}}, "study.checks[0].of.oversubscription.tor", "swept"),
    ({"collective": "all-gather"}, "study.checks[0].collective", "the study runs"),
    ({"collective": None}, "study.checks[0].collective", "the study runs several"),
    ({"ratio": [2, 1]}, "study.checks[0].ratio", "0 <= low <= high"),
    ({"ratio": "about half"}, "study.checks[0].ratio", "[low, high]"),
    ({"to": None}, "study.checks[0].to", "the variant the ratio divides by"),
    ({"to": {}}, "study.checks[0].to", "a mapping"),
    ({"size": "huge"}, "study.checks[0].size", "max, min or a size"),
    ({"completes": True}, "study.checks[0]", "either ratio"),
    ({"completes": True, "ratio": None}, "study.checks[0].to", "no to on a completes check"),
    ({"policy": "ecmp"}, "study.checks[0].of.policy", "a policy of the variant"),
    ({"colour": "red"}, "study.checks[0].colour", "known keys"),
]


@pytest.mark.parametrize(("change", "key", "text"), BAD_CHECKS)
def test_a_bad_check_names_its_key(change: dict[str, Any], key: str, text: str) -> None:
    with pytest.raises(ExperimentError) as caught:
        checked(bad_check(change))
    assert caught.value.key == key, str(caught.value)
    assert text in str(caught.value)


def test_a_variant_that_runs_several_policies_needs_one_named() -> None:
    with pytest.raises(ExperimentError) as caught:
        checked(CHECK, policies=["ecmp", "path-pinned"])
    assert caught.value.key == "study.checks[0].of.policy"
    study = checked(CHECK | {"policy": "ecmp"}, policies=["ecmp", "path-pinned"])
    assert study.checks[0].of.policy == "ecmp"


class Figures:
    def __init__(self, status: str, results: list[ConfigurationResult], scale: float) -> None:
        self.status, self.results, self.scale = status, results, scale


def results_of(bundle: Path) -> list[ConfigurationResult]:
    from orchestrator.results.store import ResultsBundle
    from orchestrator.results.summary import summarize

    with ResultsBundle.open(bundle) as opened:
        return summarize(opened)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> list[ConfigurationResult]:
    """A run's results with known numbers (ecmp at 0.65, path-pinned at 0.88 of a ceiling,
    tests/unit/test_results.py)."""
    return results_of(write_synthetic_bundle(tmp_path_factory.mktemp("b") / "b"))


def test_a_ratio_check_agrees_disagrees_or_is_unmeasured(
    synthetic: list[ConfigurationResult],
) -> None:
    study = checked(
        {**CHECK, "policy": "ecmp", "to": {"oversubscription.agg": 1, "policy": "path-pinned"}},
        {**CHECK, "policy": "ecmp", "ratio": [0.9, 1.1], "size": "max"},
        policies=["ecmp", "path-pinned"],
    )
    scale = 1e-4
    both = [Figures("ok", synthetic, scale), Figures("ok", synthetic, scale)]
    first, second = (check.judge(study.variants, both) for check in study.checks)
    # ecmp / path-pinned on the same synthetic run: 0.65 / 0.88 per configuration
    assert first.outcome == "disagrees"  # 0.74 is outside [0.05, 0.5]
    assert first.measured == pytest.approx(0.65 / 0.88, rel=0.03)
    assert second.outcome == "agrees" and second.measured == pytest.approx(1.0)
    failed = [Figures("ok", synthetic, scale), Figures("failed", [], scale)]
    verdict = study.checks[1].judge(study.variants, failed)
    assert verdict.outcome == "unmeasured" and "failed" in verdict.text


def test_a_ratio_is_taken_at_real_speed(synthetic: list[ConfigurationResult]) -> None:
    study = checked({**CHECK, "ratio": [0.45, 0.55]}, policies=["ecmp"])
    figures = [Figures("ok", synthetic, 1e-4), Figures("ok", synthetic, 2e-4)]
    verdict = study.checks[0].judge(study.variants, figures)
    assert verdict.outcome == "agrees" and verdict.measured == pytest.approx(0.5)


def test_a_completes_check_reads_how_the_variant_ended() -> None:
    study = checked({"name": "cut off", "of": {"variant": 2}, "completes": False})
    assert study.checks[0].of.variant == 1
    ended = [Figures("ok", [], 1.0), Figures("failed", [], 1.0)]
    verdict: Verdict = study.checks[0].judge(study.variants, ended)
    assert verdict.outcome == "agrees"
    ended[1] = Figures("ok", [], 1.0)
    assert study.checks[0].judge(study.variants, ended).outcome == "disagrees"


def measured(*configurations: tuple[str, str, str, int]) -> list[Any]:
    """A run's results, one measured configuration per (policy, op, algorithm, size)."""
    from types import SimpleNamespace

    return [
        SimpleNamespace(
            configuration=SimpleNamespace(policy=p, collective=op, algorithm=a, size=size),
            measured=True,
        )
        for p, op, a, size in configurations
    ]


def test_a_completes_check_restricted_to_a_collective_and_size_reads_those_only() -> None:
    """The all-to-all at the max size was cut off, the all-reduce measured: a check on the
    all-to-all's max says it did not complete, one on the all-reduce that it did."""
    study = checked(
        {"name": "a2a cut", "of": {"variant": 2}, "completes": False, "collective": "all-to-all",
         "size": "max"},
        {"name": "ar ran", "of": {"variant": 2}, "completes": True, "collective": "all-reduce"},
        {"name": "a2a small ran", "of": {"variant": 2}, "completes": True,
         "collective": "all-to-all", "size": "256K"},
    )  # fmt: skip
    cut, ran, small = study.checks
    spec = study.variants[1].spec
    ring, direct = (c.algorithm for c in spec.collectives)
    sizes = spec.step_sizes("all-reduce")
    results = measured(
        *(("path-pinned", "all-reduce", ring, size) for size in sizes),
        ("path-pinned", "all-to-all", direct, spec.step_sizes("all-to-all")[0]),
    )
    figures = [Figures("ok", [], 1.0), Figures("failed", results, 1.0)]
    verdicts = [check.judge(study.variants, figures) for check in study.checks]
    assert [v.outcome for v in verdicts] == ["agrees", "agrees", "agrees"], verdicts
    assert "all-to-all at the max size: 1 of 1 configurations not measured" in verdicts[0].text
    # the whole run measured: the cut-off check disagrees
    everything = results + measured(("path-pinned", "all-to-all", direct, max(sizes)))
    figures[1] = Figures("failed", everything, 1.0)
    assert cut.judge(study.variants, figures).outcome == "disagrees"
    # nothing measured: the two that expect completion disagree
    figures[1] = Figures("failed", [], 1.0)
    assert ran.judge(study.variants, figures).outcome == "disagrees"
    assert small.judge(study.variants, figures).outcome == "disagrees"


@pytest.mark.parametrize(
    ("change", "key", "text"),
    [
        ({"collective": "all-gather"}, "study.checks[0].collective", "the study runs"),
        ({"size": "128K", "collective": "all-reduce"}, "study.checks[0].size", "the study runs"),
        ({"size": "max"}, "study.checks[0].collective", "the study runs several"),
        ({"to": {"variant": 1}}, "study.checks[0].to", "no to on a completes check"),
    ],
)
def test_a_completes_check_field_it_cannot_evaluate_is_refused(
    change: dict[str, Any], key: str, text: str
) -> None:
    with pytest.raises(ExperimentError) as caught:
        checked({"name": "cut", "of": {"variant": 2}, "completes": False, **change})
    assert caught.value.key == key, str(caught.value)
    assert text in str(caught.value)


def test_a_completes_check_needs_no_policy_and_then_reads_the_whole_run() -> None:
    study = checked(
        {"name": "cut", "of": {"variant": 2}, "completes": False},
        {"name": "ecmp cut", "of": {"variant": 2}, "completes": False, "policy": "ecmp"},
        policies=["ecmp", "path-pinned"],
    )
    whole, ecmp = study.checks
    spec = study.variants[1].spec
    results = measured(
        *(("ecmp", c.op, c.algorithm, s) for c in spec.collectives for s in spec.step_sizes(c.op))
    )
    figures = [Figures("ok", [], 1.0), Figures("failed", results, 1.0)]
    assert whole.judge(study.variants, figures).outcome == "agrees"  # the run failed
    assert ecmp.judge(study.variants, figures).outcome == "disagrees"  # ecmp's all measured


# --- the shipped studies --------------------------------------------------------------------


def test_the_shipped_studies_are_valid_and_ask_something() -> None:
    assert len(STUDIES) >= 4
    for path in STUDIES:
        study = load_study(path)
        assert study.question and study.expected and study.checks, path


# --- the study bundle -------------------------------------------------------------------------


def synthetic_study(root: Path) -> Path:
    """Three variants: a (ecmp and path-pinned), b (path-pinned, a's numbers), c failed."""
    write_synthetic_bundle(root / "variants" / "01-a", policies=("ecmp", "path-pinned"))
    write_synthetic_bundle(root / "variants" / "02-b", policies=("path-pinned",))
    document = {
        "schema_version": 1,
        "name": "synthetic-study",
        "question": "does b match a?",
        "expected": "yes",
        "axes": ["host_ports"],
        "variants": [
            {"index": 0, "label": "a", "settings": {"x": 1}, "bundle": "variants/01-a",
             "status": "ok"},
            {"index": 1, "label": "b", "settings": {"x": 2}, "bundle": "variants/02-b",
             "status": "ok"},
            {"index": 2, "label": "c", "settings": {"x": 3}, "bundle": "variants/03-c",
             "status": "failed", "error": "workers hung"},
        ],
        "verdicts": [{"check": "b matches a", "verdict": "agrees", "text": "1.000"}],
        "verdict": "agrees",
    }  # fmt: skip
    (root / STUDY_FILE).write_text(json.dumps(document))
    return root


def test_the_study_bundle_renders_the_variants_side_by_side(tmp_path: Path) -> None:
    root = synthetic_study(tmp_path / "study")
    study, lines = render_study(root, plots=True)
    summary = json.loads((root / "summary.json").read_text())
    variants = {record["variant"] for record in summary["configurations"]}
    assert variants == {"a", "b"}
    assert len(summary["configurations"]) == 12 + 6  # 2 policies x 6, then 6
    assert all("settings" in record for record in summary["configurations"])
    report = (root / "report.txt").read_text()
    assert "question: does b match a?" in report and "verdict: agrees: b matches a" in report
    table = lines[lines.index("# all-reduce (ring)") :]
    assert table[1].split()[1:] == ["variant", "ecmp", "path-pinned", "status"]
    row_a = next(line for line in table if line.strip().startswith("a "))
    assert row_a.split()[2::2] == ["(1.000)", "(1.000)"]
    row_b = next(line for line in table if line.strip().startswith("b "))
    # b ran path-pinned alone, with a's numbers: no ecmp figure, path-pinned 1.000 of a's
    assert row_b.split()[1:5] == ["-", "(-)", row_a.split()[3], "(1.000)"]
    row_c = next(line for line in lines if line.strip().startswith("c "))
    assert "failed" in row_c
    plots = sorted(p.name for p in (root / "plots").iterdir())
    assert plots == ["busbw-all-reduce-ring.png", "busbw-all-to-all-direct.png", "study-busbw.png"]
    assert not math.isnan(study.variants[1].scale)


def test_compare_sets_every_variant_beside_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = synthetic_study(tmp_path / "study")
    assert main(["compare", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.count("# === A a  vs  B b") == 1 and "=== A a  vs  B c" not in out  # c: failed
    averages = [line for line in out.splitlines() if line.startswith("# Avg bus bandwidth")]
    assert averages and all(line.endswith("B/A 1.000") for line in averages)
    # two studies: variant by variant, by label
    assert main(["compare", str(root), str(root)]) == 0
    out = capsys.readouterr().out
    assert "# === A a  vs  B a" in out and "# === A b  vs  B b" in out
    assert main(["compare", str(root), str(root / "variants" / "01-a")]) == 2
    assert "a study bundle, as A is" in capsys.readouterr().err


def test_a_variant_above_the_emulators_capacity_refuses_the_study_by_name(tmp_path: Path) -> None:
    """The load guard judges every variant before anything is made: the one above the safe
    share is named, and no bundle is created."""
    from orchestrator.calibration.capacity import Calibration
    from orchestrator.run.runner import RunOptions
    from orchestrator.study.runner import StudyRunner

    study = parse_study(base(sweep={"scale": [0.1e-4, 1e-3]}), "s.yaml")
    # 8 GPUs x 2 ports x 200G x 1e-3 x ~4 hops is over 10 Gbit/s of hops: above 5 Gbit/s
    capacity = Calibration(capacity_bps=5e9, bound="bracketed")
    out = tmp_path / "study"
    runner = StudyRunner(study, RunOptions(out=out), calibration=capacity)
    with pytest.raises(ExperimentError) as caught:
        runner.run()
    assert "variant 2 (scale=0.001)" in str(caught.value)
    assert caught.value.key == "load_limit.force"
    assert not out.exists()
    forced = StudyRunner(study, RunOptions(out=out, force=True), calibration=capacity)
    verdicts = forced.judge_loads()  # forced: judged, not refused (emulator-bound)
    assert [v.refused for v in verdicts] == [False, False]
    assert [v.emulator_bound for v in verdicts] == [False, True]


def test_the_study_progress_weighs_every_variants_steps(capsys: pytest.CaptureFixture[str]) -> None:
    """One bar over the whole study: every variant's steps weighed up front, each variant's
    view advancing it by its own steps' weights."""
    from orchestrator.study.progress import StudyProgress

    study = parse_study(base(sweep={"scale": [0.3e-4, 0.6e-4]}), "s.yaml")
    progress = StudyProgress(study.variants, enabled=True)
    steps = [variant.spec.steps() for variant in study.variants]
    assert len(progress.weights) == sum(len(s) for s in steps) == 2 * 2 * 2
    # half the rate: the bytes of a step take about twice as long at the smaller scale
    first, second = (progress.weights[(i, 3)] for i in (0, 1))
    assert first > 1.5 * second
    for variant, variant_steps in zip(study.variants, steps, strict=True):
        view = progress.view(variant)
        for step in variant_steps:
            view.step(step)
            view.done(step)
        view.close()  # a variant's close leaves the study's bar open
        assert progress.bar is not None
    assert progress.bar.n == pytest.approx(progress.bar.total, abs=0.5)
    progress.close()
    assert "variant 2/2 scale=6e-05" in capsys.readouterr().err


def test_the_study_plot_draws_the_chosen_metric(tmp_path: Path) -> None:
    root = synthetic_study(tmp_path / "study")
    document = json.loads((root / STUDY_FILE).read_text())
    document["plot"] = {"metric": "algbw", "x": "x"}
    (root / STUDY_FILE).write_text(json.dumps(document))
    render_study(root, plots=True)
    assert (root / "plots" / "study-algbw.png").is_file()
    assert not (root / "plots" / "study-busbw.png").exists()
    study = parse_study(
        base(sweep={"iterations": [2, 3]}, study={"plot": {"metric": "algbw", "x": "iterations"}}),
        "s.yaml",
    )
    assert study.plot == {"metric": "algbw", "x": "iterations"}
