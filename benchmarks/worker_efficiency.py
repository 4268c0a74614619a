"""Worker efficiency: the workers against iperf3 on one unshaped link between two GPUs.

    sudo .venv/bin/python benchmarks/worker_efficiency.py [--size 64M] [--iterations 5]
        [--rounds 5] [--fabric astral-small] [--pair p0s0g0,p0s0g1]

Brings the fabric up, takes two GPUs of one server and removes the shaping from both ends
of both their NVLink links (the GPU's ``eth0`` and the bridge's port), so that the only
limits left are the kernel (veth, Linux bridge) and the programs. Then, per round, the
same transfer by the workers (``p2p/direct``: rank 0 sends ``size`` bytes to rank 1 over
one TCP connection on the NVLink addresses, timed per operation at the receiver, as
nccl-tests times) and by iperf3 between the same namespaces and addresses (``-n`` the
same bytes per operation x iterations, ``-l 1M``). Prints both rates, their ratio (target
>= 0.8) and the median over rounds, with the load average: both share the CPU with
whatever else runs, so interleaving rounds is what keeps the ratio fair.

What differs by design: iperf3 sends one cache-resident buffer again and again; the
workers move a real ``size``-byte buffer that is filled before and verified after each
operation (outside the timing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from orchestrator.collectives.sizes import parse_size
from orchestrator.emulation.shaping import unshaping_commands
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from topologies.errors import ConcurrentRunError
from topologies.model import LinkKind

IPERF_PORT = 5401
IPERF_LENGTH = 1 << 20  # iperf3's largest -l


def unshape(bed: Testbed, gpus: list[str]) -> list[str]:
    """Remove the shapers of the NVLink links of ``gpus`` (both ends); returns the ends."""
    wiring = bed.emulation.wiring
    assert wiring is not None
    ends = []
    for veth in wiring.veths:
        if veth.kind is LinkKind.NVLINK and veth.b_host in gpus:
            for node, intf in ((None, veth.a_intf), (veth.b_host, veth.b_intf)):
                for argv in unshaping_commands(intf):
                    bed.emulation.run(node, argv)  # fails only where no shaper is left
            ends += [veth.a_intf, f"{veth.b_host}:{veth.b_intf}"]
    return ends


def iperf3(bed: Testbed, src: str, dst: str, dst_ip: str, nbytes: int) -> float:
    """Bytes/s iperf3 receives moving ``nbytes`` from ``src`` to ``dst_ip`` (on ``dst``)."""
    emu = bed.emulation
    server = emu.popen(dst, ["iperf3", "-s", "-1", "-p", str(IPERF_PORT)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        time.sleep(0.3)
        argv = ["iperf3", "-c", dst_ip, "-p", str(IPERF_PORT), "-n", str(nbytes), "-J"]
        argv += ["-l", str(IPERF_LENGTH)]
        client = emu.popen(src, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, _ = client.communicate(timeout=300)
        received = json.loads(out)["end"]["sum_received"]
        return float(received["bytes"]) / float(received["seconds"])
    finally:
        server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="astral-small")
    parser.add_argument("--pair", default="p0s0g0,p0s0g1", help="two GPUs of one server")
    parser.add_argument("--size", default="64M")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    size = parse_size(args.size)
    pair = args.pair.split(",")
    bed = Testbed(args.fabric, policy="shortest", telemetry_interval=None)
    try:
        bed.start()
    except ConcurrentRunError as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 5
    rates: dict[str, list[float]] = {"workers": [], "iperf3": []}
    try:
        fabric = bed.description.fabric
        if len(pair) != 2 or fabric.gpus[pair[0]].server != fabric.gpus[pair[1]].server:
            raise SystemExit("--pair: two GPUs of the same server")
        ends = unshape(bed, pair)
        dst_ip = bed.description.addresses[pair[1]].nvlink.ip
        print(f"# unshaped: {', '.join(ends)}; transfer {pair[0]} -> {pair[1]} ({dst_ip})")
        load_before = os.getloadavg()
        options = LaunchOptions(warmup=1, iterations=args.iterations, channels=1)
        test = CollectiveTest("p2p", "direct", size)
        with bed.launch(pair, options, [("p2p", "direct")]) as launcher:
            for n in range(args.rounds):
                result = launcher.run([test])
                result.raise_for_failure()
                done = result.tests[0]
                assert done.wrong == 0
                rates["workers"].append(done.size / (done.time_us * 1e-6))
                rates["iperf3"].append(
                    iperf3(bed, pair[0], pair[1], dst_ip, done.size * args.iterations)
                )
                print(
                    f"round {n + 1}: workers {rates['workers'][-1] / 1e9:.3f} GB/s, iperf3 "
                    f"{rates['iperf3'][-1] / 1e9:.3f} GB/s, ratio "
                    f"{rates['workers'][-1] / rates['iperf3'][-1]:.2f}",
                    flush=True,
                )
        load_after = os.getloadavg()
    finally:
        bed.stop()
    workers, iperf = statistics.median(rates["workers"]), statistics.median(rates["iperf3"])
    ratios = [w / i for w, i in zip(rates["workers"], rates["iperf3"], strict=True)]
    print(
        f"median: workers {workers / 1e9:.3f} GB/s, iperf3 {iperf / 1e9:.3f} GB/s; "
        f"workers / iperf3 {statistics.median(ratios):.2f} (target >= 0.80; rounds "
        f"{min(ratios):.2f}..{max(ratios):.2f})"
    )
    print(
        f"# {args.size} per operation, {args.iterations} operations per round (+1 warm-up), "
        f"one TCP connection, unshaped NVLink (veth + Linux bridge); load average "
        f"{load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
