"""One progress bar over a whole study, so its ETA covers every variant, not the current one.

Each variant's steps are weighted as a single run weighs them (``step_seconds`` at the
variant's own NIC rate, plus its latencies), all added up front; the runner of each variant
is handed a view (:class:`VariantProgress`) that advances the shared bar and closes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from orchestrator.collectives.sizes import format_size
from orchestrator.run.experiment import ConfigurationStep, ExperimentSpec
from orchestrator.run.runner import BarOwner, Progress, progress_bar, step_seconds
from orchestrator.study.spec import Variant


def nic_rate(spec: ExperimentSpec) -> float:
    """One GPU's emulated NIC bandwidth, bytes/s, as the testbed computes it."""
    fabric = spec.fabric
    return fabric.nic_ports * fabric.emulation.emulated(fabric.speeds.nic) / 8


class StudyProgress(BarOwner):
    """The study's bar (tqdm on stderr), weighted by every variant's expected seconds."""

    def __init__(self, variants: Sequence[Variant], enabled: bool) -> None:
        self.count = len(variants)
        self.weights: dict[tuple[int, int], float] = {}
        for variant in variants:
            latencies = variant.spec.step_latencies()
            rate = nic_rate(variant.spec)
            for step in variant.spec.steps():
                seconds = step_seconds(step, rate) + latencies.get(step.index, 0.0)
                self.weights[(variant.index, step.index)] = seconds
        self.bar: Any = progress_bar(sum(self.weights.values())) if enabled else None

    def view(self, variant: Variant) -> VariantProgress:
        return VariantProgress(self, variant)


class VariantProgress(Progress):
    """What one variant's runner sees: the study's bar, described with the variant."""

    def __init__(self, study: StudyProgress, variant: Variant) -> None:
        self.study = study
        self.variant = variant
        self.steps = len(variant.spec.steps())

    @property
    def bar(self) -> Any:
        return self.study.bar

    def step(self, step: ConfigurationStep) -> None:
        if self.study.bar is not None:
            self.study.bar.set_description_str(
                f"variant {self.variant.index + 1}/{self.study.count} {self.variant.label}: "
                f"{step.policy} / {step.collective.label} / {format_size(step.size)} "
                f"[{step.index + 1}/{self.steps}]"
            )

    def done(self, step: ConfigurationStep) -> None:
        if self.study.bar is not None:
            self.study.bar.update(round(self.study.weights[(self.variant.index, step.index)], 1))

    def write(self, text: str, file: TextIO) -> None:
        self.study.write(text, file)

    def close(self) -> None:
        """The study closes its bar, not a variant."""
