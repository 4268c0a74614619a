"""Was the emulator saturated while a configuration was measured? The live verdict.

The load guard (orchestrator.run.loadguard) judges an experiment before it runs, from its
offered load and a calibration made on a quiet machine. What happens during the run, on a
machine others share, it cannot know: this module judges each configuration afterwards
from the CPU sampled over its measured window (orchestrator.testbed.cpuload).

The emulator is ovs-vswitchd's forwarding thread plus the kernel's shapers and veth
transfers (softirq work, which the kernel defers to its ksoftirqd threads when there is
much of it) plus the TCP endpoints, all on this machine's cores. The rule (measured:
docs/calibration.md, "Saturation"; benchmarks/saturation.py)::

    saturated = idle share < idle_share
                and (   ovs-vswitchd starved:  its main thread waited for a CPU more than
                                               vswitchd_wait of the time, and it got fewer
                                               than cores_per_hop_gbps x the offered load
                     or softirq starved:       the ksoftirqd threads waited more than
                                               softirqd_wait of the time)

Why each part:

- *idle share*: with CPU left idle, every part of the emulator got what it asked for;
  what it could not carry then is its capacity, which the load guard judges;
- *ovs-vswitchd's cores*: alone they say nothing (it busy-polls its ports and sits near
  one core as soon as any traffic flows, docs/calibration.md); short of CPU it forwards
  more packets per wake-up and keeps up with fewer cores, down to about
  ``cores_per_hop_gbps`` per hop-Gbit/s offered (the experiment's offered load,
  orchestrator.calibration.capacity: the most its GPUs can inject). Its *wait* says it
  wanted the CPU: during a latency-bound configuration it sleeps, uses little and waits
  little, and is not starved;
- *softirq*: CPU-heavy network work elsewhere on the machine (other TCP traffic, even on
  loopback) starves the kernel's half of the emulator while ovs-vswitchd, which runs at a
  higher priority (nice -10), still gets its share; the ksoftirqd threads' wait shows it.

What it does not see: traffic of other fabrics through the same ovs-vswitchd costs it
cores the offered load does not count; and a window shorter than the sampling interval
is judged over the interval around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from orchestrator.results.emulator import EmulatorLoad
from orchestrator.testbed.cpuload import CpuLoad, CpuSample, load_between
from orchestrator.worker.outcome import CollectiveResult

# Measured on a 2-core machine shared with other work (docs/calibration.md "Saturation",
# benchmarks/saturation.py): with 5 % or more of the CPUs idle every window within the
# calibrated capacity met the fidelity target; with less, every window in which the
# ksoftirqd threads waited over 15 % of the time, or ovs-vswitchd got under 0.35 cores per
# offered hop-Gbit/s, missed it, but so did some in which neither happened (between 0.35
# and 0.5 cores per hop-Gbit/s the outcome depended on what else ran). The wait share of
# 20 % only tells a starved ovs-vswitchd from one with nothing to forward.
IDLE_SHARE_MIN = 0.05
CORES_PER_HOP_GBPS = 0.35
VSWITCHD_WAIT_MIN = 0.2
SOFTIRQD_WAIT_MAX = 0.15


@dataclass(frozen=True)
class Thresholds:
    """The rule's four figures (module docstring)."""

    idle_share: float = IDLE_SHARE_MIN
    cores_per_hop_gbps: float = CORES_PER_HOP_GBPS
    vswitchd_wait: float = VSWITCHD_WAIT_MIN
    softirqd_wait: float = SOFTIRQD_WAIT_MAX

    def needed_cores(self, offered_hop_bps: float) -> float:
        return self.cores_per_hop_gbps * offered_hop_bps / 1e9

    def reasons(self, load: CpuLoad, offered_hop_bps: float) -> list[str]:
        """Why ``load`` was saturated (empty: it was not)."""
        if load.idle_share >= self.idle_share:
            return []
        reasons = []
        needed = self.needed_cores(offered_hop_bps)
        if load.vswitchd_wait > self.vswitchd_wait and load.vswitchd_cores < needed:
            reasons.append(
                f"ovs-vswitchd starved ({load.vswitchd_cores:.2f} cores of {needed:.2f} needed, "
                f"waited {load.vswitchd_wait:.0%})"
            )
        if load.softirqd_wait > self.softirqd_wait:
            reasons.append(f"softirq starved (ksoftirqd waited {load.softirqd_wait:.0%})")
        return reasons

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_THRESHOLDS = Thresholds()


def measured_window(test: CollectiveResult) -> tuple[float, float] | None:
    """(start, end), epoch seconds: from the first timed iteration's start on any rank to
    the last one's end; None without timed iterations."""
    ranks = [r for iteration in test.timed() for r in iteration.ranks.values()]
    if not ranks:
        return None
    return min(r.start for r in ranks), max(r.start + r.time_us / 1e6 for r in ranks)


def judge(
    load: CpuLoad,
    window: tuple[float, float],
    offered_hop_bps: float,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> EmulatorLoad:
    """The verdict on one configuration: its CPU ``load`` over ``window``, for an
    experiment offering ``offered_hop_bps``."""
    reasons = thresholds.reasons(load, offered_hop_bps)
    return EmulatorLoad(
        window_s=window[1] - window[0],
        sampled_s=load.span_s,
        samples=load.samples,
        idle_share=load.idle_share,
        vswitchd_cores=load.vswitchd_cores,
        vswitchd_wait=load.vswitchd_wait,
        softirqd_wait=load.softirqd_wait,
        offered_hop_bps=offered_hop_bps,
        saturated=bool(reasons),
        reasons="; ".join(reasons),
        idle_share_min=thresholds.idle_share,
        cores_per_hop_gbps=thresholds.cores_per_hop_gbps,
        vswitchd_wait_min=thresholds.vswitchd_wait,
        softirqd_wait_max=thresholds.softirqd_wait,
    )


def judge_test(
    test: CollectiveResult,
    samples: Sequence[CpuSample],
    offered_hop_bps: float,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> EmulatorLoad | None:
    """The verdict on one collective x size the launcher ran, from the CPU ``samples``
    taken while it ran (None: no timed iteration, or no samples around its window)."""
    window = measured_window(test)
    if window is None:
        return None
    load = load_between(samples, *window)
    if load is None:
        return None
    return judge(load, window, offered_hop_bps, thresholds)
