"""``astral forecast`` of a workload honours ``--calibration`` as the experiment forecast
does (orchestrator/commands/workload_forecast.py, orchestrator/commands/forecast.py): a
named file is used, ``none`` is the bare model whatever this machine's file, a missing
file is refused, and the options that would write a calibration are refused. Pure: no
root, no emulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.forecast.calibration import (
    ENV_VAR,
    ForecastCalibration,
    save_forecast_calibration,
)
from tests.helpers import REPO

WORKLOAD = REPO / "workloads" / "gpt3-like.yaml"
#: a calibration far from the bare model: every operation 0.5 s more, TCP at half the rate
SLOW = ForecastCalibration(0.05, 0.5, 0.5, 0.0, 1.0, cells=9, fabric="astral-small")


@pytest.fixture
def slow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The slow calibration's file; this machine's default file is one that is absent."""
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "machine.json"))
    return save_forecast_calibration(SLOW, tmp_path / "slow.json")


def iteration_s(capsys: pytest.CaptureFixture[str], *options: str) -> float:
    assert main(["forecast", str(WORKLOAD), "--json", *options]) == 0
    return float(json.loads(capsys.readouterr().out)["iteration"]["iteration_s"])


def test_a_workload_forecast_uses_the_calibration_file_named(
    slow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = iteration_s(capsys, "--calibration", "none")
    assert iteration_s(capsys) == pytest.approx(bare)  # no file on this machine: bare
    assert iteration_s(capsys, "--calibration", str(slow)) > bare * 1.2


def test_calibration_none_ignores_the_machines_file(
    slow: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bare = iteration_s(capsys, "--calibration", "none")
    monkeypatch.setenv(ENV_VAR, str(slow))  # this machine's file is the slow one
    assert iteration_s(capsys) > bare * 1.2
    assert iteration_s(capsys, "--calibration", "none") == pytest.approx(bare)


def test_the_table_names_the_calibration_used(
    slow: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["forecast", str(WORKLOAD), "--calibration", str(slow)]) == 0
    out = capsys.readouterr().out
    assert "# forecast calibration" in out and "operation overhead 500.00 ms" in out


def test_a_workload_experiment_forecast_uses_the_calibration_named(
    slow: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    experiment = tmp_path / "replay.yaml"
    experiment.write_text(
        "name: replay\nfabric: astral-small\npolicies: [path-pinned]\niterations: 2\n"
        "warmup: 0\nscale: 0.6e-4\nworkload: gpt3-like\n",
        encoding="utf-8",
    )

    def seconds(*options: str) -> float:
        assert main(["forecast", str(experiment), "--json", *options]) == 0
        return float(json.loads(capsys.readouterr().out)["iterations"][0]["iteration_s"])

    assert seconds("--calibration", str(slow)) > seconds("--calibration", "none") * 1.2


@pytest.mark.parametrize(
    ("options", "text"),
    [
        (["--calibration", "absent.json"], "no such file"),
        (["--calibrate-from", "bundle"], "none of them with a workload"),
    ],
)
def test_a_calibration_option_that_cannot_apply_is_refused(
    options: list[str],
    text: str,
    slow: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = [str(tmp_path / o) if o.endswith((".json", "bundle")) else o for o in options]
    assert main(["forecast", str(WORKLOAD), *options]) == 2
    captured = capsys.readouterr()
    assert text in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


def test_a_damaged_calibration_file_is_read_only_where_it_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The options are checked before the file is read, and the link-class model of
    ``--full-size``, which takes no calibration, does not read it: a damaged file of this
    machine's neither hides the refusal of an option nor stops a full-size forecast."""
    damaged = tmp_path / "machine.json"
    damaged.write_text("{not json")
    monkeypatch.setenv(ENV_VAR, str(damaged))
    full_size = REPO / "workloads" / "full-size" / "gpt3-175b.yaml"
    assert main(["forecast", str(full_size), "--full-size", "--json"]) == 0
    capsys.readouterr()
    assert main(["forecast", str(WORKLOAD), "--calibrate-from", str(tmp_path)]) == 2
    assert "--calibrate-from" in capsys.readouterr().err
    assert main(["forecast", str(WORKLOAD)]) == 2  # flow by flow reads it: said
    assert str(damaged) in capsys.readouterr().err
