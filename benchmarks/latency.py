"""Scaled latency measured: a 2-rank ping-pong's emulated round trip against the configured.

    sudo .venv/bin/python benchmarks/latency.py [--scales 0.6e-4,1e-4,1e-3] [--size 1K]
        [--iterations 10] [--rounds 2] [--fabric astral-small]

Per scale, brings the fabric up once (policy ``shortest``, telemetry off) and runs, through
the real workers on the emulated fabric, a 2-rank ring all-reduce of ``--size`` between
pairs of GPUs of each kind of path (NVLink, same ToR, cross-pod on astral-small). A 2-rank
ring all-reduce is a ping-pong: two steps, each a message of size / 2 each way, the second
sent only when the first has arrived, so one operation is one round trip. The per-operation
latency is left out here (the launch's table has only the paths' one-way latencies), so the
configured round trip is 2 x the pair's one-way latency / scale.

Columns: the configured round trip; the measured one (the workers' own time per operation,
mean over ranks and timed iterations, nccl-tests' time column) with latency on, and the
same operation with latency off (what the emulator itself takes for the two messages: the
floor the emulated latency sits on); ratio = on / configured (target 0.90-1.10); and
(on - off) / configured, the share of the added wait that shows up in the round trip.
On and off alternate within each round, so the machine's load hits both alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time

from orchestrator.collectives.latency import LatencyTable
from orchestrator.emulation.network import Terminated
from orchestrator.run.experiment import parse_size
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from topologies.catalog import resolve_fabric
from topologies.errors import ConcurrentRunError
from topologies.generators import build_fabric
from topologies.latency import pair_latencies
from topologies.model import Fabric
from topologies.spec import EmulationSpec, FabricSpec, load_fabric_spec

LOCK_WAIT = 900.0  # other runs on the machine: wait for the lock rather than fail


def pairs_by_path(fabric: Fabric) -> list[tuple[str, str, str, float]]:
    """One (label, src, dst, real one-way seconds) per kind of path, from rank 0's GPU."""
    first = fabric.gpus_by_rank()[0].name
    chosen: dict[str, tuple[str, str, str, float]] = {}
    for (src, dst), path in pair_latencies(fabric).items():
        if src == first and path.label not in chosen:
            chosen[path.label] = (path.label, src, dst, path.seconds)
    return sorted(chosen.values(), key=lambda pair: pair[3])


def round_trip_us(bed: Testbed, gpus: list[str], size: int, iterations: int, on: bool) -> float:
    """The workers' mean time per operation (us) of a 2-rank ring all-reduce on ``gpus``."""
    table = bed.latency_table(gpus)
    latency = dataclasses.replace(table, operation=0.0) if on else LatencyTable()
    options = LaunchOptions(warmup=1, iterations=iterations, channels=1, latency=latency)
    result = bed.run([CollectiveTest("all-reduce", "ring", size)], gpus, options)
    result.raise_for_failure()
    (row,) = result.rows()
    if row.wrong:
        raise RuntimeError(f"{row.wrong} wrong elements between {gpus}")
    return row.time_us


def measure_scale(spec: FabricSpec, args: argparse.Namespace, size: int) -> list[list[str]]:
    fabric = build_fabric(spec)
    scale = spec.emulation.scale
    pairs = pairs_by_path(fabric)
    on: dict[str, list[float]] = {p[0]: [] for p in pairs}
    off: dict[str, list[float]] = {p[0]: [] for p in pairs}
    bed = Testbed(spec, policy="shortest", telemetry_interval=None, lock_wait=LOCK_WAIT)
    bed.start()
    try:
        for _ in range(args.rounds):
            for label, src, dst, _ in pairs:
                on[label].append(round_trip_us(bed, [src, dst], size, args.iterations, True))
                off[label].append(round_trip_us(bed, [src, dst], size, args.iterations, False))
    finally:
        bed.stop()
    rows = []
    for label, src, dst, seconds in pairs:
        configured = 2 * seconds / scale * 1e3  # ms
        measured = statistics.fmean(on[label]) / 1e3
        floor = statistics.fmean(off[label]) / 1e3
        rows.append(
            [
                f"{scale:g}",
                label,
                f"{src}-{dst}",
                f"{seconds * 1e6:.1f}",
                f"{configured:.2f}",
                f"{measured:.2f}",
                f"{floor:.2f}",
                f"{measured / configured:.3f}",
                f"{(measured - floor) / configured:.3f}",
            ]
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--scales", default="0.6e-4,1e-4,1e-3")
    parser.add_argument("--size", default="1K", help="all-reduce size (each message: half)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    size = parse_size(args.size)
    base = load_fabric_spec(resolve_fabric(args.fabric))
    if not base.latency.enabled:
        print(f"benchmark: {args.fabric} has `latency: off`", file=sys.stderr)
        return 2
    header = ["scale", "path", "pair", "1-way us", "conf. ms", "on ms", "off ms", "on/conf",
              "(on-off)/conf"]  # fmt: skip
    widths = [7, 11, 15, 8, 9, 9, 8, 8, 13]
    print(f"# {args.fabric}, 2-rank ring all-reduce of {size} B ({size // 2} B each way and"
          f" step), {args.iterations} iterations (+1 warm-up) x {args.rounds} rounds per cell;"
          f" load average {os.getloadavg()[0]:.2f} at the start")  # fmt: skip
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    began = time.monotonic()
    try:
        for scale in (float(s) for s in args.scales.split(",")):
            spec = dataclasses.replace(base, emulation=EmulationSpec(scale=scale))
            for row in measure_scale(spec, args, size):
                print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)), flush=True)
    except ConcurrentRunError as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 5
    except (KeyboardInterrupt, Terminated) as stop:
        print(f"benchmark: interrupted ({stop or 'SIGINT'}); torn down", file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else stop.exit_status
    print(
        f"# took {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.2f} at the end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
