"""The machine's CPU while a run goes: idle share and ovs-vswitchd's cores, sampled live.

::

    with CpuSampler() as sampler:          # a thread: /proc/stat and ovs-vswitchd's stat
        ...                                # the run
        sampler.sample()                   # one more now (e.g. right after a configuration)
    load = load_between(sampler.samples, start, end)
    load.idle_share, load.vswitchd_cores   # over the samples that span [start, end]

Why these two figures (docs/calibration.md, "Saturation"): the emulator is ovs-vswitchd's
forwarding thread plus the kernel's veth, HTB and TCP work, all on this machine's cores. A
machine with idle CPU left gave every part of it what it asked for; a machine without any
did not, and then what ovs-vswitchd got, against the traffic it had to forward, says
whether the emulator kept up. Its share alone says little: it busy-polls its ports and
sits near one core as soon as any traffic flows.

A sample is cumulative counters (jiffies of all CPUs, ovs-vswitchd's clock ticks, with the
helpers of orchestrator.testbed.traffic), so shares follow from any two samples and a
window is judged from the last sample at or before its start to the first at or after its
end: it always covers the window, a little more when the window is short (the sampling
interval, 0.1 s, is the resolution). With ``groups``, each sample also reads the CPU of
named process groups (the controller, the workers: a few more small files), and
:func:`host_intervals` turns the samples into the monitor's host layer, one row per
interval. Times are epoch seconds, like the workers' iteration
starts, so a configuration's measured window selects its samples. A sample reads four small
/proc files, about 0.1 ms: at 10 Hz the sampler takes nothing measurable from the run.
"""

from __future__ import annotations

import bisect
import itertools
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.emulation.sendbuffer import vswitchd_pid
from orchestrator.results.store import HostCpu
from orchestrator.testbed.sampling import PeriodicSampler
from orchestrator.testbed.traffic import VSWITCHD_PIDFILE, cpu_times, process_ticks

DEFAULT_INTERVAL = 0.1  # seconds between samples (10 Hz)


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at epoch time ``t``: jiffies all CPUs were busy and in total
    (/proc/stat), clock ticks ovs-vswitchd used (all its threads; 0 when unreadable), and
    nanoseconds spent runnable but waiting for a CPU (/proc/PID/schedstat) by
    ovs-vswitchd's main thread, which forwards, and by the kernel's softirq threads
    (ksoftirqd/N, which run the shapers and veth transfers the kernel defers)."""

    t: float
    busy: int
    total: int
    vswitchd_ticks: int
    vswitchd_wait_ns: int = 0
    softirqd_wait_ns: int = 0
    # clock ticks of watched process groups (name, ticks), e.g. the controller, the workers
    groups: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class CpuLoad:
    """The CPU between two samples: ``start``/``end`` are the samples' times, which span
    the window asked for; ``samples``: how many were taken in between, both included."""

    start: float
    end: float
    samples: int
    idle_share: float  # share of all CPUs idle (iowait counts as idle)
    vswitchd_cores: float  # cores ovs-vswitchd used on average
    vswitchd_wait: float = 0.0  # share of the time its main thread waited for a CPU
    softirqd_wait: float = 0.0  # share of the time the softirq threads waited, summed

    @property
    def span_s(self) -> float:
        return self.end - self.start


def wait_ns(pid: int | str) -> int:
    """Nanoseconds task ``pid`` has been runnable but waiting for a CPU (schedstat's second
    field); 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/schedstat", encoding="ascii") as stat:
            return int(stat.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def softirq_threads() -> list[int]:
    """Pids of the kernel's ksoftirqd/N threads (one per CPU)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm", encoding="ascii") as comm:
                    if comm.read().startswith("ksoftirqd/"):
                        pids.append(int(entry))
            except OSError:
                continue
    return sorted(pids)


def pid_ticks(pid: int) -> int:
    """utime + stime (all threads) of process ``pid``, clock ticks; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return 0


Groups = Callable[[], Mapping[str, Sequence[int]]]  # group name -> its pids right now


def read_sample(
    pidfile: str = VSWITCHD_PIDFILE, softirqd: Sequence[int] = (), groups: Groups | None = None
) -> CpuSample:
    busy, total = cpu_times()
    watched = groups() if groups is not None else {}
    try:
        pid: int | None = vswitchd_pid(Path(pidfile))
    except (OSError, ValueError):
        pid = None  # not running: no figures of its own
    return CpuSample(
        time.time(),
        busy,
        total,
        process_ticks(pidfile),
        wait_ns(pid) if pid is not None else 0,
        sum(wait_ns(p) for p in softirqd),
        tuple((name, sum(pid_ticks(p) for p in pids)) for name, pids in watched.items()),
    )


def host_intervals(
    samples: Sequence[CpuSample], ticks_per_second: float | None = None
) -> list[HostCpu]:
    """The CPU between every two consecutive samples: the monitor's host layer. A watched
    group's cores are None in an interval where it was not watched at both ends (a
    group's ticks fall when one of its processes exits: clamped at 0)."""
    hz = ticks_per_second or os.sysconf("SC_CLK_TCK")
    out = []
    for a, b in itertools.pairwise(samples):
        seconds, jiffies = b.t - a.t, b.total - a.total
        if seconds <= 0 or jiffies <= 0:
            continue
        before, after = dict(a.groups), dict(b.groups)
        cores = {
            name: max(0, after[name] - ticks) / hz / seconds
            for name, ticks in before.items()
            if name in after
        }
        out.append(
            HostCpu(
                start=a.t,
                end=b.t,
                idle_share=1.0 - (b.busy - a.busy) / jiffies,
                vswitchd_cores=max(0, b.vswitchd_ticks - a.vswitchd_ticks) / hz / seconds,
                vswitchd_wait=max(0, b.vswitchd_wait_ns - a.vswitchd_wait_ns) / 1e9 / seconds,
                softirqd_wait=max(0, b.softirqd_wait_ns - a.softirqd_wait_ns) / 1e9 / seconds,
                controller_cores=cores.get("controller"),
                workers_cores=cores.get("workers"),
            )
        )
    return out


def load_between(
    samples: Sequence[CpuSample],
    start: float,
    end: float,
    ticks_per_second: float | None = None,
) -> CpuLoad | None:
    """The CPU over [``start``, ``end``] from ``samples`` (ordered by time): from the last
    sample at or before ``start`` (else the first) to the first at or after ``end`` (else
    the last). None when that leaves fewer than two samples (a window wholly after the
    last one) or no time between them."""
    if len(samples) < 2 or end < start:
        return None
    times = [s.t for s in samples]
    first = max(0, bisect.bisect_right(times, start) - 1)
    last = min(len(samples) - 1, bisect.bisect_left(times, end))
    if last <= first:
        return None
    a, b = samples[first], samples[last]
    seconds = b.t - a.t
    jiffies = b.total - a.total
    if seconds <= 0 or jiffies <= 0:
        return None
    hz = ticks_per_second or os.sysconf("SC_CLK_TCK")
    return CpuLoad(
        start=a.t,
        end=b.t,
        samples=last - first + 1,
        idle_share=1.0 - (b.busy - a.busy) / jiffies,
        vswitchd_cores=max(0, b.vswitchd_ticks - a.vswitchd_ticks) / hz / seconds,
        vswitchd_wait=max(0, b.vswitchd_wait_ns - a.vswitchd_wait_ns) / 1e9 / seconds,
        softirqd_wait=max(0, b.softirqd_wait_ns - a.softirqd_wait_ns) / 1e9 / seconds,
    )


class CpuSampler(PeriodicSampler):
    """Samples the CPU every ``interval`` seconds in a daemon thread while in its ``with``
    block (one sample on entry and one on exit, so that any window inside is spanned).
    ``samples`` grows in time order; :meth:`sample` adds one from the caller's thread."""

    name = "cpu-sampler"

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL,
        pidfile: str = VSWITCHD_PIDFILE,
        groups: Groups | None = None,
    ):
        super().__init__(interval)
        self.pidfile = pidfile
        self.groups = groups  # process groups whose CPU each sample also reads
        self.softirqd = softirq_threads()
        self.samples: list[CpuSample] = []

    def sample(self) -> CpuSample:
        with self._lock:  # appended in time order, whichever thread reads
            taken = read_sample(self.pidfile, self.softirqd, self.groups)
            self.samples.append(taken)
        return taken

    def snapshot(self) -> list[CpuSample]:
        with self._lock:
            return list(self.samples)
