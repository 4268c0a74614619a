"""The play-out at sizes far beyond what the emulator runs (orchestrator/forecast/playout.py):
its cost does not grow with the bytes, its figures settle at the ceiling, and a size past
what a double counts to the byte is a sentence (orchestrator/collectives/sizes.py).

A 64 TiB operation at the default experiment's rates runs the play-out's clock to 10^8 s,
where a double cannot resolve the last bytes of a fast connection: ``astral forecast``
with ``sizes: {min: 64T, max: 64T}`` stepped by zero forever before."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from orchestrator.collectives.sizes import MAX_SIZE, parse_size
from orchestrator.forecast.configurations import Forecaster
from orchestrator.forecast.model import ConfigurationModel
from orchestrator.forecast.playout import play_out
from orchestrator.forecast.report import Forecasted
from orchestrator.run.experiment import parse_experiment
from orchestrator.worker.spec import workers_from_description
from tests.helpers import REPO, preset_description, within
from topologies.description import FabricDescription
from topologies.errors import ExperimentError

TiB = 1 << 40
GiB = 1 << 30


def default_experiment(size: object) -> dict[str, Any]:
    document = yaml.safe_load((REPO / "experiments" / "default.yaml").read_text())
    assert isinstance(document, dict)
    document["sizes"] = {"min": size, "max": size}
    return document


def forecast_default(size: str) -> dict[tuple[str, str], Forecasted]:
    """What ``astral forecast`` forecasts of experiments/default.yaml at ``size``, without a
    stored calibration (the machine's would make the test depend on the machine)."""
    spec = parse_experiment(default_experiment(size), "default.yaml", REPO / "experiments")
    forecaster = Forecaster(
        FabricDescription.of(spec.fabric_model()),
        spec.gpus,
        host_ports=spec.host_ports,
        calibration=None,
        iterations=spec.iterations,
        warmup=spec.warmup,
        min_batch_s=spec.batch_floor_s,
    )
    return {(s.policy, s.collective.op): forecaster.forecast(s) for s in spec.steps()}


def test_a_64_tib_forecast_finishes_at_the_busbw_of_64_gib_below_the_ceiling() -> None:
    with within(60.0):
        huge = forecast_default("64T")
    large = forecast_default("64G")
    assert huge.keys() == large.keys() and len(huge) == 4
    for key, forecast in huge.items():
        busbw = forecast.prediction.busbw
        assert busbw == pytest.approx(large[key].prediction.busbw, rel=1e-3), key
        assert forecast.ceiling is not None
        assert busbw <= forecast.ceiling.busbw * (1 + 1e-6), key


@pytest.mark.parametrize(
    ("collective", "algorithm"), [("all-reduce", "ring"), ("all-to-all", "direct")]
)
def test_a_play_out_takes_as_many_events_at_any_size(collective: str, algorithm: str) -> None:
    """From 1 GiB (bandwidth-bound) to the largest size there is, every policy's and hash
    draw's play-out takes as many events, give or take the few that rounding merges: the
    clock's resolution is not a step."""
    description = preset_description("astral-small")
    model = ConfigurationModel(description, workers_from_description(description))
    figures = model.calibration.figures()
    channels = model.channels_for(collective, algorithm)
    with within(60.0):
        for policy in ("ecmp", "path-pinned"):
            for salt in range(model.draws_for(policy, collective, algorithm)):
                fabric = model.playout_fabric(policy, collective, algorithm, salt)
                events = {
                    size: play_out(fabric, collective, algorithm, size, channels, figures, 8).events
                    for size in (GiB, 64 * TiB, MAX_SIZE)
                }
                for size in (64 * TiB, MAX_SIZE):
                    assert abs(events[size] - events[GiB]) <= 4, (policy, salt, events)


def test_a_size_beyond_2_to_the_53_bytes_is_a_sentence_naming_the_key() -> None:
    assert parse_size("8192T") == MAX_SIZE == 1 << 53
    with pytest.raises(ValueError, match="a size of at most 8192T"):
        parse_size("8193T")
    with pytest.raises(ValueError, match="at most 8192T"):
        parse_size(10**400)  # as a double it would be infinite
    with pytest.raises(ExperimentError) as info:
        parse_experiment(default_experiment("16384T"), "e.yaml", REPO / "experiments")
    assert info.value.key == "sizes.min"
    assert str(info.value).startswith("e.yaml: key 'sizes.min': expected a size of at most 8192T")


def test_full_size_says_why_a_size_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["forecast", "--full-size", "--size", "16384T"]) == 2
    assert "at most 8192T" in capsys.readouterr().err
