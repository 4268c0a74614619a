"""Collective bus bandwidth against each configuration's own ceiling, policies side by side.

    sudo .venv/bin/python benchmarks/collectives.py [--size 4M] [--iterations 3] [--rounds 3]
        [--policies path-pinned,ecmp] [--host-ports hash,balanced] [--baseline ecmp]
        [--order rank|topology-aware] [--scale 1e-4] [--channels 2] [--iperf]
        [--fabric astral-small] [--latency]

Brings the fabric up once (telemetry off: the controller's polling costs CPU the emulator
needs), then per round, per policy and per ``host_ports`` setting (how the hosts pick each
connection's NIC port, orchestrator/testbed/hostports.py; interleaved, so that the
machine's load hits every pair alike) runs all-reduce (ring, hierarchical) and all-to-all
(direct, PXN) at one size and prints busbw / the configuration's own ceiling
(orchestrator.collectives.ceilings: one GPU's NIC ports x the emulated NIC rate x TCP's
payload share 1460/1514, divided by the algorithm's share of fabric bytes, NVLink bytes
free), with busbw / rail bandwidth (NIC ports x emulated NIC rate, 2 x 20 Mbit/s on
astral-small) beside it, and then the two effects apart (orchestrator/results/effects.py):
balanced/hash per policy (the host's NIC ports) and each policy over the baseline per
host-ports setting (the switch policy). Targets, under path-pinned with balanced host
ports, against the own ceiling: all-reduce >= 0.90, all-to-all >= 0.85. A hierarchical
all-reduce or PXN all-to-all, whose ceiling is above the rail because NVLink carries a
share, is judged against that higher ceiling, not against the rail. The fabric's scaled
latencies are off unless ``--latency`` (a bandwidth benchmark; docs/latency.md measures the
latency apart).

``--iperf`` adds, per policy and host ports, iperf3 on exactly the fabric connections of
the ring and of direct all-to-all (the same NIC ports and paths), all at once for 8 s:
what long-lived TCP flows get from the emulator in the same pattern right now, the
reference for the collectives' figures.

The conditions that decide the figures are printed with them: load average before and
after, the CPU share ovs-vswitchd got during the collectives, other Open vSwitch bridges
on the machine (other users of the emulator), datapath, TSO and the emulated rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from orchestrator.collectives.ceilings import Ceiling
from orchestrator.collectives.latency import LatencyTable
from orchestrator.emulation.network import Terminated
from orchestrator.results.effects import (
    Arm,
    baseline_of,
    host_port_effect,
    split_gap,
    switch_policy_effect,
)
from orchestrator.run.experiment import parse_size, topology_aware_order
from orchestrator.testbed.hostports import add_host_ports_option
from orchestrator.testbed.pinning import (
    PATHS_FILE,
    fabric_flows,
    held_ports,
    plan_ports,
    wait_for_paths,
)
from orchestrator.testbed.testbed import Testbed
from orchestrator.testbed.traffic import process_ticks
from orchestrator.worker.spec import CollectiveTest, LaunchOptions
from topologies.catalog import resolve_fabric
from topologies.errors import ConcurrentRunError
from topologies.generators import build_fabric
from topologies.model import Fabric
from topologies.spec import EmulationSpec, FabricSpec, load_fabric_spec
from topologies.units import TCP_PAYLOAD_SHARE

ALGORITHMS = [
    ("all-reduce", "ring", 0.90),
    ("all-reduce", "hierarchical", 0.90),
    ("all-to-all", "direct", 0.85),
    ("all-to-all", "pxn", 0.85),
]
IPERF_PORT = 5301
IPERF_PATTERNS = [("all-reduce", "ring"), ("all-to-all", "direct")]


def vswitchd_cpu_seconds() -> float:
    """CPU seconds ovs-vswitchd has used so far (0 if it cannot be read)."""
    return process_ticks() / os.sysconf("SC_CLK_TCK")


def foreign_bridges(ours: set[str]) -> int:
    out = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=False)
    return len([b for b in out.stdout.split() if b not in ours])


def iperf_flows(
    bed: Testbed,
    gpus: list[str],
    op: str,
    alg: str,
    channels: int,
    seconds: int,
    host_ports: str,
) -> float:
    """iperf3 on the fabric connections of ``op``/``alg`` (one per peer pair and channel),
    all at once for ``seconds``, NIC ports (and paths under path-pinned) chosen as for the
    workers under ``host_ports``; the mean per sending GPU, over the rail bandwidth. What
    TCP gets from the emulator on those paths right now: the reference for the collective's
    figure."""
    workers = bed.workers(gpus)
    flows = fabric_flows(workers, [(op, alg)], channels)[0]
    emu = bed.emulation
    # one iperf3 server per (destination, source, channel): a server runs one test at a time
    port_of = {f: IPERF_PORT + 10 * f[0] + f[2] for f in flows}
    paths = None
    if bed.pins_source_ports:
        paths = wait_for_paths(bed.run_dir / PATHS_FILE, 0.0, policy=bed.policy)
    # iperf3 binds without SO_REUSEADDR: no port another socket holds (iperf3's own
    # connections of the last round linger in TIME_WAIT on the same planned ports); the
    # kernel's NIC choice depends on the server port, which plan_ports asks it with
    plan = plan_ports(
        emu,
        bed.description,
        workers,
        [flows],
        port_of,
        host_ports=host_ports,
        paths=paths,
        taken=held_ports(emu, workers),
    )
    ports = plan.ports
    servers = [
        emu.popen(workers[d].host, ["iperf3", "-s", "-1", "-p", str(port_of[(s, d, c)])],
                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for s, d, c in flows
    ]  # fmt: skip
    time.sleep(0.5)
    clients = []
    for s, d, c in flows:
        argv = ["iperf3", "-c", workers[d].fabric_ip, "-p", str(port_of[(s, d, c)]), "-J"]
        argv += ["-t", str(seconds), "-B", workers[s].fabric_ip]
        if ports.get((s, d, c)):
            argv += ["--cport", str(ports[(s, d, c)])]
        clients.append((s, emu.popen(workers[s].host, argv, stdout=subprocess.PIPE)))
    per_rank: dict[int, float] = {}
    failed = []
    for s, process in clients:
        out, _ = process.communicate(timeout=seconds + 60)
        try:
            bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
        except (ValueError, KeyError, TypeError):
            failed.append(f"rank {s}: {out.decode(errors='replace')[-200:]}")
            continue
        per_rank[s] = per_rank.get(s, 0.0) + bps / 8
    if failed:
        print(f"# iperf3: {len(failed)} of {len(clients)} flows failed: {failed[0]}")
    for server in servers:
        server.wait(timeout=10)
    return statistics.fmean(per_rank.values()) / bed.rail_bandwidth()


def effect_lines(
    medians: dict[tuple[Arm, str, str], float],
    policies: list[str],
    host_ports: list[str],
    wanted_baseline: str,
) -> list[str]:
    """The two effects apart, per collective (orchestrator/results/effects.py): the host
    ports' (balanced/hash, same policy) and the switch policy's (policy/baseline, same host
    ports), and the baseline/hash -> policy/balanced gap as their product."""
    baseline = baseline_of(policies, wanted_baseline)
    both = {"hash", "balanced"} <= set(host_ports)
    others = [p for p in policies if p != baseline]
    lines = []
    for op, alg, _ in ALGORITHMS:
        values = {arm: v for (arm, o, a), v in medians.items() if (o, a) == (op, alg)}
        cells = []
        if both:
            cells += [f"host ports {p} {host_port_effect(values, p):.2f}" for p in policies]
        cells += [
            f"switch policy {p}/{baseline} {h} {switch_policy_effect(values, p, h, baseline):.2f}"
            for p in others
            for h in host_ports
        ]
        lines.append(f"#   {op + ' (' + alg + ')':<27}" + ", ".join(cells))
        if both:
            lines += [f"#   {'':<27}{split_gap(values, p, baseline).describe()}" for p in others]
    head = "# effects apart: host ports = balanced/hash under one policy; switch policy = "
    return [head + f"a policy over {baseline} under the same host ports", *lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--size", default="4M", help="message size (default 4M)")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--policies", default="path-pinned,ecmp")
    add_host_ports_option(parser)
    parser.add_argument(
        "--baseline", default="ecmp", help="the policy the others' effect is measured against"
    )
    parser.add_argument("--order", default="rank", choices=["rank", "topology-aware"])
    parser.add_argument("--scale", type=float, help="emulation scale (default: the fabric's)")
    parser.add_argument(
        "--channels", type=int, help="connections per peer (default: as astral run chooses)"
    )
    parser.add_argument("--iperf", action="store_true", help="iperf3 on the ring's connections")
    parser.add_argument(
        "--latency", action="store_true", help="apply the fabric's scaled latencies (off)"
    )
    args = parser.parse_args()
    size = parse_size(args.size)
    policies = args.policies.split(",")
    spec = load_fabric_spec(resolve_fabric(args.fabric))
    if args.scale:
        spec = dataclasses.replace(spec, emulation=EmulationSpec(scale=args.scale))
    fabric = build_fabric(spec)
    gpus = fabric.gpus_by_rank()
    if args.order == "topology-aware":
        gpus = topology_aware_order(gpus)
    names = [g.name for g in gpus]

    bed = Testbed(spec, policy=policies[0], telemetry_interval=None)
    try:
        bed.start()
    except ConcurrentRunError as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 5
    try:
        return measure(args, bed, spec, fabric, names, size, policies)
    except (KeyboardInterrupt, Terminated) as stop:
        print(f"benchmark: interrupted ({stop or 'SIGINT'}); torn down", file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else stop.exit_status
    finally:
        bed.stop()


def measure(
    args: argparse.Namespace,
    bed: Testbed,
    spec: FabricSpec,
    fabric: Fabric,
    names: list[str],
    size: int,
    policies: list[str],
) -> int:
    host_ports: list[str] = args.host_ports
    arms: list[Arm] = [(p, h) for p in policies for h in host_ports]
    ratios: dict[tuple[Arm, str, str], list[float]] = {}  # busbw / own ceiling
    rail_ratios: dict[tuple[Arm, str, str], list[float]] = {}  # busbw / rail bandwidth
    wrong = 0
    iperf: dict[tuple[Arm, str, str], list[float]] = {}
    cpu_used = elapsed = 0.0
    load_before = os.getloadavg()
    others = foreign_bridges({s for s in fabric.switches})
    rail = bed.rail_bandwidth()
    ceilings: dict[tuple[str, str], Ceiling] = {
        (op, alg): bed.ceiling(names, op, alg) for op, alg, _ in ALGORITHMS
    }
    channels = {
        (op, alg): args.channels or bed.default_channels(names, [(op, alg)])
        for op, alg, _ in ALGORITHMS
    }
    for round_ in range(args.rounds):
        for arm in arms:  # host ports vary fastest: no controller restart between them
            policy, ports = arm
            bed.use_policy(policy)
            line = []
            for op, alg, _ in ALGORITHMS:  # one launch each, as astral run does
                options = LaunchOptions(
                    iterations=args.iterations,
                    warmup=1,
                    channels=channels[(op, alg)],
                    latency=None if args.latency else LatencyTable(),
                )
                with bed.launch(names, options, [(op, alg)], host_ports=ports) as launcher:
                    c0, t0 = vswitchd_cpu_seconds(), time.monotonic()
                    result = launcher.run([CollectiveTest(op, alg, size)])
                    elapsed += time.monotonic() - t0
                    cpu_used += vswitchd_cpu_seconds() - c0
                result.raise_for_failure()
                row = result.rows()[0]
                assert row.wrong is not None  # the workers verify unless told not to
                wrong += row.wrong
                ratio = ceilings[(op, alg)].share(row.busbw)
                ratios.setdefault((arm, op, alg), []).append(ratio)
                rail_ratios.setdefault((arm, op, alg), []).append(row.busbw * 1e9 / rail)
                line.append(f"{op}/{alg} {ratio:.3f}")
            if args.iperf:
                for op, alg in IPERF_PATTERNS:
                    ratio = iperf_flows(bed, names, op, alg, channels[(op, alg)], 8, ports)
                    iperf.setdefault((arm, op, alg), []).append(ratio)
                    line.append(f"iperf3 {op}/{alg} flows {ratio:.3f}")
            print(
                f"# round {round_ + 1} {policy + '/' + ports:>21}: " + ", ".join(line), flush=True
            )
    load_after = os.getloadavg()
    datapath = bed.emulation.datapath
    bed.stop()

    nic = spec.emulation.emulated(spec.speeds.nic)
    print(
        f"\n# busbw / own ceiling (busbw / rail bandwidth), median of {args.rounds} rounds; "
        f"{fabric.name}, "
        f"{len(names)} ranks (order {args.order}), {args.size} per operation, "
        f"{args.iterations} iterations (+1 warm-up); connections per peer: "
        + ", ".join(f"{alg} {n}" for (_, alg), n in channels.items())
    )
    print(
        f"# rail bandwidth = {spec.nic_ports} NIC ports x {nic / 1e6:g} Mbit/s emulated "
        f"(scale {spec.emulation.scale:g} of {spec.speeds.nic / 1e9:g}G) = "
        f"{rail / 1e6:.2f} MB/s; TCP over 1500-byte frames caps flat algorithms at "
        f"{TCP_PAYLOAD_SHARE:.3f}"
    )
    # columns: policy/host ports; targets are path-pinned/balanced's, against the ceiling
    print("# ceiling/rail: the algorithm's own ceiling as a multiple of the rail bandwidth")
    head = "".join(f"{p + '/' + h:>24}" for p, h in arms)
    print(f"#{'collective':<27}{head}{'target':>12}{'ceiling/rail':>14}")
    medians = {key: statistics.median(values) for key, values in ratios.items()}
    on_rail = {key: statistics.median(values) for key, values in rail_ratios.items()}
    for op, alg, target in ALGORITHMS:
        cells = "".join(
            f"{medians[(arm, op, alg)]:>16.3f} ({on_rail[(arm, op, alg)]:.3f})" for arm in arms
        )
        over = ceilings[(op, alg)].busbw * 1e9 / rail
        print(f" {op + ' (' + alg + ')':<27}{cells}{'>= ' + format(target, '.2f'):>12}"
              f"{over:>14.3f}")  # fmt: skip
    if args.iperf:
        for op, alg in IPERF_PATTERNS:
            cells = "".join(f"{statistics.median(iperf[(arm, op, alg)]):>22.3f}" for arm in arms)
            print(f" {'iperf3, ' + alg + ' flows':<27}{cells}")
    print("\n".join(effect_lines(medians, policies, host_ports, args.baseline)))
    print(f"# #wrong over all operations: {wrong}")
    share = cpu_used / elapsed if elapsed else float("nan")
    tso = {True: "on", False: "off", None: "n/a"}[datapath.tso if datapath else None]
    print(
        f"# conditions: load average {load_before[0]:.2f} -> {load_after[0]:.2f} "
        f"on {os.cpu_count()} CPUs; ovs-vswitchd used {share:.0%} of a CPU during the "
        f"collectives; {others} other Open vSwitch bridges on this machine; datapath "
        f"{datapath.kind if datapath else '?'}, userspace TSO {tso}; scaled latency "
        f"{'on' if args.latency else 'off'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
