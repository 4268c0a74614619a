"""The load guard: is an experiment inside what this machine's emulator carries faithfully?

Open vSwitch's userspace datapath forwards on few threads, so the emulator has a finite
capacity per machine (docs/environment.md); an experiment whose offered load exceeds a safe share
of it measures the emulator, not the fabric. ``astral calibrate`` measures that capacity
and stores it (orchestrator.calibration.capacity defines the offered load and the unit,
hop-bit/s: GPUs x NIC ports x emulated NIC rate x mean switch hops). Before a run:

- calibrated, offered <= safe share x capacity: run;
- above it: refuse (ExperimentError on ``load_limit.force``, exit 2, nothing created),
  unless the experiment says ``load_limit: {force: true}`` or the command line ``--force``:
  then run, warn, and mark the results emulator-bound (``run.json``'s ``load_guard``);
- no calibration on this machine: run, and say so in the summary. No figure is invented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.calibration.capacity import (
    Assessment,
    Calibration,
    Verdict,
    assess,
    load_calibration,
)
from orchestrator.run.experiment import ExperimentSpec
from topologies.errors import ExperimentError


@dataclass(frozen=True)
class LoadVerdict:
    assessment: Assessment
    forced: bool = False

    @property
    def offered_bps(self) -> float:
        """bit/s the GPUs can inject (GPUs x NIC ports x emulated NIC rate)."""
        return self.assessment.offered.gpu_bps

    @property
    def offered_hop_bps(self) -> float:
        """The same in the calibration's unit (x mean switch hops)."""
        return self.assessment.offered.hop_bps

    @property
    def calibrated(self) -> bool:
        return self.assessment.calibration is not None

    @property
    def over(self) -> bool:
        return self.assessment.verdict is Verdict.OVER

    @property
    def refused(self) -> bool:
        return self.over and not self.forced

    @property
    def emulator_bound(self) -> bool:
        return self.over and self.forced

    def error(self) -> ExperimentError:
        return ExperimentError(
            None,
            "load_limit.force",
            "an offered load within the emulator's safe share, or 'load_limit: {force: true}' "
            "(or --force) to run anyway with results marked emulator-bound",
            self.assessment.line(),
        )

    def lines(self) -> list[str]:
        """Warnings to show before the run (empty when all is well)."""
        if self.emulator_bound:
            return [f"warning: {self.assessment.line()}; forced: results are emulator-bound"]
        return []

    def summary(self) -> list[str]:
        """One line for the run's summary."""
        suffix = ": results EMULATOR-BOUND (forced)" if self.emulator_bound else ""
        return [f"load guard: {self.assessment.line()}{suffix}"]

    def to_dict(self) -> dict[str, Any]:
        a = self.assessment
        calibration = a.calibration
        return {
            "offered_bps": a.offered.gpu_bps,
            "offered_hop_bps": a.offered.hop_bps,
            "mean_hops": a.offered.mean_hops,
            "calibrated": calibration is not None,
            "capacity_hop_bps": calibration.capacity_bps if calibration else None,
            "safe_share": a.safe_share if calibration else None,
            "calibration": calibration.source if calibration else None,
            "verdict": a.verdict.value,
            "forced": self.forced,
            "emulator_bound": self.emulator_bound,
        }


def load_guard(
    spec: ExperimentSpec,
    *,
    force: bool = False,
    calibration: Calibration | None = None,
    uncalibrated: bool = False,
) -> LoadVerdict:
    """The verdict for ``spec`` against ``calibration`` (default: this machine's;
    ``uncalibrated``: compare against none)."""
    if calibration is None and not uncalibrated:
        calibration = load_calibration()
    return LoadVerdict(
        assess(spec.fabric, spec.gpus, calibration), forced=force or spec.load_limit.force
    )
