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
- no calibration on this machine: ``astral run`` says so and runs the quick calibration
  once (:func:`ensure_calibration`, ``astral calibrate --quick``, under a minute), stores it
  where calibration files live (orchestrator.calibration.capacity.calibration_path), and
  judges against it; this run and every later one on the machine read it from there.
  With ``--no-calibrate`` (and for library callers, the pytest plugin and the tests, which
  never measure behind their caller's back) it runs uncalibrated, says so before the run
  and in the summary, and no figure is invented.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.calibration.capacity import (
    Assessment,
    Calibration,
    Verdict,
    assess,
    calibration_path,
    load_calibration,
    save_calibration,
)
from orchestrator.emulation.recipe import current_recipe, packet_scale_of
from orchestrator.run.experiment import ExperimentSpec
from topologies.errors import ExperimentError


@dataclass(frozen=True)
class LoadVerdict:
    assessment: Assessment
    forced: bool = False
    #: The emulator recipe the run uses (orchestrator.emulation.recipe): a capacity measured
    #: under another one does not describe this run's emulator.
    recipe: str = ""

    @property
    def recipe_mismatch(self) -> str | None:
        """Why the calibration does not fit the run's recipe, or None."""
        calibration = self.assessment.calibration
        if calibration is None or not self.recipe or calibration.recipe == self.recipe:
            return None
        return (
            f"the calibration was measured under emulator recipe {calibration.recipe} and "
            f"this run uses {self.recipe}: its capacity describes another emulator "
            f"(`sudo astral calibrate --recipe {self.recipe}` measures this one)"
        )

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
        if not self.calibrated:
            return [f"warning: {self.assessment.line()}"]
        if self.recipe_mismatch:
            return [f"warning: {self.recipe_mismatch}"]
        return []

    def summary(self) -> list[str]:
        """One line for the run's summary."""
        suffix = ": results EMULATOR-BOUND (forced)" if self.emulator_bound else ""
        mismatch = [f"load guard: {self.recipe_mismatch}"] if self.recipe_mismatch else []
        return [f"load guard: {self.assessment.line()}{suffix}", *mismatch]

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
            "recipe": self.recipe or None,
            "calibration_recipe": calibration.recipe if calibration else None,
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
    if calibration is not None:
        # The capacity at this run's packet size (docs/capacity.md: the emulator's work is
        # per packet; recipes like jumbo-packets size packets by the links' rate).
        calibration = calibration.at_packet_scale(packet_scale_of(spec.fabric))
    return LoadVerdict(
        assess(spec.fabric, spec.gpus, calibration),
        forced=force or spec.load_limit.force,
        recipe=current_recipe().name,
    )


def lacks_packet_scale(calibration: Calibration, packet_scale: int) -> bool:
    """Whether ``calibration`` is a quick one (``astral run``'s first estimate, never a
    user's ``astral calibrate``) with no step measured at ``packet_scale`` or larger."""
    if calibration.fabric.get("plan") != "quick":
        return False
    return packet_scale > max((step.packet_scale for step in calibration.steps), default=1)


def ensure_calibration(
    measure: Callable[[], Calibration],
    *,
    path: str | Path | None = None,
    say: Callable[[str], None] = lambda _: None,
    packet_scale: int = 1,
) -> Calibration:
    """This machine's calibration: the stored one if there is one, else what ``measure``
    finds (the quick calibration), stored at ``path`` (default: where calibration files
    live) so that it runs once per machine. A damaged file is a ConfigError, never
    replaced behind the user's back. A stored quick calibration that measured no step at
    a run's ``packet_scale`` or larger is measured again (``measure`` is for that run's
    packets) and replaced: it says only that the emulator carried its load at smaller
    packets, a lower bound that would refuse a run at larger ones (the default experiment,
    at 40 Mbit/s, packets x2, after a first run at 20 Mbit/s stored a quick calibration
    of x1: refused at 178 % of a capacity never measured at its packets)."""
    where = calibration_path(path)
    stored = load_calibration(where)
    if stored is not None and not lacks_packet_scale(stored, packet_scale):
        return stored
    if stored is None:
        say(
            f"no calibration at {where}: measuring the emulator's capacity once for this "
            "machine (`astral calibrate --quick`, under a minute; `astral run "
            "--no-calibrate` skips it)"
        )
    else:
        say(
            f"the calibration at {where} is a quick one measured for smaller packets than "
            f"this run's (x{packet_scale}): measuring it again for them, once (`astral "
            "calibrate` measures every scale)"
        )
    measured = measure()
    saved = save_calibration(measured, where)
    calibration = load_calibration(saved) or measured  # what later runs will read
    say(f"calibration stored in {saved}: {calibration.lines()[0]}")
    return calibration
