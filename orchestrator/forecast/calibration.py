"""What the model cannot know from the fabric: this machine's per-step costs, measured.

The fabric gives the rates and latencies; what the emulator adds on top is the machine's:
how long a worker takes per step beyond its bytes (the step's bookkeeping, its messages'
first round trips, waking up threads), per operation, and the share of the fluid max-min
rate TCP actually reaches on the emulated links (slow start after a step's idle gap, the
shapers' queues: in the play-out, the share of its narrowest link's rate a connection
reaches, since connections that share a link fill it; orchestrator/forecast/playout.py;
the step model below still divides every transfer by it, shared links too). The step
model takes them as these numbers::

    time = operation latency + operation overhead
           + sum over steps of (wait + transfer / efficiency + step overhead)
           - overlap x min(wait, transfer / efficiency), for every step but the first

(a step's latency wait is partly hidden behind the transfers still under way from the step
before: a rank's sends sit in its kernel's buffers and keep moving while it waits)

and a fifth, ``incast``: the share of a GPU's NIC downlink TCP keeps when connections from
several senders converge on it in one step (direct all-to-all's incast into the ToR's
shallow port queue: the model lowers that link's capacity by it). A calibration measures
them: a short real run on this machine (``astral forecast
--calibrate``: the calibration experiment below, on astral-small, under path-pinned and
shortest, whose paths are deterministic), then a fit of the measured time per operation:
the play-out's figures on a grid by the cells' mean absolute relative error
(:func:`fit_played`), the step model's by least squares weighted so that every cell's
relative error counts alike (:func:`fit`: the overlap and the efficiency on a grid, the
overheads by least squares). Only fabric rates and measured figures enter: nothing
depends on how the emulator shapes its links.

File (JSON, version 1; default ``/var/lib/astral/forecast.json``, ``$ASTRAL_FORECAST`` or
``--calibration`` override), beside the emulator's capacity file and in its style::

    {"version": 1, "kind": "forecast", "step_overhead_s": 0.0021,
     "operation_overhead_s": 0.004, "efficiency": 0.93, "overlap": 0.8, "incast": 0.85,
     "measured_at": "2026-...Z",
     "cells": 12, "rms_relative_error": 0.02, "source": "/tmp/.../bundle",
     "fabric": "astral-small", "conditions": {"cpus": 2, "loadavg": [...]}}
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.forecast.playout import Figures
from topologies.errors import ConfigError

VERSION = 1
KIND = "forecast"
ENV_VAR = "ASTRAL_FORECAST"
DEFAULT_PATH = Path("/var/lib/astral/forecast.json")
RERUN_HINT = "run `sudo astral forecast --calibrate` again to replace it"
#: the send buffer assumed by a calibration file written before the play-out fitted one
DEFAULT_SEND_BUFFER = 256 * 1024

#: The calibration experiment: deterministic paths, two algorithms of different step
#: counts, sizes from latency-bound to bandwidth-bound, batches of at least 10 s.
CALIBRATION_EXPERIMENT = {
    "name": "forecast-calibration",
    "fabric": "astral-small",
    "policies": ["path-pinned", "shortest"],
    "host_ports": "balanced",
    "collectives": [
        {"op": "all-reduce", "algorithm": "ring"},
        {"op": "all-reduce", "algorithm": "hierarchical"},
        {"op": "all-to-all", "algorithm": "direct"},
    ],
    "sizes": {"min": "64K", "max": "4M", "factor": 4},
    "iterations": 3,
    "warmup": 1,
    # batches of 10 s: the direct all-to-all's operations vary by a quarter from one to
    # the next (a retransmission timeout here and there), and the fit needs their mean
    "min_batch": "10s",
    "scale": 0.6e-4,
}


@dataclass(frozen=True)
class Parts:
    """The bare model's parts of one operation (emulated seconds): the per-operation
    latency, then per step (repeat, latency wait, fluid transfer time)."""

    operation_latency: float
    steps: tuple[tuple[int, float, float], ...]

    @property
    def latency(self) -> float:
        return self.operation_latency + sum(r * w for r, w, _ in self.steps)

    @property
    def transfer(self) -> float:
        return sum(r * t for r, _, t in self.steps)

    @property
    def step_count(self) -> int:
        return sum(r for r, _, _ in self.steps)


@dataclass(frozen=True)
class ForecastCalibration:
    """The machine's figures (emulated seconds); the defaults are the bare model's."""

    step_overhead_s: float = 0.0
    operation_overhead_s: float = 0.0
    efficiency: float = 1.0
    overlap: float = 0.0
    #: the share of a GPU's NIC downlink TCP keeps when connections from several senders
    #: converge on it in one step (incast into the ToR's shallow port queue)
    incast: float = 1.0
    #: undelivered bytes a connection's kernel takes before the worker's ``sendall``
    #: returns (the play-out's send buffer, orchestrator/forecast/playout.py)
    send_buffer_bytes: float = 0.0
    measured_at: str = ""
    cells: int = 0
    rms_relative_error: float = 0.0
    #: the rms relative error on cells the fit did not see (leave-one-out over its
    #: cells): what a forecast's error is expected to be, where the rms above is the
    #: fit's own; 0 in a file written before it was measured
    held_out_error: float = 0.0
    source: str = ""
    fabric: str = ""
    conditions: Mapping[str, Any] = field(default_factory=dict)

    def time(self, parts: Parts) -> float:
        """Emulated seconds of one operation: the module docstring's formula."""
        total = parts.operation_latency + self.operation_overhead_s
        first = True
        for repeat, wait, transfer in parts.steps:
            moving = transfer / self.efficiency
            hidden = self.overlap * min(wait, moving)
            overlapped = repeat - 1 if first else repeat
            total += repeat * (wait + moving + self.step_overhead_s) - overlapped * hidden
            first = False
        return total

    def figures(self) -> Figures:
        """The figures the play-out takes (orchestrator/forecast/playout.py)."""
        return Figures(
            step_overhead_s=self.step_overhead_s,
            operation_overhead_s=self.operation_overhead_s,
            efficiency=self.efficiency,
            incast=self.incast,
            send_buffer=self.send_buffer_bytes,
        )

    @property
    def measured(self) -> bool:
        return self.cells > 0

    @property
    def expected_error(self) -> float:
        """The relative error a forecast is expected to make: the held-out one where the
        file has it, else the fit's own rms."""
        return self.held_out_error or self.rms_relative_error

    def describe(self) -> str:
        if not self.measured:
            return (
                "forecast calibration: none (the bare model: no per-step overhead, TCP at the "
                "fluid rate; `sudo astral forecast --calibrate` measures this machine's)"
            )
        held_out = (
            f", on cells left out of the fit {self.held_out_error:.1%}"
            if self.held_out_error
            else ""
        )
        return (
            f"forecast calibration {self.measured_at}: step overhead "
            f"{self.step_overhead_s * 1e3:.2f} ms, operation overhead "
            f"{self.operation_overhead_s * 1e3:.2f} ms, TCP efficiency {self.efficiency:.2f}, "
            f"send buffer {self.send_buffer_bytes / 1024:.0f} KiB, incast {self.incast:.2f}, "
            f"latency hidden behind transfers (step model) {self.overlap:.2f} "
            f"(fit on {self.cells} cells of {self.fabric}, rms error "
            f"{self.rms_relative_error:.1%}{held_out})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, "kind": KIND, **asdict(self)}


def calibration_path(explicit: str | Path | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else DEFAULT_PATH


def load_forecast_calibration(path: str | Path | None = None) -> ForecastCalibration | None:
    """The stored calibration, None when there is none; a damaged file is a ConfigError
    naming the key and what was expected."""
    where = calibration_path(path)
    if not where.exists():
        return None
    try:
        data = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(str(where), "(file)", "a forecast calibration (JSON)", str(err)) from None
    if not isinstance(data, dict):
        raise ConfigError(str(where), "(file)", "a JSON object", type(data).__name__)
    if data.get("version") != VERSION or data.get("kind") != KIND:
        raise ConfigError(
            str(where),
            "version",
            f"a forecast calibration of version {VERSION} ({RERUN_HINT})",
            data.get("version"),
        )
    values: dict[str, Any] = {}
    data.setdefault("incast", 1.0)  # a file from before the incast share was fitted
    # a file from before the play-out: the send buffer Linux's autotuning reaches here
    data.setdefault("send_buffer_bytes", DEFAULT_SEND_BUFFER)
    for key, low, high in (
        ("step_overhead_s", 0.0, 60.0),
        ("operation_overhead_s", 0.0, 600.0),
        ("efficiency", 1e-3, 1.0),
        ("overlap", 0.0, 1.0),
        ("incast", 0.1, 1.0),
        ("send_buffer_bytes", 0.0, 1e9),
    ):
        value = data.get(key)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not low <= value <= high:  # type: ignore[operator]
            expected = f"a number in {low:g}..{high:g} ({RERUN_HINT})"
            raise ConfigError(str(where), key, expected, value)
        values[key] = float(value)  # type: ignore[arg-type]
    return ForecastCalibration(
        **values,
        measured_at=str(data.get("measured_at", "")),
        cells=int(data.get("cells", 0) or 0),
        rms_relative_error=float(data.get("rms_relative_error", 0.0) or 0.0),
        held_out_error=float(data.get("held_out_error", 0.0) or 0.0),
        source=str(data.get("source", "")),
        fabric=str(data.get("fabric", "")),
        conditions=dict(data.get("conditions") or {}),
    )


def save_forecast_calibration(
    calibration: ForecastCalibration, path: str | Path | None = None
) -> Path:
    where = calibration_path(path)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_name(f".{where.name}.tmp")
    tmp.write_text(json.dumps(calibration.to_dict(), indent=1, sort_keys=True) + "\n")
    os.replace(tmp, where)
    return where


@dataclass(frozen=True)
class Cell:
    """One measured configuration (emulated seconds per operation) and its bare parts, per
    incast share (the model's transfer times depend on it: :data:`INCASTS`); and, to fit
    the play-out, the configuration played out under given figures (``play``) and its
    steps per operation."""

    measured_s: float
    parts: Mapping[float, Parts]
    play: Callable[[Figures], float] | None = None
    steps: int = 0
    #: whether the incast share can change its play-out (False: no NIC downlink that its
    #: connections reach over several upstream links); such a cell is played once for
    #: every incast share
    incast: bool = True

    def at(self, incast: float) -> Parts:
        return self.parts[incast] if incast in self.parts else self.parts[1.0]


OVERLAPS = tuple(i / 20 for i in range(21))
EFFICIENCIES = tuple(i / 100 for i in range(50, 101))
INCASTS = tuple(i / 20 for i in range(10, 21))


def fit(cells: Sequence[Cell]) -> ForecastCalibration:
    """The figures that minimise the cells' rms relative error: overlap and efficiency on
    a grid (0..1 by 0.05; 0.50..1 by 0.01), the incast share over the values the cells were
    computed for, for each the two overheads by least squares (kept >= 0: a negative one
    is dropped and the other refitted)."""
    usable = [c for c in cells if c.measured_s > 0 and math.isfinite(c.measured_s)]
    if len(usable) < 3:
        raise ValueError(f"a fit needs at least 3 measured cells, got {len(usable)}")
    best: tuple[float, ForecastCalibration] | None = None
    incasts = sorted({i for c in usable for i in c.parts})
    for incast in incasts:
        for overlap in OVERLAPS:
            for efficiency in EFFICIENCIES:
                bare = ForecastCalibration(efficiency=efficiency, overlap=overlap)
                base = [bare.time(c.at(incast)) for c in usable]
                step, operation = _overheads(
                    usable, base, [c.at(incast).step_count for c in usable]
                )
                candidate = ForecastCalibration(step, operation, efficiency, overlap, incast)
                rms = _rms(candidate, usable)
                if best is None or rms < best[0] - 1e-12:
                    best = (rms, candidate)
    assert best is not None
    rms, chosen = best
    return replace(chosen, cells=len(usable), rms_relative_error=rms)


#: the play-out's grid: TCP's efficiency, the incast share, the send buffer (bytes)
PLAYED_EFFICIENCIES = tuple(i / 100 for i in range(88, 101, 2))
PLAYED_INCASTS = tuple(i / 10 for i in range(5, 11))
SEND_BUFFERS = tuple(1024 * k for k in (16, 64, 128, 256, 512, 1024, 4096))


def fit_played(cells: Sequence[Cell]) -> ForecastCalibration:
    """The play-out's figures that minimise the cells' mean absolute relative error, then
    the step model's overlap with them (it forecasts what is too large to play out).

    Efficiency, incast share and send buffer on a grid (:data:`PLAYED_EFFICIENCIES`,
    :data:`PLAYED_INCASTS`, :data:`SEND_BUFFERS`), each cell played out without overheads
    (a cell the incast share cannot change, ``Cell.incast``, once for every share: a
    calibration's 24 cells take 0.7 s a grid point played whole, its path-pinned
    all-reduces a third of it; the fit took 3 min 50 s with this, 4 min 37 s without);
    the two overheads then as in :func:`fit`, taking a step's overhead as adding to every
    step of the operation (a ring paced by its slowest sender adds it to every step) and
    the operation's once. The grid point is the one whose cells' **mean absolute**
    relative error is least, the overheads too (:func:`_robust_overheads`); the rms
    reported is the play-outs' with the overheads in, not the linear estimate's.

    Why not the least squares the step model's fit uses: the play-out leaves the direct
    all-to-all's losses out (docs/forecast.md), and on astral-small its ``path-pinned``
    cells run 20-40 % slower than the bare model plays them (efficiency and incast share
    1). A squared error lets those few cells pull every figure towards them: on the
    calibration run of 2026-12-07 it chose efficiency 0.90 and incast 0.80, which
    forecast rail-optimized-small's ``shortest`` ring 11-14 % too slow. The absolute
    error counts a cell's miss once, not squared, so a cell the model cannot reach pulls
    the figures as much as any other, not by the square of how far it is."""
    usable = [
        c for c in cells if c.play is not None and c.measured_s > 0 and math.isfinite(c.measured_s)
    ]
    if len(usable) < 3:
        raise ValueError(f"a fit needs at least 3 measured cells, got {len(usable)}")
    best: tuple[float, Figures] | None = None
    grid: list[list[float]] = []  # per grid point, each cell's bare play-out
    played: list[dict[Figures, float]] = [{} for _ in usable]  # per cell, by figures
    for efficiency, incast, buffer in itertools.product(
        PLAYED_EFFICIENCIES, PLAYED_INCASTS, SEND_BUFFERS
    ):
        bare = Figures(efficiency=efficiency, incast=incast, send_buffer=buffer)
        base: list[float] = []
        for cell, memo in zip(usable, played, strict=True):
            key = bare if cell.incast else replace(bare, incast=1.0)
            if key not in memo:
                memo[key] = cell.play(key)  # type: ignore[misc]
            base.append(memo[key])
        grid.append(base)
        step, operation, mae = _robust_overheads(usable, base, [c.steps for c in usable])
        if best is None or mae < best[0] - 1e-12:
            best = (mae, replace(bare, step_overhead_s=step, operation_overhead_s=operation))
    assert best is not None
    figures = best[1]
    rms = _rms_of([c.play(figures) for c in usable], usable)  # type: ignore[misc]
    chosen = ForecastCalibration(
        step_overhead_s=figures.step_overhead_s,
        operation_overhead_s=figures.operation_overhead_s,
        efficiency=figures.efficiency,
        incast=figures.incast,
        send_buffer_bytes=figures.send_buffer,
    )
    stepwise = [c for c in usable if c.parts]
    overlap = (
        min(OVERLAPS, key=lambda o: _rms(replace(chosen, overlap=o), stepwise)) if stepwise else 0.0
    )
    return replace(
        chosen,
        overlap=overlap,
        cells=len(usable),
        rms_relative_error=rms,
        held_out_error=_held_out_error(usable, grid),
    )


def _held_out_error(cells: Sequence[Cell], grid: Sequence[Sequence[float]]) -> float:
    """The rms relative error of each cell forecast by a fit on the other cells
    (leave-one-out: the grid point and overheads chosen without it, as :func:`fit_played`
    chooses them; the overheads added linearly, as the grid search does). An rms, not a
    mean absolute error: it widens the prediction band, a spread.

    Why: the fit's own rms is in-sample, measured on the cells it chose its figures for,
    and on a noisy machine it understates the error a forecast makes on a configuration
    the fit has not seen (on 2026-12-02, 3.7 % in-sample against errors of 8-20 % on the
    validation's all-to-all). The prediction band of hashed paths is only as honest as
    the error it is widened by (orchestrator/forecast/model.py prediction_band)."""
    if len(cells) < 4:
        return 0.0
    steps = [c.steps for c in cells]
    errors = []
    for out in range(len(cells)):
        rest = [c for i, c in enumerate(cells) if i != out]
        rest_steps = [n for i, n in enumerate(steps) if i != out]
        best: tuple[float, float] | None = None
        for base in grid:
            rest_base = [b for i, b in enumerate(base) if i != out]
            step, operation, mae = _robust_overheads(rest, rest_base, rest_steps)
            if best is None or mae < best[0] - 1e-12:
                best = (mae, base[out] + step * steps[out] + operation)
        assert best is not None
        errors.append((best[1] - cells[out].measured_s) / cells[out].measured_s)
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _rms_of(times: Sequence[float], cells: Sequence[Cell]) -> float:
    errors = [(t - c.measured_s) / c.measured_s for t, c in zip(times, cells, strict=True)]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _rms(calibration: ForecastCalibration, cells: Sequence[Cell]) -> float:
    return _rms_of([calibration.time(c.at(calibration.incast)) for c in cells], cells)


#: the most rounds of reweighting that take the overheads from least squares towards
#: least absolute error (:func:`_robust_overheads`; the unit tests' cells settle in 2-3)
REWEIGHTING_ROUNDS = 10
#: the least relative error a cell's weight is computed at in those rounds: a cell met
#: exactly would otherwise take every weight
ERROR_FLOOR = 0.005


def _robust_overheads(
    cells: Sequence[Cell], base: Sequence[float], steps: Sequence[float]
) -> tuple[float, float, float]:
    """(step, operation) overheads that minimise the cells' mean absolute relative error
    on what ``base`` leaves, by iteratively reweighted least squares (each round weighs a
    cell by 1 / its error in the round before, floored at :data:`ERROR_FLOOR`), and that
    error. The round of least mean absolute error is kept, plain least squares among
    them: a round can overshoot by a little."""

    def errors(step: float, operation: float) -> list[float]:
        return [
            abs(b + step * n + operation - c.measured_s) / c.measured_s
            for b, n, c in zip(base, steps, cells, strict=True)
        ]

    step, operation = _overheads(cells, base, steps)
    missed = errors(step, operation)
    best = (sum(missed), step, operation)
    for _ in range(REWEIGHTING_ROUNDS):
        weights = [1.0 / max(e, ERROR_FLOOR) for e in missed]
        again = _overheads(cells, base, steps, weights)
        if abs(again[0] - step) < 1e-12 and abs(again[1] - operation) < 1e-12:
            break
        step, operation = again
        missed = errors(step, operation)
        best = min(best, (sum(missed), step, operation))
    return best[1], best[2], best[0] / len(cells)


def _overheads(
    cells: Sequence[Cell],
    base: Sequence[float],
    steps: Sequence[float],
    weights: Sequence[float] | None = None,
) -> tuple[float, float]:
    """(step, operation) overheads by weighted least squares on what ``base`` leaves, a
    cell's step overhead counted ``steps`` times; every cell's relative error weighs
    alike, times its ``weights`` where given."""
    w = [1.0] * len(cells) if weights is None else list(weights)
    terms = ["step", "operation"]
    while terms:
        rows = [
            [(float(n) if t == "step" else 1.0) / c.measured_s for t in terms]
            for c, n in zip(cells, steps, strict=True)
        ]
        rhs = [(c.measured_s - b) / c.measured_s for c, b in zip(cells, base, strict=True)]
        k = len(terms)
        ata = [
            [sum(x * r[i] * r[j] for x, r in zip(w, rows, strict=True)) for j in range(k)]
            for i in range(k)
        ]
        atb = [sum(x * r[i] * y for x, r, y in zip(w, rows, rhs, strict=True)) for i in range(k)]
        try:
            solution = dict(zip(terms, _solve(ata, atb), strict=True))
        except ValueError:
            # the cells cannot tell a step's cost from an operation's (every cell has the
            # same steps): all of it is the operation's
            if terms == ["step", "operation"]:
                terms = ["operation"]
                continue
            return 0.0, 0.0
        negative = [t for t in terms if solution[t] < 0]
        if not negative:
            return solution.get("step", 0.0), solution.get("operation", 0.0)
        terms = [t for t in terms if t not in negative]
    return 0.0, 0.0


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (k <= 2)."""
    k = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-300:
            raise ValueError("the calibration cells do not determine the fit (singular)")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(k):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][k] / m[i][i] for i in range(k)]
