"""Telemetry polling on an emulated fabric: achieved period, reply time, CPU cost.

    sudo .venv/bin/python benchmarks/telemetry_polling.py [--fabric astral-small] \\
        [--intervals 0.5,0.2,0.1] [--seconds 20] [--flows 4]

Brings the fabric up once, then for each interval restarts the controller with
``--telemetry-interval`` and, while ``--flows`` iperf3 flows cross the core, reads back the
telemetry file (orchestrator.testbed.telemetry) and the CPU time of the controller process and of
ovs-vswitchd over the window. Prints one row per interval: the poll period achieved (mean,
95th percentile, max), the time from the requests to the last reply (95th percentile), the
rounds where a switch did not answer before the next tick, CPU shares (100% = one core) and
the telemetry file's growth.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.emulation.network import Emulation
from orchestrator.emulation.sendbuffer import vswitchd_pid
from orchestrator.testbed.telemetry import read_telemetry, summarize_periods

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def start(fabric: str, wait: float) -> Emulation:
    emulation = Emulation(fabric, ready_timeout=120, telemetry_interval=0.5, lock_wait=wait)
    return emulation.start()


def pairs(emulation: Emulation, count: int) -> list[tuple[str, str]]:
    """``count`` sender -> receiver pairs across pods (one flow per GPU at most)."""
    assert emulation.description is not None
    gpus = emulation.description.fabric.gpus_by_rank()
    half = len(gpus) // 2
    return [(gpus[i].name, gpus[i + half].name) for i in range(min(count, half))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fabric", default="astral-small")
    parser.add_argument("--intervals", default="0.5,0.2,0.1")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--flows", type=int, default=4)
    parser.add_argument("--lock-wait", type=float, default=600.0)
    args = parser.parse_args()
    intervals = [float(x) for x in args.intervals.split(",")]

    emulation = start(args.fabric, args.lock_wait)
    try:
        controller = emulation.controller
        assert controller is not None and emulation.description is not None
        print(
            f"{args.fabric}: up in {emulation.timings['total']:.1f} s; {args.flows} iperf3 "
            f"flows, {args.seconds:g} s per interval, {os.cpu_count()} cores"
        )
        print(
            f"{'interval':>8} {'rounds':>6} {'mean':>7} {'p95':>7} {'max':>7} {'reply p95':>9} "
            f"{'late':>4} {'ctl CPU':>7} {'ovs CPU':>7} {'KB/s':>6}"
        )
        for interval in intervals:
            controller.telemetry_interval = interval
            controller.restart()
            controller.wait_programmed(timeout=60)
            servers, clients = [], []
            for n, (src, dst) in enumerate(pairs(emulation, args.flows)):
                port = str(5301 + n)
                servers.append(
                    emulation.popen(dst, ["iperf3", "-s", "-1", "-p", port],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )  # fmt: skip
                time.sleep(0.2)
                address = emulation.description.addresses[dst].fabric_ip
                clients.append(
                    emulation.popen(
                        src,
                        ["iperf3", "-c", address, "-p", port, "-t", str(args.seconds + 2)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    )
                )  # fmt: skip
            time.sleep(1.0)
            pid, ovs = controller.pid, vswitchd_pid()
            assert pid is not None
            path = controller.telemetry_path
            size0, cpu0, ovs0, t0 = (
                path.stat().st_size,
                cpu_seconds(pid),
                cpu_seconds(ovs),
                time.time(),
            )
            time.sleep(args.seconds)
            size1, cpu1, ovs1, t1 = (
                path.stat().st_size,
                cpu_seconds(pid),
                cpu_seconds(ovs),
                time.time(),
            )
            for process in clients + servers:
                process.wait(timeout=30)
            tel = read_telemetry(path)
            tel.rounds = [r for r in tel.rounds if t0 <= r.t <= t1]
            tel.segments = [0]
            s = summarize_periods(tel)
            took = f"{1e3 * s.took_p95:.0f} ms" if s.took_p95 is not None else "-"
            seconds = t1 - t0
            ctl, switch = 100 * (cpu1 - cpu0) / seconds, 100 * (ovs1 - ovs0) / seconds
            print(
                f"{interval:>7.2f}s {s.count + 1:>6} {1e3 * s.mean:>5.0f}ms {1e3 * s.p95:>5.0f}ms "
                f"{1e3 * s.max:>5.0f}ms {took:>9} {s.incomplete:>4} "
                f"{ctl:>6.1f}% {switch:>6.1f}% {(size1 - size0) / 1024 / seconds:>6.1f}"
            )
    finally:
        emulation.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
