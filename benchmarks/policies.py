"""The load-balancing policies side by side: a cross-core permutation, and recovery times.

    sudo .venv/bin/python benchmarks/policies.py [--fabric astral-small|PATH]
        [--duration S] [--omit S] [--repeats N] [--seed N] [--policies a,b,...]
        [--host-ports hash,balanced] [--baseline ecmp] [--scale X] [--no-recovery]
        [--lock-wait S]

One fabric is brought up once (:class:`orchestrator.testbed.testbed.Testbed`); every policy of the
controller's registry (controllers/policies/: shortest, ecmp, ecmp-polarized, path-pinned,
adaptive) is switched in by :meth:`Testbed.use_policy` (a controller restart on the same
port, hitless) and measured on the same traffic, once per ``host_ports`` setting (how the
hosts pick each flow's NIC port, orchestrator/testbed/hostports.py: ``hash``, the kernel's
multipath hash, and ``balanced``, spread by the orchestrator), so that the switch policy's
effect (same host ports, another policy) and the host ports' (same policy, hash against
balanced) are measured apart, side by side in one run (orchestrator/results/effects.py):

- a permutation in which every GPU sends one long TCP flow to a GPU of another pod (so
  every flow crosses the core); a different random permutation per repeat (``--seed`` +
  repeat), the same one for every policy within a repeat, built rather than sampled
  (:func:`cross_group_derangement`; a fabric where one pod holds more than half the GPUs
  has none and is refused before bring-up);
- the policies' order rotates by one per repeat (the machine's load drifts during a run),
  and so does the order of the host-ports settings under each;
- flows are iperf3 clients in the GPUs' namespaces, measured by
  :func:`orchestrator.testbed.traffic.run_flows`: goodput at the receivers over one common window
  (``--duration`` s, after ``--omit`` s of start-up; adaptive moves flows 2-3 s after they
  start), link loads from the HTB counters of every switch egress (tc);
- the source ports come from orchestrator.testbed.pinning, as for the workers: under
  ``balanced`` each flow gets the least loaded NIC port of its GPU (under ``path-pinned``
  the least loaded (NIC port, path value)), then a source port whose kernel multipath hash
  picks that NIC port, checked with ``ip route get`` for the flow's exact five-tuple; under
  ``hash`` the flows use the kernel's ephemeral ports, except under ``path-pinned``, where
  the port pins a path among those leaving by the NIC port the kernel's hash gives a random
  ephemeral port.

Ideal (printed with the results): every flow at min(the emulated NIC port rate, its fair
share of a non-blocking fabric: the pod's core uplink capacity over the flows leaving the
pod), times the TCP payload share of a frame (1460/1514, no timestamps): one flow per GPU
leaves by one of its NIC ports, and every receiver gets one flow, so on a non-blocking
fabric nothing else limits it. ``achieved/ideal`` is the sum of the goodputs over the sum of
the ideals. With random hashing of n flows over n equal paths, a share 1 - (1 - 1/n)^n of
the paths carries traffic (about 0.6-0.66 of ideal); ``path-pinned`` under ``balanced``
should reach at least 0.9; polarized ECMP (every tier hashes alike) should stay below
salted ECMP.

``core links`` counts the directed aggregation-core links that carried at least a quarter
of a flow's ideal rate during the window (tc counters of the switch egress), out of those
that exist.

Recovery (unless ``--no-recovery``): a 1000 packet/s UDP stream between the first GPUs of
two pods (tests/integration/stream_probe.py, as the policies' integration tests use it)
under ``shortest``; after 1 s the ToR uplink it uses goes down. (a) data plane: fast-failover
groups (``shortest:fast_failover=on``) with the controller stopped; (b) controller-driven:
no fast-failover, the controller re-routes on the port status. Printed: the longest gap
the receiver saw, packets lost, and (b) when every switch was re-programmed.

``--scale X`` overrides the fabric's emulation scale (emulated = real x X; astral-small's
is 1e-4: 200G -> 20 Mbit/s): a lower rate lowers the load on the userspace datapath, so the
policies are compared on the fabric rather than on the machine's CPUs.

Conditions (load average, datapath, TSO, emulated rates, CPU use during the window) are
printed with the results; a result is flagged emulator-bound when the offered load exceeds
the calibrated safe share (orchestrator.calibration.capacity; ``sudo astral calibrate``) or the
machine's CPUs were over 90 % busy during a window. Measured figures: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.policies import default_registry as policy_registry
from orchestrator.calibration.capacity import (
    OfferedLoad,
    Verdict,
    load_calibration,
    mean_hops,
    verdict,
)
from orchestrator.calibration.measure import machine_conditions
from orchestrator.emulation.faults import FabricFaults
from orchestrator.emulation.wiring import intf_name
from orchestrator.results.effects import (
    Arm,
    baseline_of,
    host_port_effect,
    split_gap,
    switch_policy_effect,
)
from orchestrator.testbed.hostports import HOST_PORTS, add_host_ports_option
from orchestrator.testbed.pinning import PATHS_FILE, wait_for_paths
from orchestrator.testbed.testbed import Testbed
from orchestrator.testbed.traffic import (
    Flow,
    TrafficResult,
    parse_qdiscs,
    run_flows,
)
from orchestrator.testbed.traffic import planned_flows as traffic_plan
from topologies.catalog import resolve_fabric
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind, Tier
from topologies.spec import EmulationSpec, FabricSpec, load_fabric_spec
from topologies.units import TCP_PAYLOAD_SHARE

# The policies' integration tests' traffic generator, run as a script in the GPUs.
PROBE = Path(__file__).resolve().parents[1] / "tests" / "integration" / "stream_probe.py"
UDP_PORT = 5005
STREAM_RATE = 1000  # packets/s
CORE_SHARE = 0.25  # a core link "used": at least this share of a flow's ideal rate
BUSY_CPU = 0.9  # CPU share above which a window is flagged emulator-bound


# --- pure helpers ---------------------------------------------------------------------------


def cross_pod_permutation(fabric: Fabric, seed: int) -> list[tuple[str, str]]:
    """A random permutation of the GPUs in which nobody sends inside its own pod, the same
    for the same seed. Raises ValueError when none exists: a pod holds more than half the
    GPUs (its GPUs need more partners outside it than there are)."""
    gpus = fabric.gpus_by_rank()
    targets = cross_group_derangement([g.pod for g in gpus], random.Random(seed))
    return [(gpus[i].name, gpus[j].name) for i, j in enumerate(targets)]


def cross_group_derangement(groups: Sequence[object], rng: random.Random) -> list[int]:
    """``targets``, a permutation of ``range(len(groups))`` with ``groups[i] !=
    groups[targets[i]]`` for every i, built, not sampled (random permutations that happen
    to cross pods are rare: 1 in 48620 for two pods of 9 GPUs).

    Construction: the members in a random order of groups, each group's members in a random
    order and contiguous; each one sends to the member ``m`` places further round the
    circle, ``m`` the largest group's size. A group's block is at most ``m`` long and at
    most ``n - m`` (when ``m <= n / 2``), so neither way round does a member land in its
    own block. Then random swaps of two members' targets, each kept only if both still
    leave their group, mix the result (a swap walk that never leaves the valid set), so
    that it is not always a rotation. Deterministic for ``rng``'s seed.
    """
    n = len(groups)
    members: dict[object, list[int]] = {}
    for i, group in enumerate(groups):
        members.setdefault(group, []).append(i)
    largest = max((len(m) for m in members.values()), default=0)
    if n and 2 * largest > n:
        big = max(members, key=lambda g: len(members[g]))
        raise ValueError(
            f"no cross-pod permutation exists: pod {big} holds {largest} of the {n} GPUs, "
            f"more than half, so its GPUs cannot all send outside it"
        )
    order = list(members)
    rng.shuffle(order)
    circle: list[int] = []
    for group in order:
        block = members[group][:]
        rng.shuffle(block)
        circle += block
    targets = [0] * n
    for position, member in enumerate(circle):
        targets[member] = circle[(position + largest) % n]
    for _ in range(8 * n):
        a, b = rng.randrange(n), rng.randrange(n)
        if groups[a] != groups[targets[b]] and groups[b] != groups[targets[a]]:
            targets[a], targets[b] = targets[b], targets[a]
    return targets


def ideal_flow_bps(fabric: Fabric, pairs: Sequence[tuple[str, str]]) -> float:
    """min(a GPU's NIC ports over its flows (one port per flow at most), a pod's core
    uplink capacity / flows leaving it), payload only. ``pairs`` may repeat a pair: several
    flows per GPU."""
    spec = fabric.spec
    nic = spec.emulation.emulated(spec.speeds.nic)
    per_gpu = max(Counter(s for s, _ in pairs).values(), default=1)
    share = nic * min(spec.nic_ports, per_gpu) / per_gpu
    for pod in {fabric.gpus[s].pod for s, _ in pairs}:
        leaving = sum(
            1
            for s, d in pairs
            if fabric.gpus[s].pod == pod and fabric.gpus[d].pod != fabric.gpus[s].pod
        )
        uplink = sum(
            spec.emulation.emulated(spec.speeds.agg_core)
            for link in fabric.links_of_kind(LinkKind.AGG_CORE)
            for end in (link.a, link.b)
            if fabric.switches[end].tier is Tier.AGG and fabric.switches[end].pod == pod
        )
        if leaving:
            share = min(share, uplink / leaving)
    return share * TCP_PAYLOAD_SHARE


def hashing_expectation(n: int) -> float:
    """Share of n equal paths that n randomly hashed flows use: 1 - (1 - 1/n)^n."""
    return 1 - (1 - 1 / n) ** n if n else 0.0


@dataclass
class PolicyRun:
    policy: str
    host_ports: str
    repeat: int
    result: TrafficResult
    ideal_bps: float  # per flow
    core_used: int
    core_total: int
    switch_s: float
    unpinned: int = 0

    @property
    def ratio(self) -> float:
        return self.result.aggregate_bps / (self.ideal_bps * len(self.result.flows))

    @property
    def rates(self) -> list[float]:
        return [f.goodput_bps for f in self.result.flows]


@dataclass
class Recovery:
    mode: str
    link: str
    max_gap_s: float
    lost: int
    packets: int
    rerouted_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def core_links_used(result: TrafficResult, ideal_bps: float) -> tuple[int, int]:
    core = [x for x in result.links if x.kind == LinkKind.AGG_CORE.value]
    return sum(1 for x in core if x.sent_bps >= CORE_SHARE * ideal_bps), len(core)


# --- measuring ------------------------------------------------------------------------------


def fabric_spec(fabric: str, scale: float | None) -> FabricSpec:
    """The fabric (preset name or file), with its emulation scale replaced if given."""
    spec = load_fabric_spec(resolve_fabric(fabric))
    if scale is None:
        return spec
    return dataclasses.replace(spec, emulation=EmulationSpec(scale=scale))


def start_testbed(fabric: FabricSpec, policy: str, lock_wait: float) -> Testbed:
    """A started Testbed, waiting up to ``lock_wait`` s for another run's lock."""
    bed = Testbed(
        fabric,
        policy=policy,
        ready_timeout=120.0,
        lock_wait=lock_wait,
        log=lambda message: print(message, flush=True),
    )
    return bed.start()


def planned_flows(
    bed: Testbed, pairs: Sequence[tuple[str, str]], host_ports: str, since: float
) -> tuple[list[Flow], int]:
    """The flows with source ports for ``host_ports`` under the current policy (module
    docstring; orchestrator.testbed.traffic.planned_flows), and how many found no port."""
    paths = None
    if bed.pins_source_ports:
        paths = wait_for_paths(bed.run_dir / PATHS_FILE, since, policy=bed.policy)
    return traffic_plan(bed.emulation, pairs, host_ports=host_ports, paths=paths)


def measure_policy(
    bed: Testbed,
    policy: str,
    host_ports: str,
    repeat: int,
    pairs: Sequence[tuple[str, str]],
    duration: float,
    omit: float,
) -> PolicyRun:
    since = time.time()
    switch_s = bed.use_policy(policy)
    flows, unpinned = planned_flows(bed, pairs, host_ports, since if switch_s else 0.0)
    result = run_flows(bed.emulation, flows, duration=duration, omit=omit)
    ideal = ideal_flow_bps(bed.description.fabric, pairs)
    used, total = core_links_used(result, ideal)
    return PolicyRun(policy, host_ports, repeat, result, ideal, used, total, switch_s, unpinned)


def root_tx(intfs: Sequence[str]) -> dict[str, int]:
    out = subprocess.run(
        ["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True, check=False
    ).stdout
    counters = parse_qdiscs(out)
    return {i: counters.get(i, (0, 0))[0] for i in intfs}


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def probe_argv(*args: object) -> list[str]:
    """tests/integration/stream_probe.py with ``args``, run by this interpreter."""
    return [sys.executable, str(PROBE), *map(str, args)]


def stream_gap(bed: Testbed, mode: str) -> Recovery:
    """The receiver's longest gap when the source ToR's uplink the stream uses fails
    (module docstring); ``mode`` ``data-plane`` or ``controller``."""
    emu = bed.emulation
    controller = emu.controller
    assert controller is not None
    with_controller = mode == "controller"
    controller.policy = "shortest" if with_controller else "shortest:fast_failover=on"
    controller.restart()
    controller.wait_programmed(timeout=120.0)
    bed.policy = "shortest"  # what use_policy compares with; restored before it is used
    if not with_controller:
        controller.stop()
    gpus = bed.description.fabric.gpus_by_rank()
    src = gpus[0].name
    dst = next(g.name for g in gpus if g.pod != gpus[0].pod)
    addresses = bed.description.addresses
    recv_args = ["--bind", addresses[dst].fabric_ip, "--port", UDP_PORT, "--duration", 5]
    receiver = emu.popen(
        dst, probe_argv("udp-recv", *recv_args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(0.3)
    send_args = [
        *("--src", addresses[src].fabric_ip, "--dst", addresses[dst].fabric_ip),
        *("--port", UDP_PORT, "--sport", 20001, "--rate", STREAM_RATE, "--duration", 4),
    ]
    sender = emu.popen(
        src, probe_argv("udp-send", *send_args), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(0.5)
    tors = {n.peer for n in addresses[src].nics}
    uplinks = [  # (link, the ToR's end of it)
        (link, intf_name(end, link.port_of(end)))
        for link in bed.description.fabric.links_of_kind(LinkKind.TOR_AGG)
        for end in (link.a, link.b)
        if end in tors
    ]
    before = root_tx([i for _, i in uplinks])
    time.sleep(0.5)
    after = root_tx([i for _, i in uplinks])
    link = max(uplinks, key=lambda x: after[x[1]] - before[x[1]])[0]
    faults = FabricFaults(emu, bed.description)
    failed_at = time.monotonic()
    faults.set_link_state(link, up=False)
    rerouted = None
    try:
        if with_controller:

            def rerouted_ok() -> bool:
                s = controller.status()
                return s is not None and len(s.failed_links) == 1 and s.programmed()

            wait_until(rerouted_ok, 10, "the controller to re-route")
            rerouted = time.monotonic() - failed_at
        sender.communicate(timeout=30)
        out, err = receiver.communicate(timeout=30)
        if receiver.returncode != 0:
            raise RuntimeError(f"udp-recv failed: {err.decode()[:300]}")
        report = json.loads(out)
    finally:
        faults.set_link_state(link, up=True)
    if not with_controller:
        controller.policy = "shortest"
        controller.start()
    controller.wait_programmed(timeout=120.0)

    def back() -> bool:
        s = controller.status()
        return s is not None and not s.failed_links and s.programmed()

    wait_until(back, 15, "the link to be back")
    return Recovery(
        mode,
        f"{link.a}:{link.a_port}-{link.b}:{link.b_port}",
        float(report["max_gap"]),
        int(report.get("lost", 0)),
        int(report.get("packets", 0)),
        rerouted,
    )


# --- reporting ------------------------------------------------------------------------------


def mbps(bps: float) -> str:
    return f"{bps / 1e6:.2f}"


def table(runs: Sequence[PolicyRun]) -> list[str]:
    head = (
        f"{'policy':<15}{'ports':>9}{'rep':>4}{'ach/ideal':>10}{'agg Mb/s':>10}{'min':>7}"
        f"{'mean':>7}{'Jain':>6}{'core links':>12}{'retx':>6}{'cpu':>6}{'switch s':>9}"
    )
    lines = [head, "-" * len(head)]
    for run in runs:
        rates = run.rates
        note = f"  ({run.unpinned} unpinned)" if run.unpinned else ""
        lines.append(
            f"{run.policy:<15}{run.host_ports:>9}{run.repeat:>4}{run.ratio:>10.2f}"
            f"{mbps(run.result.aggregate_bps):>10}{mbps(min(rates)):>7}"
            f"{mbps(sum(rates) / len(rates)):>7}{run.result.jain:>6.2f}"
            f"{f'{run.core_used}/{run.core_total}':>12}{run.result.retransmits:>6}"
            f"{run.result.cpu_busy:>6.0%}{run.switch_s:>9.1f}{note}"
        )
    return lines


def means(runs: Sequence[PolicyRun]) -> dict[Arm, float]:
    """Mean achieved/ideal per (policy, host ports) over the repeats."""
    arms: dict[Arm, list[float]] = {}
    for run in runs:
        arms.setdefault((run.policy, run.host_ports), []).append(run.ratio)
    return {arm: sum(r) / len(r) for arm, r in arms.items()}


def summary(
    runs: Sequence[PolicyRun], policies: Sequence[str], host_ports: Sequence[str], baseline: str
) -> list[str]:
    """Mean achieved/ideal per policy (rows) and host ports (columns), then the two effects
    apart (orchestrator/results/effects.py): balanced/hash per policy, each policy over the
    baseline per host-ports setting, and the baseline/hash -> policy/balanced gap split."""
    mean = means(runs)
    both = {"hash", "balanced"} <= set(host_ports)
    head = "".join(f"{h:>10}" for h in host_ports) + (f"{'balanced/hash':>15}" if both else "")
    lines = [f"  mean achieved/ideal over {max(r.repeat for r in runs) + 1} repeat(s)"]
    lines.append(f"  {'':<15}{head}")
    for policy in policies:
        cells = "".join(f"{mean.get((policy, h), math.nan):>10.2f}" for h in host_ports)
        if both:
            cells += f"{host_port_effect(mean, policy):>15.2f}"
        lines.append(f"  {policy:<15}{cells}")
    lines.append(f"  switch-policy effect (each policy / {baseline}, same host ports):")
    for policy in policies:
        if policy != baseline:
            cells = "".join(
                f"{switch_policy_effect(mean, policy, h, baseline):>10.2f}" for h in host_ports
            )
            lines.append(f"  {policy:<15}{cells}")
    if both:
        lines.append(f"  host-port effect: the balanced/hash column; the gap from {baseline}/hash:")
        lines += [
            f"  {split_gap(mean, policy, baseline).describe()}"
            for policy in policies
            if policy != baseline
        ]
    return lines


def expectations(runs: Sequence[PolicyRun]) -> list[str]:
    """The issue's expectations, each checked against the mean achieved/ideal."""
    mean = means(runs)
    lines = []
    if ("path-pinned", "balanced") in mean:
        ok = mean[("path-pinned", "balanced")] >= 0.9
        lines.append(f"  path-pinned/balanced >= 0.9 of ideal: {'yes' if ok else 'NO'}")
    for ports in HOST_PORTS:
        if ("ecmp", ports) in mean and ("ecmp-polarized", ports) in mean:
            ok = mean[("ecmp-polarized", ports)] < mean[("ecmp", ports)]
            lines.append(f"  ecmp-polarized below ecmp ({ports}): {'yes' if ok else 'NO'}")
    if ("ecmp", "hash") in mean:
        lines.append(
            f"  ecmp/hash about 0.6 of ideal (random hashing): {mean[('ecmp', 'hash')]:.2f}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--duration", type=float, default=8.0, help="measured window, s")
    parser.add_argument("--omit", type=float, default=3.0, help="start-up not measured, s")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1, help="permutation seed of repeat 0")
    parser.add_argument("--policies", default="", help="comma-separated (default: all)")
    add_host_ports_option(parser)
    parser.add_argument(
        "--baseline", default="ecmp", help="the policy the others' effect is measured against"
    )
    parser.add_argument("--scale", type=float, help="emulation scale (default: the fabric's)")
    parser.add_argument("--no-recovery", action="store_true", help="skip the failure test")
    parser.add_argument(
        "--flows",
        type=int,
        default=1,
        help="flows per GPU to its permutation partner (more flows than paths shows how "
        "many paths a policy can use at all: polarization)",
    )
    parser.add_argument("--lock-wait", type=float, default=1800.0)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("run as root (sudo .venv/bin/python benchmarks/policies.py)")
    known = policy_registry().names()
    policies = [p for p in args.policies.split(",") if p] or known
    unknown = sorted(set(policies) - set(known))
    if unknown:
        parser.error(f"unknown policies {unknown}; known: {', '.join(known)}")
    host_ports: list[str] = args.host_ports
    baseline = baseline_of(policies, args.baseline)

    began = time.monotonic()
    chosen = fabric_spec(args.fabric, args.scale)
    try:  # before bring-up: a fabric without a cross-pod permutation is an error at once
        permutations = [
            cross_pod_permutation(build_fabric(chosen), args.seed + r) for r in range(args.repeats)
        ]
    except ValueError as error:
        parser.error(str(error))
    bed = start_testbed(chosen, policies[0], args.lock_wait)
    runs: list[PolicyRun] = []
    recoveries: list[Recovery] = []
    try:
        fabric = bed.description.fabric
        spec = fabric.spec
        conditions = machine_conditions(bed.emulation)
        nic = spec.emulation.emulated(spec.speeds.nic)
        gpus = [g.name for g in fabric.gpus_by_rank()]
        ports = min(spec.nic_ports, args.flows)  # one flow uses one NIC port
        offered = OfferedLoad(len(gpus), ports, nic, mean_hops(fabric, gpus))
        calibration = load_calibration()
        load_verdict = verdict(offered.hop_bps, calibration)
        for repeat in range(args.repeats):
            permutation = permutations[repeat]
            print(
                f"repeat {repeat}: permutation "
                + ", ".join(f"{s}->{d}" for s, d in permutation)
                + (f", {args.flows} flows each" if args.flows > 1 else "")
            )
            pairs = [pair for pair in permutation for _ in range(args.flows)]
            # the orders rotate per repeat: the machine's load drifts over a run; host ports
            # vary fastest (no controller restart between them)
            shift = repeat % len(policies)
            turn = repeat % len(host_ports)
            port_order = host_ports[turn:] + host_ports[:turn]
            for policy in policies[shift:] + policies[:shift]:
                for ports in port_order:
                    run = measure_policy(
                        bed, policy, ports, repeat, pairs, args.duration, args.omit
                    )
                    runs.append(run)
                    print("  " + table([run])[-1].strip(), flush=True)
        if not args.no_recovery:
            for mode in ("data-plane", "controller"):
                recoveries.append(stream_gap(bed, mode))
    finally:
        bed.stop()
    elapsed = time.monotonic() - began

    ideal = runs[0].ideal_bps if runs else 0.0
    n_paths = runs[0].core_total // 2 if runs else 0
    print()
    print(
        f"fabric {spec.name}: {len(gpus)} GPUs x {spec.nic_ports} NIC ports at "
        f"{nic / 1e6:g} Mbit/s emulated (scale {spec.emulation.scale:g}); "
        f"{args.flows} cross-pod TCP flow(s) per GPU, window {args.duration:g} s after "
        f"{args.omit:g} s"
    )
    print(
        f"ideal per flow = min(NIC port rate, pod core uplinks / flows leaving the pod) x "
        f"1460/1514 = {mbps(ideal)} Mbit/s goodput; random hashing of n flows on n paths "
        f"expects {hashing_expectation(len(gpus) // 2 if n_paths else 0):.2f} of the paths "
        f"used (n = {len(gpus) // 2} flows per pod)"
    )
    print(
        f"conditions: {conditions.get('cpus')} CPUs, load average at start "
        f"{conditions.get('loadavg_start')}, datapath {conditions.get('datapath')}, "
        f"userspace TSO {conditions.get('userspace_tso')}, OVS {conditions.get('ovs_version')}, "
        f"{conditions.get('datapath_ports')} datapath ports (all bridges on the machine)"
    )
    busy = [r for r in runs if r.result.cpu_busy > BUSY_CPU]
    bound = load_verdict is Verdict.OVER or bool(busy)
    print(
        f"offered load {offered.describe()}: calibration verdict {load_verdict.value}"
        + (f"; {len(busy)} window(s) with CPUs > {BUSY_CPU:.0%} busy" if busy else "")
        + ("  => EMULATOR-BOUND: the figures below understate the fabric" if bound else "")
    )
    print()
    ordered = sorted(
        runs, key=lambda r: (policies.index(r.policy), host_ports.index(r.host_ports), r.repeat)
    )
    print("\n".join(table(ordered)))
    print("core links: directed agg-core links carrying >= 1/4 of a flow's ideal, of all;")
    print("ports: how the hosts picked each flow's NIC port (orchestrator/testbed/hostports.py)")
    print("\n".join(summary(runs, policies, host_ports, baseline)))
    print("expected (issue 4), on the means:")
    print("\n".join(expectations(runs)))
    if recoveries:
        print()
        print(
            f"recovery: {STREAM_RATE} packet/s UDP stream under shortest, the source ToR's "
            "uplink it uses goes down"
        )
        for rec in recoveries:
            what = (
                "data plane (fast-failover, controller stopped)"
                if rec.mode == "data-plane"
                else "controller-driven (no fast-failover)"
            )
            extra = (
                f", every switch re-programmed {rec.rerouted_s * 1e3:.0f} ms after the failure"
                if rec.rerouted_s is not None
                else ""
            )
            print(
                f"  {what:<48} link {rec.link}: longest gap {rec.max_gap_s * 1e3:.0f} ms, "
                f"{rec.lost} of {rec.packets + rec.lost} packets lost{extra}"
            )
    print(f"\ntotal {elapsed:.0f} s; load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
