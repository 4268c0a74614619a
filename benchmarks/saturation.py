"""When does the emulator stop keeping up? Goodput against the CPU figures the runner samples.

    sudo .venv/bin/python benchmarks/saturation.py [--hogs 0,1,2,3] [--steps 4x1,8x1,8x1.5,8x2]
        [--repeat 2] [--duration 4] [--omit 1.5] [--collectives] [--scale 1e-4]
        [--json FILE] [--lock-wait SECONDS]

What it measures the live saturation flag's thresholds with (orchestrator.calibration.
saturation; docs/calibration.md, "Saturation"): the machine's idle CPU share and the cores
ovs-vswitchd got (orchestrator.testbed.cpuload, the runner's sampler), against the goodput
the emulator delivered, while CPU-bound processes (``--hogs``: busy loops this benchmark
starts and stops, as other work on a shared machine would) compete with it.

Flows (default): astral-small's calibration fabric (orchestrator.calibration.measure:
trunks 4x the NIC rate, flows GPU i <-> i + n/2 across the pods, 5 switches each). Each
step ``NxF`` is N iperf3 flows with every link re-shaped to F x the NIC rate (20 Mbit/s);
each runs under every number of hogs, ``--repeat`` times, interleaved. Per window:

    ratio      goodput / (flows x rate x 1460/1514), the calibration's fidelity ratio
    idle       share of all CPUs idle over the window
    ovs cores  cores ovs-vswitchd used over the window
    carried    goodput x switches crossed (hop-Gbit/s; the runner counts the same for a
               configuration from its workers' bytes)
    c/hopG     ovs cores / carried: what the thresholds are made of

and then, for candidate thresholds ``cores_per_hop_gbps``, how the rule "idle below
5 % and c/hopG below it" sorts the windows: flagged, windows under the target ratio
(0.9, the calibration's threshold) it misses, windows it flags that met the target.

``--collectives``: the runner itself (the code ``astral run`` runs) on astral-small at
``--scale``, under each number of hogs: all-reduce (ring) and all-to-all (direct) at 1M and
4M under path-pinned, and each configuration's busbw / its ceiling next to the flag the
runner gave it. Targets (issue 5): all-reduce >= 0.90, all-to-all >= 0.85 of the rail.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from orchestrator import REPO
from orchestrator.calibration.capacity import switch_hops
from orchestrator.calibration.measure import (
    calibration_fabric,
    calibration_flows,
    datapath_ports,
    reshape,
    start_emulation,
    step_of,
)
from orchestrator.calibration.saturation import DEFAULT_THRESHOLDS, Thresholds
from orchestrator.collectives.ceilings import busbw_ceiling
from orchestrator.emulation.network import Terminated
from orchestrator.run.experiment import parse_experiment
from orchestrator.run.runner import Runner, RunOptions
from orchestrator.testbed.cpuload import CpuLoad, CpuSampler, load_between
from orchestrator.testbed.testbed import Testbed
from topologies.catalog import resolve_fabric
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

TARGET = 0.9  # the calibration's fidelity threshold
LOOPBACK_PORT = 5801  # the net competitors' iperf3 servers, root namespace loopback
COLLECTIVE_TARGETS = {"all-reduce": 0.90, "all-to-all": 0.85}


@dataclass(frozen=True)
class Window:
    flows: int
    factor: float
    hog: str  # "cpu" or "net", with hogs > 0
    hogs: int
    ratio: float
    offered_hop_bps: float
    load: CpuLoad
    retransmits: int
    loadavg: float


@contextmanager
def hogs(kind: str, n: int) -> Iterator[None]:
    """``n`` competitors for the block's duration, stopped by their pids afterwards:
    ``cpu``, busy loops; ``net``, unshaped iperf3 streams over the root namespace's
    loopback (kernel network work, like other tests' TCP on the machine)."""
    started: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str]) -> subprocess.Popen[bytes]:
        null = subprocess.DEVNULL
        return subprocess.Popen(argv, stdin=null, stdout=null, stderr=null)

    try:
        if kind == "cpu":
            started += [spawn([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        else:
            ports = [LOOPBACK_PORT + i for i in range(n)]
            started += [spawn(["iperf3", "-s", "-p", str(p)]) for p in ports]
            time.sleep(0.3)
            started += [
                spawn(["iperf3", "-c", "127.0.0.1", "-p", str(p), "-t", "600"]) for p in ports
            ]
        time.sleep(0.3)  # let the scheduler spread them
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def parse_steps(text: str) -> list[tuple[int, float]]:
    steps = []
    for item in text.split(","):
        flows, _, factor = item.partition("x")
        steps.append((int(flows), float(factor or 1)))
    return steps


def competitors(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(kind, count) per window: no competitor once, then every count of every kind."""
    counts = [int(h) for h in args.hogs.split(",") if h and int(h) > 0]
    kinds = [k for k in args.hog_kind.split(",") if k]
    return [("none", 0)] + [(k, n) for k in kinds for n in counts]


def window_line(w: Window, thresholds: Thresholds) -> str:
    verdict = "YES" if thresholds.reasons(w.load, w.offered_hop_bps) else "no"
    return (
        f"{w.flows:>5} {w.factor:>5g} {w.hog:>4}{w.hogs:<2} {w.ratio:>6.3f} "
        f"{w.offered_hop_bps / 1e9:>7.2f} {w.load.idle_share:>5.0%} {w.load.vswitchd_cores:>5.2f} "
        f"{w.load.vswitchd_wait:>5.0%} {w.load.softirqd_wait:>6.0%} {w.retransmits:>5} "
        f"{w.loadavg:>5.1f} {verdict:>5}"
    )


WINDOW_HEADER = (
    f"{'flows':>5} {'xrate':>5} {'hogs':<6} {'ratio':>6} {'offered':>7} {'idle':>5} "
    f"{'ovs c':>5} {'ovs w':>5} {'sirq w':>6} {'retx':>5} {'load':>5} {'flag':>5}"
)


def measure_flows(args: argparse.Namespace) -> list[Window]:
    from orchestrator.testbed.traffic import run_flows

    spec = calibration_fabric(load_fabric_spec(resolve_fabric(args.fabric)))
    model = build_fabric(spec)
    flows = calibration_flows(model)
    hops = {f: switch_hops(model, f.src)[f.dst] for f in flows}
    base = spec.emulation.emulated(spec.speeds.nic)
    emu = start_emulation(spec, args.lock_wait, lambda m: print(f"# {m}", flush=True))
    windows: list[Window] = []
    print(f"# datapath ports {datapath_ports()}; NIC rate {base / 1e6:g} Mbit/s")
    print(WINDOW_HEADER)
    try:
        factor = 1.0
        for count, step_factor in parse_steps(args.steps):
            chosen = flows[: min(count, len(flows))]
            if step_factor != factor:
                reshape(emu, spec.emulation.scale * step_factor)
                factor = step_factor
            for _ in range(args.repeat):
                for kind, n in competitors(args):
                    with hogs(kind, n), CpuSampler() as sampler:
                        began = time.time()
                        result = run_flows(emu, chosen, duration=args.duration, omit=args.omit)
                    load = load_between(
                        sampler.samples, began + args.omit, began + args.omit + args.duration
                    )
                    step = step_of(result, chosen, base * factor, hops)
                    assert load is not None
                    window = Window(
                        flows=len(chosen),
                        factor=factor,
                        hog=kind,
                        hogs=n,
                        ratio=step.ratio,
                        offered_hop_bps=step.offered_hop_bps,
                        load=load,
                        retransmits=step.retransmits,
                        loadavg=os.getloadavg()[0],
                    )
                    windows.append(window)
                    print(window_line(window, DEFAULT_THRESHOLDS), flush=True)
    finally:
        emu.stop()
    return windows


def variations() -> list[tuple[str, Thresholds]]:
    """The rule as shipped, and each of its figures moved either way."""
    t = DEFAULT_THRESHOLDS
    out = [("as shipped", t)]
    for name, values in (
        ("idle_share", (0.02, 0.10)),
        ("cores_per_hop_gbps", (0.25, 0.30, 0.40, 0.50)),
        ("vswitchd_wait", (0.1, 0.3)),
        ("softirqd_wait", (0.15, 0.40)),
    ):
        out += [(f"{name} {v:g}", replace(t, **{name: v})) for v in values]
    return out


def sort_windows(windows: Sequence[Window]) -> list[str]:
    """How the rule and its variations sort the windows (see the module docstring)."""
    below = [w for w in windows if w.ratio < TARGET]
    lines = [
        f"# {len(windows)} windows, {len(below)} below the target ratio {TARGET}",
        f"# {'rule':<26} {'flagged':>7} {'missed':>6} {'false':>5}   "
        "(missed: below the target, not flagged; false: flagged, met the target)",
    ]
    for name, rule in variations():
        flagged = [w for w in windows if rule.reasons(w.load, w.offered_hop_bps)]
        missed = sum(1 for w in below if w not in flagged)
        false = sum(1 for w in flagged if w.ratio >= TARGET)
        lines.append(f"# {name:<26} {len(flagged):>7} {missed:>6} {false:>5}")
    return lines


def measure_collectives(args: argparse.Namespace) -> list[dict[str, object]]:
    spec = load_fabric_spec(resolve_fabric(args.fabric))
    document = {
        "name": "saturation-bench",
        "fabric": args.fabric,
        "policies": ["path-pinned"],
        "collectives": [
            {"op": "all-reduce", "algorithm": "ring"},
            {"op": "all-to-all", "algorithm": "direct"},
        ],
        "sizes": {"min": "256K", "max": "4M", "factor": 4},
        "iterations": 3,
        "warmup": 1,
        "scale": args.scale,
        "load_limit": {"force": True},
    }
    experiment = parse_experiment(document, "benchmarks/saturation.py", REPO)
    rows: list[dict[str, object]] = []
    with Testbed(
        experiment.fabric, policy="path-pinned", telemetry_interval=None, lock_wait=args.lock_wait
    ) as bed:
        workers = bed.workers(experiment.gpus)
        print(
            f"# {spec.name} at scale {args.scale:g}: rail {bed.rail_bandwidth() * 8 / 1e6:g} "
            "Mbit/s per GPU"
        )
        print(
            f"{'hogs':<6} {'collective':<22} {'size':>8} {'busbw/ceil':>10} {'idle':>5} "
            f"{'ovs c':>5} {'ovs w':>5} {'sirq w':>6} {'flag':>5}"
        )
        for _ in range(args.repeat):
            for kind, n in competitors(args):
                out = Path(args.bundles) / f"{kind}{n}-{time.strftime('%H%M%S')}"
                with hogs(kind, n), open(os.devnull, "w") as quiet:
                    outcome = Runner(experiment, RunOptions(out=out, plots=False), out=quiet).run(
                        bed
                    )
                for result in outcome.results:
                    c = result.configuration
                    load = outcome.emulator.get(c.id)
                    ceiling = busbw_ceiling(
                        workers, c.collective, c.algorithm, bed.rail_bandwidth()
                    )
                    share = result.row.busbw * 1e9 / ceiling
                    label = f"{c.collective} ({c.algorithm})"
                    rows.append(
                        {
                            "hog": kind,
                            "hogs": n,
                            "collective": label,
                            "size": c.size,
                            "busbw_share_of_ceiling": share,
                            "target": COLLECTIVE_TARGETS.get(c.collective, 0.85),
                            "load": load.to_dict() if load else None,
                        }
                    )
                    figures = "(not sampled)"
                    if load is not None:
                        figures = (
                            f"{load.idle_share:>5.0%} {load.vswitchd_cores:>5.2f} "
                            f"{load.vswitchd_wait:>5.0%} {load.softirqd_wait:>6.0%} "
                            f"{'YES' if load.saturated else 'no':>5}"
                        )
                    print(
                        f"{kind:>4}{n:<2} {label:<22} {c.size:>8} {share:>10.3f} {figures}",
                        flush=True,
                    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--hogs", default="1,2", help="numbers of competitors, comma-separated")
    parser.add_argument("--hog-kind", default="cpu,net", help="kinds of competitors: cpu, net")
    parser.add_argument("--steps", default="8x1,8x1.5,8x2", help="FLOWSxRATE-FACTOR, ...")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--duration", type=float, default=4.0, help="measuring window, s")
    parser.add_argument("--omit", type=float, default=1.5, help="seconds before the window")
    parser.add_argument("--collectives", action="store_true", help="the runner, not iperf3")
    parser.add_argument("--scale", type=float, default=1e-4, help="--collectives' scale")
    parser.add_argument("--bundles", default="/tmp/astral-saturation", help="--collectives")
    parser.add_argument("--json", type=Path, default=None, help="write every window here")
    parser.add_argument("--lock-wait", type=float, default=900.0)
    args = parser.parse_args(argv)
    unknown = {k for k in args.hog_kind.split(",") if k} - {"cpu", "net"}
    if unknown:
        parser.error(f"unknown --hog-kind {sorted(unknown)}; known: cpu, net")
    began = time.monotonic()
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    try:
        if args.collectives:
            document: object = measure_collectives(args)
        else:
            windows = measure_flows(args)
            for line in sort_windows(windows):
                print(line)
            document = [asdict(w) for w in windows]
    except (KeyboardInterrupt, Terminated):
        return 130
    print(
        f"# took {time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.2f} at the end"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
