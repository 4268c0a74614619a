"""Forecasts as ``astral run`` prints measurements: nccl-tests tables, records, the cell note.

A forecast row is an nccl-tests row whose time is the predicted one (#wrong ``N/A``:
nothing was verified), rendered by the same table function as a run's
(orchestrator.results.summary.configuration_table), so that a forecast and a measurement
read alike. :func:`record` is one configuration as ``summary.json`` keeps it (same keys,
``forecast`` holding the band and the parts); :func:`forecast_record` is what a run's
bundle keeps beside each measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.collectives.nccl import NcclRow
from orchestrator.forecast.model import Prediction
from orchestrator.results.store import Configuration, ForecastRecord
from orchestrator.results.summary import (
    ConfigurationResult,
    configuration_record,
    configuration_table,
)


@dataclass(frozen=True)
class Forecasted:
    """One configuration and its prediction."""

    configuration: Configuration
    prediction: Prediction
    ceiling: Ceiling | None = None

    def result(self, scale: float) -> ConfigurationResult:
        c, p = self.configuration, self.prediction
        row = NcclRow.of(
            c.collective,
            size=c.size,
            count=c.count,
            dtype=c.dtype,
            ranks=c.ranks,
            time_us=p.time_us,
            wrong=None,
        )
        return ConfigurationResult(
            configuration=c,
            row=row,
            busbw_min=p.busbw_p10,
            busbw_max=p.busbw_p90,
            timed=0,
            scale=scale,
            ceiling=self.ceiling,
        )


def band_text(prediction: Prediction, scale: float) -> str:
    """``p10-p90 busbw 12.1-14.0 real`` where hashing spreads the forecast, else ''."""
    if prediction.salts <= 1 or prediction.p10_us == prediction.p90_us:
        return ""
    low, high = prediction.band_us
    return (
        f"p10-p90 busbw {prediction.busbw_p10 / scale:.2f}-{prediction.busbw_p90 / scale:.2f} "
        f"real over {prediction.salts} hash draws, "
        f"{prediction.busbw_at(high) / scale:.2f}-{prediction.busbw_at(low) / scale:.2f} "
        "with the model's error"
    )


def forecast_table(
    forecasts: Sequence[Forecasted], head: Sequence[str], scale: float, latency: str | None
) -> str:
    """One group's table (a policy and a collective), as ``astral run`` prints it."""
    results = [f.result(scale) for f in forecasts]
    table = configuration_table(results, head, scale, [], latency)
    notes = [band_text(f.prediction, scale) for f in forecasts]
    lines = table.splitlines()
    out = []
    row = 0
    for line in lines:
        if not line.startswith("#") and row < len(notes):
            line = line + (f"  {notes[row]}" if notes[row] else "")
            row += 1
        out.append(line)
    return "\n".join(out) + "\n"


def record(forecast: Forecasted, scale: float) -> dict[str, Any]:
    """One configuration with summary.json's keys (what only a measurement has, such as
    ``wrong``, is null), ``forecast`` holding the band and the parts."""
    return {
        **configuration_record(forecast.result(scale)),
        "forecast": prediction_dict(forecast.prediction),
    }


def _number(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def prediction_dict(p: Prediction) -> dict[str, Any]:
    return {
        "time_us": _number(p.time_us),
        "p10_time_us": _number(p.p10_us),
        "p90_time_us": _number(p.p90_us),
        "busbw_GBps": _number(p.busbw),
        "busbw_p10_GBps": _number(p.busbw_p10),
        "busbw_p90_GBps": _number(p.busbw_p90),
        # the prediction interval: the draws widened by the model's calibrated error
        "band_busbw_p10_GBps": _number(p.busbw_at(p.band_us[1])),
        "band_busbw_p90_GBps": _number(p.busbw_at(p.band_us[0])),
        "hash_draws": p.salts,
        "latency_us": _number(p.latency_us),
        "transfer_us": _number(p.transfer_us),
        "steps": p.steps,
    }


def forecast_record(prediction: Prediction, calibrated: bool) -> ForecastRecord:
    """What the bundle keeps of a prediction (orchestrator.results.store.ForecastRecord)."""
    p = prediction
    low, high = p.band_us  # the prediction interval: the draws and the model's error
    return ForecastRecord(
        time_us=p.time_us,
        p10_time_us=low,
        p90_time_us=high,
        busbw=p.busbw,
        busbw_p10=p.busbw_at(high),
        busbw_p90=p.busbw_at(low),
        hash_draws=p.salts,
        calibrated=calibrated,
    )
