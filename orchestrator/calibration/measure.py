"""Measuring the emulator's capacity (``astral calibrate``): needs root and Open vSwitch.

What the capacity is, its unit (hop-bit/s), how it follows from the measured steps and the
file it is stored in: orchestrator.calibration.capacity. This module brings a fabric up,
runs TCP flows across it at increasing load and turns what they achieved into a
:class:`~orchestrator.calibration.capacity.Calibration` (:func:`calibrate`).

The measurement (:func:`calibrate`)
-----------------------------------
1. the calibration fabric: the chosen one (default astral-small) with its tor-agg and
   agg-core links at ``trunk_factor`` (4) x the NIC rate, so that only NIC links limit the
   flows and no two flows of a step compete (:func:`calibration_fabric`);
2. flows between GPU i and GPU i + n/2 in rank order, both directions (cross-pod on the
   presets: the longest paths), first one per GPU, then one more for each further NIC
   port, so that all of them load every NIC port once in each direction, as the load
   guard's offered load assumes (:func:`calibration_flows`). The fabric runs
   ``path-pinned``: every flow gets a source port that leaves by a NIC port of its own
   and a path whose links no other flow of the step crosses where a free one exists
   (orchestrator.testbed.traffic.planned_flows), so no two flows compete for a NIC link;
3. steps of increasing offered load: k = 1, 2, 4, ... flows at the emulated NIC rate up to
   one per NIC port, then all of them with every link re-shaped to 2x, 4x, 8x that rate
   (the same recipe, orchestrator.emulation.shaping, at a larger scale); under a recipe
   whose packets grow with the rate, also a step just below each packet-scale boundary
   (:func:`plan_for`), and a step below the threshold ends only its own packet scale:
   larger packets cost the emulator less per byte, so the next scale is measured too;
4. each step runs its flows at once (orchestrator.testbed.traffic) and compares the goodput they
   achieved with what a perfect emulator would carry, ``flows x rate x`` TCP's payload
   share of the frames HTB counts at that step (1460/1514 at an MTU of 1500, without TCP
   timestamps as the GPUs send; more with the larger frames of a scaling recipe): the
   step's *fidelity ratio* (:func:`step_of`);
5. the capacity is where the ratio falls below ``threshold`` (0.9), as
   :func:`~orchestrator.calibration.capacity.find_capacity` interpolates it (under a
   scaling recipe, each packet scale's own too: Calibration.at_packet_scale); a step that
   falls below is measured once more and the two ratios averaged (:func:`merge_steps`), so
   one noisy sample does not end the search.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from orchestrator.calibration.capacity import (
    DEFAULT_SAFE_SHARE,
    DEFAULT_THRESHOLD,
    STEP_HEADER,
    Calibration,
    LoadStep,
    find_capacity,
    step_line,
    switch_hops,
)
from orchestrator.testbed.traffic import Flow, TrafficResult
from topologies.addressing import FABRIC_PREFIX
from topologies.errors import EmulationError, EnvironmentProblem
from topologies.fabricspec import EmulationSpec, FabricSpec, Speeds
from topologies.generators import build_fabric
from topologies.model import Fabric
from topologies.units import TCP_PAYLOAD_SHARE, format_rate

if TYPE_CHECKING:
    from orchestrator.emulation.hostconfig import HostConfig
    from orchestrator.emulation.network import Emulation
    from orchestrator.emulation.recipe import EmulatorRecipe

DEFAULT_TRUNK_FACTOR = 4.0

Log = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    """Load steps: (flows, rate factor) each; flows beyond the fabric's GPUs are clipped."""

    steps: tuple[tuple[int, float], ...]
    name: str = "default"  # recorded with the calibration ("quick": a first estimate)
    duration: float = 4.0  # seconds of each step's measuring window
    omit: float = 2.0  # seconds before it (slow start)
    confirm: bool = True  # measure a step below the threshold once more
    threshold: float = DEFAULT_THRESHOLD
    trunk_factor: float = DEFAULT_TRUNK_FACTOR


#: As many flows as the fabric has NIC ports (a plan's flow counts are clipped to it).
ALL_FLOWS = 1 << 16

DEFAULT_PLAN = Plan(
    steps=(
        (1, 1),
        (2, 1),
        (4, 1),
        (8, 1),
        (ALL_FLOWS, 1),
        (ALL_FLOWS, 2),
        (ALL_FLOWS, 4),
        (ALL_FLOWS, 8),
    )
)
QUICK_PLAN = Plan(steps=((2, 1), (8, 2)), name="quick", duration=2.5, omit=1.0)

#: The policy the calibration fabric runs: its paths are chosen per flow (step 2 above).
CALIBRATION_POLICY = "path-pinned"


#: How far below a packet-scale boundary :func:`plan_for`'s extra steps run (rate x this).
EDGE = 0.975


def plan_for(plan: Plan, recipe: EmulatorRecipe, base_rate: float, packet_scale: int = 1) -> Plan:
    """``plan`` with, under a recipe whose packets grow with the rate (jumbo-packets), one
    more step just below each packet-scale boundary the plan crosses: the most load the
    calibration's flows offer at that scale. The load guard judges a run at its own packet
    scale (Calibration.at_packet_scale), so each scale's own figure is worth measuring; at
    the boundary itself the packets grow and the same flows cost the emulator less.
    The quick plan becomes two steps below the first boundary and, for a run at a packet
    scale F > 1 (``packet_scale``), every flow just below the next boundary after F: the
    figure that run is judged against (:func:`quick_steps`). Other recipes: the plan as
    it is."""
    if not recipe.reference_bps:
        return plan
    if plan.name == QUICK_PLAN.name:
        return replace(plan, steps=quick_steps(recipe, base_rate, packet_scale))
    steps: list[tuple[int, float]] = []
    for flows, factor in plan.steps:
        if steps:
            before = steps[-1][1]
            scale = recipe.scale_for(base_rate * before)
            edge = edge_factor(recipe, base_rate, scale)
            if recipe.scale_for(base_rate * factor) > scale and before < edge < factor:
                steps.append((flows, edge))
        steps.append((flows, factor))
    return replace(plan, steps=tuple(steps))


def edge_factor(recipe: EmulatorRecipe, base_rate: float, packet_scale: int) -> float:
    """The rate factor (over ``base_rate``) just below the boundary after ``packet_scale``:
    EDGE x the next boundary (at the largest packet, a rate its scale still has)."""
    assert recipe.reference_bps
    return round(EDGE * (packet_scale + 1) * recipe.reference_bps / base_rate, 4)


def quick_steps(
    recipe: EmulatorRecipe, base_rate: float, packet_scale: int
) -> tuple[tuple[int, float], ...]:
    """The quick calibration under a scaling recipe: 2 flows at the NIC rate, 8 just below
    the first boundary (what the default plan's first scale shows) and, for a run at a
    larger ``packet_scale``, every flow just below the next boundary after it."""
    steps = [(2, 1.0), (8, edge_factor(recipe, base_rate, 1))]
    if packet_scale > 1:
        steps.append((ALL_FLOWS, edge_factor(recipe, base_rate, packet_scale)))
    return tuple(steps)


def calibration_fabric(spec: FabricSpec, trunk_factor: float = DEFAULT_TRUNK_FACTOR) -> FabricSpec:
    """``spec`` with its tor-agg and agg-core links at ``trunk_factor`` x the NIC rate (at
    least their own), so that only the NICs limit the calibration's flows."""
    trunk = spec.speeds.nic * trunk_factor
    speeds = Speeds(
        nic=spec.speeds.nic,
        tor_agg=max(spec.speeds.tor_agg, trunk),
        agg_core=max(spec.speeds.agg_core, trunk),
        nvlink=spec.speeds.nvlink,
    )
    return replace(spec, speeds=speeds)


def calibration_flows(fabric: Fabric) -> list[Flow]:
    """GPU i <-> GPU i + n/2 (rank order), both directions, interleaved, once per NIC port
    both GPUs have: the first k <= n flows use 2 x ceil(k/2) distinct GPUs, one sending
    and one receiving flow each at most; the next n add one more per GPU, and so on. A
    repeated pair is another connection of the same GPUs, meant for their next NIC port
    (the source ports and paths are planned when they run: :func:`calibrate`)."""
    ranked = [g.name for g in fabric.gpus_by_rank()]
    half = len(ranked) // 2
    pairs = [(ranked[i], ranked[i + half]) for i in range(half)]
    ports = min(
        (min(len(fabric.nic_links(a)), len(fabric.nic_links(b))) for a, b in pairs), default=0
    )
    flows: list[Flow] = []
    for _ in range(ports):
        for a, b in pairs:
            flows += [Flow(a, b), Flow(b, a)]
    return flows


def reshape(emu: Emulation, scale: float) -> EmulatorRecipe:
    """Re-shape every link of ``emu`` to its rates at ``scale`` (the same recipe, the
    same interfaces: only the rates, bursts and queue limits change, and the packets'
    size where the recipe scales it with the rate); the recipe as fitted to them.

    Only the HTB class and the leaf queue are replaced: the root (``htb default 1``) stays as
    it is, because this kernel refuses to change an existing htb root in place ("Change
    operation not supported"); class and leaf change in place, so no link is ever unshaped.
    """
    from orchestrator.emulation import batch
    from orchestrator.emulation.hostconfig import render_all
    from orchestrator.emulation.wiring import plan_wiring
    from topologies.description import FabricDescription

    assert emu.description is not None
    fabric = emu.description.fabric
    spec = replace(fabric.spec, emulation=EmulationSpec(scale=scale))
    description = FabricDescription.of(build_fabric(spec))
    recipe = emu.recipe.fitted(description)
    wiring = plan_wiring(description, recipe.shaping)
    root_commands = [a for s in wiring.shapers for a in s.commands()]
    # A recipe whose frames scale with the rate (jumbo-packets) re-sizes every link too.
    mtu = str(recipe.mtu)
    root_ends = [i for v in wiring.veths for i in (v.a_intf, v.b_intf if not v.b_host else None)]
    mtu_commands = [["ip", "link", "set", "dev", i, "mtu", mtu] for i in root_ends if i]
    batch.run_steps(mtu_commands, "re-sizing the links' frames")
    batch.run_steps(rate_commands(root_commands), "re-shaping switch ports")
    processes = {}
    for gpu, config in render_all(description, recipe).items():
        # A recipe whose packets scale with the rate (scaled-packets) re-sizes them too.
        commands = [*packet_commands(config), *rate_commands(config.shaping)]
        processes[gpu] = emu.host(gpu).popen(
            ["sh", "-c", batch.script(commands)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    failed = []
    for gpu, process in processes.items():
        _, err = process.communicate(timeout=60)
        if process.returncode != 0:
            failed.append(f"{gpu}: {batch.errors_of(err.decode(errors='replace'))}")
    if failed:
        raise EmulationError("re-shaping GPU ports failed: " + " | ".join(failed[:4]))
    return recipe


def packet_commands(config: HostConfig) -> list[list[str]]:
    """The commands that set a GPU's TCP packet size (its ports' GSO limit and its
    namespace's minimum TSO segments), from its rendered configuration."""
    sysctl = [f"{key}={value}" for key, value in config.sysctls if key.endswith("tso_segs")]
    gso = [list(argv) for argv in config.links if "gso_max_segs" in argv or "mtu" in argv]
    return [*gso, ["sysctl", "-q", "-w", *sysctl]]


def rate_commands(commands: Iterable[Sequence[str]]) -> list[list[str]]:
    """The shaping commands that change a shaped link's rate in place: all but the root
    qdisc (``tc qdisc ... root ...``), which stays."""
    return [list(argv) for argv in commands if not (argv[:2] == ["tc", "qdisc"] and "root" in argv)]


def step_of(
    result: TrafficResult,
    flows: Sequence[Flow],
    rate_bps: float,
    hops: Mapping[Flow, int],
    payload_share: float = TCP_PAYLOAD_SHARE,
    packet_scale: int = 1,
) -> LoadStep:
    """A LoadStep from one measurement of ``flows``, each limited to ``rate_bps``;
    ``payload_share`` and ``packet_scale``: the recipe's at these rates (its frames'
    payload share, its packets' size over the reference's)."""
    offered = len(flows) * rate_bps
    hop_list = [hops[f] for f in flows]
    return LoadStep(
        flows=len(flows),
        rate_bps=rate_bps,
        hops=sum(hop_list) / len(hop_list),
        offered_bps=offered,
        offered_hop_bps=sum(rate_bps * h for h in hop_list),
        achieved_bps=result.aggregate_bps,
        ratio=result.aggregate_bps / (offered * payload_share),
        jain=result.jain,
        retransmits=result.retransmits,
        cpu_busy=result.cpu_busy,
        vswitchd_cores=result.vswitchd_cores,
        loadavg=result.loadavg[0],
        packet_scale=packet_scale,
    )


def merge_steps(a: LoadStep, b: LoadStep) -> LoadStep:
    """Two measurements of one step, averaged."""

    def mean(x: float, y: float) -> float:
        return (x * a.runs + y * b.runs) / (a.runs + b.runs)

    return replace(
        a,
        achieved_bps=mean(a.achieved_bps, b.achieved_bps),
        ratio=mean(a.ratio, b.ratio),
        jain=mean(a.jain, b.jain),
        retransmits=a.retransmits + b.retransmits,
        cpu_busy=mean(a.cpu_busy, b.cpu_busy),
        vswitchd_cores=mean(a.vswitchd_cores, b.vswitchd_cores),
        loadavg=b.loadavg,
        runs=a.runs + b.runs,
    )


def datapath_ports() -> int | None:
    """Ports of the userspace datapath (every bridge's, anyone's): ovs-vswitchd polls them
    all, so the count is part of the per-packet cost."""
    try:
        out = subprocess.run(
            ["ovs-appctl", "dpctl/show", "netdev@ovs-netdev"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    ports = sum(1 for line in out.splitlines() if line.strip().startswith("port "))
    return ports or None


def machine_conditions(emu: Emulation | None = None) -> dict[str, Any]:
    """Cores, load, kernel, host and (with a running emulation) the datapath."""
    conditions: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "kernel": platform.release(),
        "hostname": socket.gethostname(),
        "datapath_ports": datapath_ports(),
    }
    if emu is not None and emu.datapath is not None:
        conditions.update(
            recipe=emu.recipe.name,
            datapath=emu.datapath.kind,
            userspace_tso=emu.datapath.tso,
            ovs_version=emu.datapath.ovs_version,
        )
    if emu is not None and emu.hosts:
        # what the GPUs' TCP uses unless a program picks its own: the congctl of their
        # fabric route (orchestrator.emulation.hostconfig), else the namespace's default
        gpu = next(iter(emu.hosts))
        route = emu.cmd(gpu, ["ip", "route", "show", FABRIC_PREFIX]).split()
        if "congctl" in route:
            cc = route[route.index("congctl") + 1]
        else:
            cc = emu.cmd(gpu, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]).strip()
        conditions["tcp_congestion_control"] = cc
    return conditions


def start_emulation(
    spec: FabricSpec,
    lock_wait: float,
    log: Log,
    policy: str = "shortest",
    recipe: EmulatorRecipe | None = None,
) -> Emulation:
    """An Emulation of ``spec``, waiting up to ``lock_wait`` s for another run's lock."""
    from orchestrator.emulation.network import Emulation

    emulation = Emulation(
        spec, policy=policy, ready_timeout=120.0, log=log, lock_wait=lock_wait, recipe=recipe
    )
    return emulation.start()


def calibrate(
    spec: FabricSpec,
    plan: Plan = DEFAULT_PLAN,
    *,
    safe_share: float = DEFAULT_SAFE_SHARE,
    lock_wait: float = 600.0,
    log: Log | None = None,
    recipe: EmulatorRecipe | None = None,
    packet_scale: int = 1,
) -> Calibration:
    """Measure the emulator's capacity on ``spec``'s calibration fabric (module docstring)
    under ``recipe`` (default: the one runs use, orchestrator.emulation.recipe);
    ``packet_scale``: the packets of the run a quick plan is for (:func:`plan_for`)."""
    from orchestrator.testbed.hostports import BALANCED
    from orchestrator.testbed.pinning import PATHS_FILE, wait_for_paths
    from orchestrator.testbed.traffic import planned_flows, run_flows

    if os.geteuid() != 0:
        raise EnvironmentProblem("astral calibrate builds an emulated fabric: it needs root")
    say = log or (lambda _: None)
    calibrated = calibration_fabric(spec, plan.trunk_factor)
    model = build_fabric(calibrated)
    flows = calibration_flows(model)
    if not flows:
        raise EnvironmentProblem(f"fabric {spec.name} has fewer than 2 GPUs to send between")
    hops = {f: switch_hops(model, f.src)[f.dst] for f in flows}
    base_rate = calibrated.emulation.emulated(calibrated.speeds.nic)
    say(
        f"calibration fabric {calibrated.name}: {len(model.gpus)} GPUs, NIC "
        f"{format_rate(base_rate)} emulated, trunks {plan.trunk_factor:g}x, "
        f"{CALIBRATION_POLICY}; up to {len(flows)} flows (one per NIC port) of "
        f"{sum(hops.values()) / len(hops):.1f} switch hops"
    )
    emu = start_emulation(calibrated, lock_wait, say, policy=CALIBRATION_POLICY, recipe=recipe)
    plan = plan_for(plan, emu.recipe, base_rate, packet_scale)
    steps: list[LoadStep] = []
    try:
        paths = wait_for_paths(emu.run_dir / PATHS_FILE, 0.0, policy=CALIBRATION_POLICY)
        conditions = machine_conditions(emu)
        say(STEP_HEADER)
        factor = 1.0
        fitted = emu.fitted_recipe
        assert fitted is not None
        ended: set[int] = set()  # packet scales a step below the threshold ended
        done: set[tuple[int, float]] = set()
        for index, (wanted, step_factor) in enumerate(plan.steps):
            chosen = flows[: min(wanted, len(flows))]
            scale = emu.recipe.scale_for(base_rate * step_factor)
            if (len(chosen), step_factor) in done or scale in ended:
                continue  # clipped to the same step, or its packet scale is ended
            done.add((len(chosen), step_factor))
            if step_factor != factor:
                fitted = reshape(emu, calibrated.emulation.scale * step_factor)
                factor = step_factor
            rate = base_rate * factor

            def measure(
                chosen: list[Flow] = chosen, rate: float = rate, fitted: EmulatorRecipe = fitted
            ) -> LoadStep:
                pairs = [(f.src, f.dst) for f in chosen]
                planned, unpinned = planned_flows(emu, pairs, host_ports=BALANCED, paths=paths)
                if unpinned:
                    say(f"{unpinned} of {len(planned)} flows found no port for a path of their own")
                result = run_flows(emu, planned, duration=plan.duration, omit=plan.omit)
                share, scale = fitted.payload_share, fitted.packet_scale
                return step_of(result, chosen, rate, hops, share, scale)

            step = measure()
            if step.ratio < plan.threshold and plan.confirm:
                say(step_line(step) + "  (below the threshold: measuring again)")
                step = merge_steps(step, measure())
            say(step_line(step))
            steps.append(step)
            if step.ratio < plan.threshold:
                ended.add(step.packet_scale)
                later = plan.steps[index + 1 :]
                if all(emu.recipe.scale_for(base_rate * f) in ended for _, f in later):
                    break  # nothing left at a packet scale still open
        conditions["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        emu.stop()
    capacity, bound = find_capacity(steps, plan.threshold)
    return Calibration(
        capacity_bps=capacity,
        bound=bound,
        safe_share=safe_share,
        threshold=plan.threshold,
        measured_at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        conditions=conditions,
        fabric={
            "name": spec.name,
            "source": spec.source,
            "nic_rate_bps": base_rate,
            "trunk_factor": plan.trunk_factor,
            "gpus": len(model.gpus),
            "policy": CALIBRATION_POLICY,
            "plan": plan.name,
            "duration_s": plan.duration,
            "omit_s": plan.omit,
        },
        steps=tuple(steps),
    )
