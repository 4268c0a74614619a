"""Whether the emulator kept up while a configuration was measured, as the bundle keeps it.

The runner samples the machine's CPU during every configuration's measured window (from
its first timed iteration to the end of its last; orchestrator.testbed.cpuload) and judges
it (orchestrator.calibration.saturation, docs/calibration.md "Saturation"); the verdict and
the figures behind it are one :class:`EmulatorLoad` per configuration, in the bundle's
``emulator_load`` table, summary.json and the header of every nccl-tests table that has a
configuration measured while the emulator was saturated (:func:`saturation_lines`).
Plain data: the thresholds it was judged against travel with it, so ``astral report``
re-renders the verdict as the run made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class EmulatorLoad:
    """The CPU while one configuration was measured, and the verdict on it.

    ``window_s``: the measured window; ``sampled_s``/``samples``: the span and number of
    CPU samples the figures come from (they span the window; a short window is judged
    over the sampling interval around it). Shares of that span: ``idle_share`` of all
    CPUs idle, ``vswitchd_wait`` and ``softirqd_wait`` waited for a CPU by ovs-vswitchd's
    main thread and the kernel's ksoftirqd threads; ``vswitchd_cores``: cores it used;
    ``offered_hop_bps``: the experiment's offered load, which sets the cores it needs.
    ``reasons``: why it was saturated (empty when not); the last four: the thresholds."""

    window_s: float
    sampled_s: float
    samples: int
    idle_share: float
    vswitchd_cores: float
    vswitchd_wait: float
    softirqd_wait: float
    offered_hop_bps: float
    saturated: bool
    reasons: str
    idle_share_min: float
    cores_per_hop_gbps: float
    vswitchd_wait_min: float
    softirqd_wait_max: float

    def describe(self) -> str:
        """The figures in one phrase."""
        return (
            f"idle {self.idle_share:.0%}, ovs-vswitchd {self.vswitchd_cores:.2f} cores "
            f"(waited {self.vswitchd_wait:.0%}), ksoftirqd waited {self.softirqd_wait:.0%}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def saturation_lines(sizes_and_loads: Sequence[tuple[int, EmulatorLoad | None]]) -> list[str]:
    """Header lines for one nccl-tests table (its rows' sizes and loads, in row order):
    nothing when no row was measured while the emulator was saturated, else which sizes
    were, why, and the rule they were judged by."""
    flagged = [(size, load) for size, load in sizes_and_loads if load and load.saturated]
    if not flagged:
        return []
    t = flagged[0][1]
    return [
        f"EMULATOR SATURATED while measuring {len(flagged)} of {len(sizes_and_loads)} sizes: "
        "those cells measured the emulator, not the fabric",
        *(f"  size {size}: {load.reasons}; {load.describe()}" for size, load in flagged),
        f"(rule: idle below {t.idle_share_min:.0%} and ovs-vswitchd waiting over "
        f"{t.vswitchd_wait_min:.0%} with under {t.cores_per_hop_gbps:g} cores per offered "
        f"hop-Gbit/s, or ksoftirqd waiting over {t.softirqd_wait_max:.0%}; docs/calibration.md)",
    ]
