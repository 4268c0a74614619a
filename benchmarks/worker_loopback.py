"""Worker point-to-point throughput against iperf3, both on loopback, interleaved.

    .venv/bin/python benchmarks/worker_loopback.py [--size 16M] [--iterations 10] [--rounds 5]

Each round runs the workers' ``p2p/direct`` (rank 0 sends ``size`` bytes to rank 1, one TCP
connection, timed per operation at the receiver) and then ``iperf3 -c 127.0.0.1`` moving
the same number of bytes, and reports both rates and their ratio; the summary gives the
medians. Because other processes share the CPU, it also reports bytes moved per CPU second
(sender + receiver processes), which depends much less on what else runs; for the workers
it is the marginal cost of an operation (a run of 1 + N operations minus a run of 1), so
set-up and buffer filling do not count, as iperf3's own figure leaves out its start-up.

What differs by design: iperf3 sends one cache-resident 128 KiB buffer over and over, the
workers move a real buffer of ``size`` bytes (and the timing excludes the barrier between
operations, as nccl-tests does). A third column runs ``iperf3 -l 1M`` (its largest
buffer), to show how much of a difference is the cost of touching more memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.collectives.sizes import parse_size
from orchestrator.worker.launcher import Launcher
from orchestrator.worker.spec import CollectiveTest, LaunchOptions, loopback_workers

TICKS = os.sysconf("SC_CLK_TCK")
IPERF3_MAX_LENGTH = 1 << 20  # iperf3 refuses larger -l


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def iperf3(nbytes: int, port: int, length: int = 0) -> tuple[float, float]:
    """(receiver bytes/s, CPU seconds of client + server) for ``nbytes`` over loopback;
    ``length``: iperf3's buffer size (-l), 0 for its default (128 KiB)."""
    server = subprocess.Popen(
        ["iperf3", "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-n", str(nbytes), "-J"]
            + (["-l", str(length)] if length else []),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
    finally:
        if server.poll() is None:
            server.kill()
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
    options = LaunchOptions(warmup=1, iterations=args.iterations, verify=False)
    rates: dict[str, list[float]] = {"workers": [], "iperf3": [], "iperf3 -l": []}
    efficiency: dict[str, list[float]] = {name: [] for name in rates}
    with Launcher(loopback_workers(2), options=options) as launcher:
        pids = [launcher.process(rank).pid for rank in (0, 1)]
        test_ = CollectiveTest("p2p", "direct", size)
        for n in range(args.rounds):
            # CPU per operation at the margin: a run of 1 operation, then one of
            # 1 + iterations, on the same buffers' size (set-up and fill cancel out)
            launcher.options = replace(options, warmup=1, iterations=0)
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            launcher.run([test_]).raise_for_failure()
            cpu1 = sum(cpu_seconds(pid) for pid in pids)
            launcher.options = options
            result = launcher.run([test_])
            cpu2 = sum(cpu_seconds(pid) for pid in pids)
            result.raise_for_failure()
            test = result.tests[0]
            rates["workers"].append(test.size / (test.time_us * 1e-6))
            moved = test.size * args.iterations
            efficiency["workers"].append(moved / max((cpu2 - cpu1) - (cpu1 - cpu0), 1e-3))
            nbytes = test.size * args.iterations
            for name, length in (("iperf3", 0), ("iperf3 -l", min(test.size, IPERF3_MAX_LENGTH))):
                rate, cpu = iperf3(nbytes, args.port, length)
                rates[name].append(rate)
                efficiency[name].append(nbytes / max(cpu, 1e-3))
            print(
                f"round {n}: "
                + "  ".join(f"{name} {v[-1] / 1e9:6.3f} GB/s" for name, v in rates.items())
                + f"  ratio {rates['workers'][-1] / rates['iperf3'][-1]:4.2f}",
                flush=True,
            )
    median_rate = {name: statistics.median(values) for name, values in rates.items()}
    eff = {name: statistics.median(values) for name, values in efficiency.items()}
    print(
        "median GB/s: "
        + ", ".join(f"{name} {value / 1e9:.3f}" for name, value in median_rate.items())
        + f"; workers / iperf3 {median_rate['workers'] / median_rate['iperf3']:.2f}"
        + f", workers / iperf3 -l {median_rate['workers'] / median_rate['iperf3 -l']:.2f}"
    )
    print(
        "GB per CPU second: "
        + ", ".join(f"{name} {value / 1e9:.2f}" for name, value in eff.items())
        + f"; workers / iperf3 {eff['workers'] / eff['iperf3']:.2f}"
        + f", workers / iperf3 -l {eff['workers'] / eff['iperf3 -l']:.2f}"
    )
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
