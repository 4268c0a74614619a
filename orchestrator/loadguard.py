"""The load guard: is an experiment inside what this machine's emulator can carry faithfully?

Open vSwitch's userspace datapath forwards on few threads, so the emulator has a finite
capacity per machine (ENVIRONMENT.md); an experiment whose offered load exceeds a safe share
of it measures the emulator, not the fabric. ``astral calibrate`` (orchestrator.calibration,
where it exists) measures that capacity and stores it; this module compares an experiment
against it before anything starts:

    offered load = placement's GPUs x NIC ports x emulated NIC rate x mean switch hops:
                   the most the GPUs can inject into the fabric at once, in the
                   calibration's unit, hop-bit/s (bit/s summed over the Open vSwitch
                   switches each bit crosses: the datapath's work is per packet per
                   switch; orchestrator.calibration.offered_load)

- calibrated, offered <= safe share x capacity: run;
- above it: refuse (ExperimentError on ``load_limit.force``, exit 2), unless the experiment
  says ``load_limit: {force: true}`` or the command line ``--force``: then run, warn, and
  mark the results emulator-bound (``run.json``'s ``load_guard``);
- no calibration on this machine: run, and say so in the summary. No figure is invented.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from orchestrator.calibration import offered_load as calibrated_load
from orchestrator.experiment import ExperimentSpec
from topologies.errors import ExperimentError


@dataclass(frozen=True)
class Capacity:
    """What calibration measured: the emulator's aggregate capacity and the safe share."""

    capacity_bps: float
    safe_share: float
    source: str  # where it was read from, for messages

    @property
    def safe_bps(self) -> float:
        return self.capacity_bps * self.safe_share


@dataclass(frozen=True)
class LoadVerdict:
    offered_bps: float
    capacity: Capacity | None
    forced: bool = False

    @property
    def calibrated(self) -> bool:
        return self.capacity is not None

    @property
    def over(self) -> bool:
        return self.capacity is not None and self.offered_bps > self.capacity.safe_bps

    @property
    def refused(self) -> bool:
        return self.over and not self.forced

    @property
    def emulator_bound(self) -> bool:
        return self.over and self.forced

    def error(self) -> ExperimentError:
        assert self.capacity is not None
        return ExperimentError(
            None,
            "load_limit.force",
            f"an offered load within the emulator's safe share "
            f"({_mbps(self.capacity.safe_bps)}, {self.capacity.safe_share:.0%} of the "
            f"{_mbps(self.capacity.capacity_bps)} measured by {self.capacity.source}), or "
            "'load_limit: {force: true}' / --force to run anyway (results marked emulator-bound)",
            _mbps(self.offered_bps),
        )

    def lines(self) -> list[str]:
        """Warnings to show before the run (empty when all is well)."""
        if self.emulator_bound:
            assert self.capacity is not None
            return [
                f"warning: offered load {_mbps(self.offered_bps)} exceeds the emulator's safe "
                f"{_mbps(self.capacity.safe_bps)}; running anyway (forced), results are "
                "emulator-bound"
            ]
        return []

    def summary(self) -> list[str]:
        """One line for the run's summary."""
        if self.capacity is None:
            return [
                f"load guard: no calibration on this machine (`astral calibrate`), so it is "
                f"unknown whether the offered {_mbps(self.offered_bps)} is within the "
                "emulator's capacity"
            ]
        share = self.offered_bps / self.capacity.capacity_bps
        verdict = "EMULATOR-BOUND (forced)" if self.emulator_bound else "within the safe share"
        return [
            f"load guard: offered {_mbps(self.offered_bps)} = {share:.0%} of the calibrated "
            f"{_mbps(self.capacity.capacity_bps)} (safe share {self.capacity.safe_share:.0%}): "
            f"{verdict}"
        ]

    def to_dict(self) -> dict[str, Any]:
        capacity = self.capacity
        return {
            "offered_bps": self.offered_bps,
            "calibrated": capacity is not None,
            "capacity_bps": capacity.capacity_bps if capacity else None,
            "safe_share": capacity.safe_share if capacity else None,
            "calibration": capacity.source if capacity else None,
            "forced": self.forced,
            "emulator_bound": self.emulator_bound,
        }


def _mbps(bps: float) -> str:
    return f"{bps / 1e6:.0f} hop-Mbit/s"


def offered_load(spec: ExperimentSpec) -> float:
    """hop-bit/s the placement's GPUs can inject at most: NIC ports x emulated NIC rate
    each, carried over the mean number of switches between them."""
    return calibrated_load(spec.fabric, spec.gpus).hop_bps


def machine_capacity() -> Capacity | None:
    """The calibrated capacity, if ``astral calibrate`` exists and has run here."""
    try:
        module: Any = importlib.import_module("orchestrator.calibration")
    except ImportError:
        return None
    loader = getattr(module, "load_calibration", None)
    if loader is None:
        return None
    try:
        calibration = loader()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if calibration is None:
        return None
    try:
        return Capacity(
            float(calibration.capacity_bps),
            float(calibration.safe_share),
            str(getattr(calibration, "source", "astral calibrate")),
        )
    except (AttributeError, TypeError, ValueError):
        return None


def load_guard(
    spec: ExperimentSpec, *, force: bool = False, capacity: Capacity | None = None
) -> LoadVerdict:
    """The verdict for ``spec`` (``capacity`` default: this machine's calibration)."""
    if capacity is None:
        capacity = machine_capacity()
    return LoadVerdict(offered_load(spec), capacity, forced=force or spec.load_limit.force)
