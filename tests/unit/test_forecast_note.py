"""The forecast beside a measured row says when it was made without this machine's
calibration: the bare model is not what the row's error is to be judged by."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.results.store import ForecastRecord
from orchestrator.results.summary import forecast_note

CALIBRATED = ForecastRecord(
    time_us=1e6,
    p10_time_us=1e6,
    p90_time_us=1e6,
    busbw=2e-4,
    busbw_p10=2e-4,
    busbw_p90=2e-4,
    hash_draws=1,
    calibrated=True,
)


def test_a_calibrated_forecast_reads_as_before() -> None:
    assert forecast_note(CALIBRATED, 1e-4, 1e-4) == "forecast busbw 2.00 real (+100.0%)"


def test_an_uncalibrated_forecast_says_so() -> None:
    note = forecast_note(replace(CALIBRATED, calibrated=False), 1e-4, 1e-4)
    assert note == "forecast busbw 2.00 real (+100.0%) uncalibrated"


def test_the_band_follows_the_mark() -> None:
    hashed = replace(CALIBRATED, calibrated=False, hash_draws=16, busbw_p10=1e-4, busbw_p90=3e-4)
    note = forecast_note(hashed, 1e-4, 1e-4)
    assert note.startswith("forecast busbw 2.00 real (+100.0%) uncalibrated, p10-p90 1.00-3.00")
