"""An experiment that replays a training workload (``workload:``) instead of collectives:
what the reader accepts, what it refuses (naming the file and the key), and the steps it
expands into. The replay itself runs in tests/integration/test_workload_replay.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.collectives.program import PROGRAM
from orchestrator.run.experiment import load_experiment
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import load_workload
from tests.helpers import REPO
from topologies.errors import ConfigError, ExperimentError, WorkloadError

BASE = """\
name: replay
fabric: astral-small
policies: [ecmp, path-pinned]
iterations: 2
warmup: 0
scale: 0.6e-4
"""


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_workload_replaces_collectives_and_sizes_one_step_per_policy(tmp_path: Path) -> None:
    spec = load_experiment(write(tmp_path, BASE + "workload: deepseek-like\n"))
    assert spec.workload is not None and spec.workload.name == "deepseek-like"
    assert spec.workload_source == str(REPO / "workloads" / "deepseek-like.yaml")
    steps = spec.steps()
    assert [s.policy for s in steps] == ["ecmp", "path-pinned"]
    program = iteration_program(spec.workload, 0.6e-4)
    for step in steps:
        assert step.collective.op == PROGRAM and step.collective.algorithm == program.name
        assert step.size == program.elements() * 4 and step.ranks == 8
        # the busiest rank's compute, at this scale: what no replay can beat
        assert step.floor_s == pytest.approx(max(program.compute_of(r) for r in range(8)))
    assert set(spec.step_latencies()) == {0, 1}


def test_a_workload_file_path_starts_at_the_experiment_directory(tmp_path: Path) -> None:
    text = (REPO / "workloads" / "gpt3-like.yaml").read_text()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "mine.yaml").write_text(text.replace("name: gpt3-like", "name: mine"))
    spec = load_experiment(write(tmp_path, BASE + "workload: w/mine.yaml\n"))
    assert spec.workload is not None and spec.workload.name == "mine"


def test_an_inline_workload_is_read_and_its_errors_name_workload_keys(tmp_path: Path) -> None:
    import yaml

    document = yaml.safe_load((REPO / "workloads" / "gpt3-like.yaml").read_text())
    inline = yaml.safe_dump({"workload": document}, sort_keys=False)
    spec = load_experiment(write(tmp_path, BASE + inline))
    assert spec.workload_source == "inline"
    document["model"]["layers"] = 0
    inline = yaml.safe_dump({"workload": document}, sort_keys=False)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(write(tmp_path, BASE + inline))
    assert caught.value.key == "workload.model.layers"


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("workload: deepseek-like\ncollectives: [all-reduce]\n", "collectives"),
        ("workload: deepseek-like\nsizes: {min: 1K, max: 1K}\n", "sizes"),
        ("workload: no-such-workload\n", "workload"),
        ("workload: 7\n", "workload"),
        ("workload: missing/file.yaml\n", "workload"),
        ("", "collectives"),  # neither a workload nor collectives
    ],
)
def test_a_malformed_workload_key_is_refused_naming_the_key(
    tmp_path: Path, extra: str, key: str
) -> None:
    path = write(tmp_path, BASE + extra)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    assert caught.value.key == key and caught.value.file == str(path)


def test_a_layout_that_does_not_fill_the_placement_names_the_workload_file(
    tmp_path: Path,
) -> None:
    # gpt3-like's dp is auto; 6 GPUs do not divide by its tp x pp
    path = write(tmp_path, BASE + "workload: gpt3-like\nplacement: {gpus: 6}\n")
    with pytest.raises(WorkloadError) as caught:
        load_experiment(path)
    assert caught.value.file.endswith("gpt3-like.yaml")
    assert str(path) in caught.value.detail
    assert isinstance(caught.value, ConfigError)


def test_the_workload_is_the_one_workload_show_reads(tmp_path: Path) -> None:
    spec = load_experiment(write(tmp_path, BASE + "workload: gpt3-like\n"))
    assert spec.workload == load_workload(
        REPO / "workloads" / "gpt3-like.yaml", gpus=8, gpus_per_server=2
    )


def test_a_workload_studys_report_sets_the_variants_iterations_side_by_side(
    tmp_path: Path,
) -> None:
    import json

    from orchestrator.study.bundle import StudyBundle, VariantRun, workload_table

    variants = []
    for index, (label, real_ms) in enumerate([("agg=1", 3.0), ("agg=4", 3.6)]):
        directory = f"variants/{index + 1:02d}"
        (tmp_path / directory).mkdir(parents=True)
        record = {"real_ms": real_ms, "forecast": {"real_ms": real_ms * 0.95}}
        document = {"policies": {"path-pinned": record}}
        (tmp_path / directory / "workload.json").write_text(json.dumps(document))
        variants.append(VariantRun(index, label, {}, directory, status="ok"))
    lines = workload_table(StudyBundle(tmp_path, {}, variants))
    assert "path-pinned" in lines[2]
    assert lines[3].split() == ["agg=1", "3.000", "(2.850)", "[1.000]", "ok"]
    assert lines[4].split() == ["agg=4", "3.600", "(3.420)", "[1.200]", "ok"]
    # a study of collectives has no workload table
    assert workload_table(StudyBundle(tmp_path / "none", {}, [])) == []


def test_forecasting_a_workload_experiment_gives_a_row_per_policy_and_what_if(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    path = write(tmp_path, BASE + "workload: gpt3-like\n")
    assert main(["forecast", str(path), "--set", "oversubscription.agg=4"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:2] == "  "]
    assert [r[0] for r in rows] == ["ecmp", "path-pinned", "ecmp:", "path-pinned:"]
    seconds = [float(r[-8]) for r in rows]  # the iteration column
    assert all(s > 0 for s in seconds)
    # a thinner aggregation layer cannot make the iteration shorter
    assert seconds[2] >= seconds[0] and seconds[3] >= seconds[1]
    # the experiment's fabric and policies are its own
    assert main(["forecast", str(path), "--fabric", "hpn-like"]) == 2
    assert "none of them with an experiment" in capsys.readouterr().err


def test_the_python_api_reads_a_replays_workload_figures(tmp_path: Path) -> None:
    import json

    from orchestrator.api import Results

    assert Results(tmp_path, [], False).workload is None  # a run of collectives
    document = {"workload": "mine", "policies": {"ecmp": {"real_ms": 3.0}}}
    (tmp_path / "workload.json").write_text(json.dumps(document))
    assert Results(tmp_path, [], False).workload == document


def test_astral_compare_sets_two_replays_side_by_side_per_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from orchestrator.cli import main

    def replay(real_ms: float, exposed_dp: float, scale: float) -> dict[str, object]:
        emulated = real_ms / 1e3 / scale
        return {
            "real_ms": real_ms,
            "iteration_s": emulated,
            "tokens_per_s": 1e6 / real_ms,
            "mfu": 0.3 / real_ms,
            "exposed_s": {"tp": 0.0, "ep": 0.0, "pp": 0.0, "dp": exposed_dp / 1e3 / scale},
            "wrong": 0,
        }

    bundles = {}
    for name, scale, ms in (("a", 1e-4, 3.0), ("b", 5e-5, 3.6)):
        bundles[name] = tmp_path / name
        bundles[name].mkdir()
        document = {
            "workload": "gpt3-like",
            "scale": scale,
            "policies": {"ecmp": replay(ms, 0.2, scale), "path-pinned": replay(ms, 0.1, scale)},
        }
        (bundles[name] / "workload.json").write_text(json.dumps(document))
    a, b = str(bundles["a"]), str(bundles["b"])
    assert main(["compare", a, b]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line[:2] == "  "]
    # per policy: A ms, B ms, B/A at real speed, whatever each bundle's scale
    assert [r[:6] for r in rows] == [
        ["ecmp", "->", "ecmp", "3.000", "3.600", "1.200"],
        ["path-pinned", "->", "path-pinned", "3.000", "3.600", "1.200"],
    ]
    assert "0.200->0.200" in rows[0]  # dp exposed, ms at real speed on both sides
    assert main(["compare", a, b, "--a-policy", "ecmp", "--b-policy", "path-pinned"]) == 0
    assert len([x for x in capsys.readouterr().out.splitlines() if x[:2] == "  "]) == 1
    assert main(["compare", a, b, "--a-policy", "adaptive"]) == 2  # neither ran it
    assert "ran: ecmp, path-pinned, found 'adaptive'" in capsys.readouterr().err
    # a bundle of collectives is not a replay to compare with
    (tmp_path / "collectives").mkdir()
    assert main(["compare", a, str(tmp_path / "collectives")]) == 2
    assert "a bundle that replayed a workload" in capsys.readouterr().err
