"""Bring-up and teardown time and peak memory of the emulation, per fabric.

    sudo .venv/bin/python benchmarks/bringup.py [FABRIC ...] [--repeat N] [--lock-wait S]

Default fabrics: ``astral-small`` (the default fabric, 8 GPUs) and ``astral-64`` (64 GPUs).
For each run it brings the fabric up with :class:`orchestrator.emulation.network.Emulation` (which
returns only once every GPU reaches every other), tears it down, and prints one row:

    up        seconds until start() returned: build + controller programming + readiness
    build     of which: everything before the controller reported all switches programmed
              (lock, plan, controller start, hosts, links, namespaces, switches, shaping)
    program   waiting for the controller to program every switch
    ready     the all-pairs reachability check (every pair, every NIC port, NVLink)
    down      stop(): controller, processes, bridges, interfaces, until all are gone
    ours MB   peak RSS sum of this process and all its descendants (GPU shells, the
              controller, probes) sampled every 0.2 s during bring-up
    ovs MB    ovs-vswitchd's peak RSS during the run minus its RSS before it (it does not
              give memory back after a teardown: later runs start from a higher base)
    avail MB  drop of the system's MemAvailable at the peak (includes kernel memory for
              namespaces, veths and qdiscs; noisy when other work runs on the machine)

Conditions (cores, load, other OVS bridges on the machine) are printed first: on a shared
2-core machine every number moves with what else runs, so repeat and compare like with like.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.sendbuffer import vswitchd_pid

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as src:
            return int(src.read().split()[1]) * PAGE_KB
    except (OSError, ValueError, IndexError):
        return 0


def descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as src:
                stat = src.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def mem_available_kb() -> int:
    with open("/proc/meminfo", encoding="ascii") as src:
        for line in src:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


class PeakSampler:
    """Samples our processes' RSS, ovs-vswitchd's RSS and MemAvailable in a thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.ovs_pid = vswitchd_pid()
        self.ovs_base = rss_kb(self.ovs_pid)
        self.avail_base = mem_available_kb()
        self.ours = self.ovs = 0
        self.avail_drop = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        ours = sum(rss_kb(pid) for pid in descendants(os.getpid()))
        self.ours = max(self.ours, ours)
        self.ovs = max(self.ovs, rss_kb(self.ovs_pid))
        self.avail_drop = max(self.avail_drop, self.avail_base - mem_available_kb())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


@dataclass
class Row:
    fabric: str
    gpus: int
    switches: int
    links: int
    up: float
    build: float
    program: float
    ready: float
    down: float
    ours_mb: float
    ovs_mb: float
    avail_mb: float
    detail: str


def wait_for_lock(seconds: float) -> None:
    """Return once no other run holds the lock (or raise after ``seconds``)."""
    lock = RunLock(purpose="benchmark probe")
    lock.acquire(wait=seconds)
    lock.release()


def measure(fabric: str, timeout: float, lock_wait: float) -> Row:
    wait_for_lock(lock_wait)  # outside the timings
    # lock_wait again: another run may take the lock between the probe and the start
    emulation = Emulation(fabric, ready_timeout=timeout, lock_wait=lock_wait)
    with PeakSampler() as peak:
        try:
            emulation.start()
        finally:
            began = time.monotonic()
            report = emulation.stop()
            down = time.monotonic() - began
    if report.errors:
        print(f"  teardown problems: {report.errors}", file=sys.stderr)
    t = emulation.timings
    assert emulation.description is not None
    fabric_model = emulation.description.fabric
    steps = ("controller", "hosts", "links", "configure", "switches")
    return Row(
        fabric=fabric_model.name,
        gpus=len(fabric_model.gpus),
        switches=len(fabric_model.switches),
        links=len(fabric_model.links),
        up=t["total"],
        build=t["total"] - t["programmed"] - t["reachable"],
        program=t["programmed"],
        ready=t["reachable"],
        down=down,
        ours_mb=peak.ours / 1024,
        ovs_mb=(peak.ovs - peak.ovs_base) / 1024,
        avail_mb=peak.avail_drop / 1024,
        detail=" ".join(f"{k} {t[k]:.2f}" for k in steps),
    )


def conditions() -> list[str]:
    bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
    load = os.getloadavg()
    return [
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} "
        f"{load[2]:.2f}, MemAvailable {mem_available_kb() // 1024} MB",
        f"other OVS bridges present: {len(bridges.split())}; ovs-vswitchd RSS "
        f"{rss_kb(vswitchd_pid()) // 1024} MB",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("fabrics", nargs="*", default=["astral-small", "astral-64"])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument(
        "--lock-wait", type=float, default=0.0, help="wait this long for another run's lock"
    )
    args = parser.parse_args(argv)
    for line in conditions():
        print(line)
    header = (
        f"{'fabric':14} {'GPUs':>4} {'sw':>4} {'links':>5} {'up s':>7} {'build':>6} "
        f"{'program':>7} {'ready':>6} {'down s':>6} {'ours MB':>7} {'ovs MB':>7} {'avail MB':>8}"
    )
    print(header)
    print("-" * len(header))
    details = []
    for fabric in args.fabrics:
        for _ in range(args.repeat):
            row = measure(fabric, args.timeout, args.lock_wait)
            print(
                f"{row.fabric:14} {row.gpus:>4} {row.switches:>4} {row.links:>5} "
                f"{row.up:>7.2f} {row.build:>6.2f} {row.program:>7.2f} {row.ready:>6.2f} "
                f"{row.down:>6.2f} {row.ours_mb:>7.0f} {row.ovs_mb:>7.0f} {row.avail_mb:>8.0f}",
                flush=True,
            )
            details.append(f"{row.fabric}: build steps (s): {row.detail}")
    print()
    for line in details:
        print(line)
    for line in conditions():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
