"""Worker point-to-point throughput against iperf3, both on loopback, interleaved.

    .venv/bin/python benchmarks/worker_loopback.py [--size 16M] [--iterations 10] [--rounds 5]

Each round runs the workers' ``p2p/direct`` (rank 0 sends ``size`` bytes to rank 1, one TCP
connection, timed per operation at the receiver) and then ``iperf3 -c 127.0.0.1`` moving
the same number of bytes, and reports both rates and their ratio; the summary gives the
medians. Because other processes share the CPU, it also reports bytes moved per CPU second
(sender + receiver processes), which depends much less on what else runs.

What differs by design: iperf3 sends one cache-resident 128 KiB buffer over and over, the
workers move a real buffer of ``size`` bytes (and the timing excludes the barrier between
operations, as nccl-tests does).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.experiment import parse_size
from orchestrator.worker.launcher import (
    CollectiveTest,
    Launcher,
    LaunchOptions,
    loopback_workers,
)

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def iperf3(nbytes: int, port: int) -> tuple[float, float]:
    """(receiver bytes/s, CPU seconds of client + server) for ``nbytes`` over loopback."""
    server = subprocess.Popen(
        ["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(nbytes), "-J"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    finally:
        server.wait(timeout=10)
    end = json.loads(out)["end"]
    received = end["sum_received"]
    seconds = received["seconds"]
    cpu = end["cpu_utilization_percent"]
    cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * seconds
    return received["bytes"] / seconds, cpu_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="16M")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--port", type=int, default=25201, help="iperf3 port")
    args = parser.parse_args()
    size = parse_size(args.size)
    options = LaunchOptions(warmup=2, iterations=args.iterations, verify=False)
    worker_rates, iperf_rates, worker_eff, iperf_eff = [], [], [], []
    with Launcher(loopback_workers(2), options=options) as launcher:
        pids = [launcher.process(rank).pid for rank in (0, 1)]
        for n in range(args.rounds):
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            result = launcher.run([CollectiveTest("p2p", "direct", size)])
            cpu1 = sum(cpu_seconds(pid) for pid in pids)
            result.raise_for_failure()
            test = result.tests[0]
            rate = test.size / (test.time_us * 1e-6)
            moved = test.size * len(test.iterations)
            worker_rates.append(rate)
            worker_eff.append(moved / max(cpu1 - cpu0, 1e-3))
            i_rate, i_cpu = iperf3(test.size * args.iterations, args.port)
            iperf_rates.append(i_rate)
            iperf_eff.append(test.size * args.iterations / max(i_cpu, 1e-3))
            print(
                f"round {n}: workers {rate / 1e9:6.3f} GB/s  iperf3 {i_rate / 1e9:6.3f} GB/s  "
                f"ratio {rate / i_rate:4.2f}",
                flush=True,
            )
    w, i = statistics.median(worker_rates), statistics.median(iperf_rates)
    we, ie = statistics.median(worker_eff), statistics.median(iperf_eff)
    print(f"median: workers {w / 1e9:.3f} GB/s, iperf3 {i / 1e9:.3f} GB/s, ratio {w / i:.2f}")
    print(
        f"bytes per CPU second: workers {we / 1e9:.2f} GB, iperf3 {ie / 1e9:.2f} GB, "
        f"ratio {we / ie:.2f}"
    )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
