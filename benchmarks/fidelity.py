"""Fidelity of the emulated fabric: achieved vs configured rates, side by side, in one run.

    sudo .venv/bin/python benchmarks/fidelity.py [--fabric astral-small] [--repeat 3]
        [--duration 8] [--omit 2] [--cases longest,nic-down,nic-up,tor-agg,agg-core]
        [--cc default,cubic,...] [--queue recipe,bfifo/pfifo,...] [--json FILE]
        [--lock-wait SECONDS]

``--cc`` runs every case under each TCP congestion control (``default``: what the GPU
namespaces inherit from the machine, which is what experiments get); ``--queue`` under
each pair of leaf queues (``SWITCH[/HOST]``: ``recipe`` is what
orchestrator.emulation.shaping builds,
a pfifo_head_drop at the switches and an sfq at the GPUs; ``bfifo`` and ``head-drop`` replace
the switch-side leaf on every switch port of the running fabric, ``pfifo`` and ``sfq`` the
GPU-side one, each keeping the recipe's depth). Results and findings: docs/calibration.md.

Every case runs on a real fabric brought up by orchestrator.emulation.network.Emulation (controller
policy ``shortest``: one path per destination at every switch, so flows into one GPU share
every link of their path), with iperf3 inside the GPU namespaces (orchestrator.testbed.traffic:
goodput at the receivers over a common window, link bytes from tc over the same window):

    longest   the fabric as given: 1 TCP flow from the first GPU to the farthest one
              (astral-small: GPU-ToR-agg-core-agg-ToR-GPU across pods), every link at its
              configured rate
    nic-down  8 flows from two GPUs into one GPU's NIC port: bottleneck ToR -> GPU
    nic-up    8 flows out of one GPU's NIC port to two GPUs: bottleneck the GPU's egress
    tor-agg   8 flows from two GPUs under one ToR to a far GPU: bottleneck ToR -> agg
    agg-core  the same flows: bottleneck agg -> core

The four bottleneck cases run on a variant of the fabric with one NIC port per GPU (a
dual-ToR host hashes flows over its two ports, which would split them unpredictably) in
which the tier under test keeps its configured rate R and every other tier runs at 2R, so
the bottleneck is the link the case names (on the tor-agg and agg-core cases the flows
cross a second link of that tier on the way down, in series). Each case runs ``--repeat``
times; the table gives mean, sample standard deviation and range.

Columns:

    goodput/R   summed goodput over the bottleneck's configured rate R. R is what HTB
                shapes: Ethernet frames as tc counts them (header + IP packet, no
                preamble, gap or FCS). TCP over 1500-byte frames carries at most
                1460/1514 = 0.964 of it as payload (the GPUs send no TCP timestamps)
    /ceiling    goodput / (R x 0.964): the share of what TCP can carry on the link
    link busy   the bottleneck link's egress bytes (tc) / R: how busy the shaper kept it
    Jain        Jain's fairness index over the flows' goodputs
    retx        segments the senders retransmitted (whole tests, all flows)

Targets (issue 3): one flow over the longest path >= 0.95 of the configured rate; 8 flows on
one bottleneck: aggregate >= 0.90 of its capacity, Jain >= 0.98. Each is checked on
goodput/R and, for the single flow, also on /ceiling (0.95 of R is 0.985 of TCP's
ceiling). Conditions (cores, load average, datapath, TSO, congestion control, the shaping
recipe, the datapath's port count) are printed before and after: on a shared 2-core
machine every number moves with what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from orchestrator.calibration.capacity import switch_hops
from orchestrator.calibration.measure import datapath_ports, start_emulation
from orchestrator.emulation import batch
from orchestrator.emulation.hostconfig import TCP_CONGESTION_CONTROL
from orchestrator.emulation.network import Emulation, Terminated
from orchestrator.emulation.recipe import RECIPES, EmulatorRecipe, current_recipe, recipe_named
from orchestrator.testbed.traffic import (
    Flow,
    LinkDirectionLoad,
    TrafficResult,
    run_flows,
)
from topologies.addressing import FABRIC_PREFIX
from topologies.catalog import resolve_fabric
from topologies.generators import build_fabric
from topologies.model import Fabric, LinkKind, Tier
from topologies.spec import FabricSpec, Speeds, load_fabric_spec
from topologies.units import format_rate

CASES = ("longest", "nic-down", "nic-up", "tor-agg", "agg-core")
FLOWS = 8
DEFAULT_CC = "default"
QUEUES = ("recipe", "head-drop", "bfifo")
HOST_QUEUES = ("recipe", "sfq", "pfifo", "head-drop")
FRAME = 1514  # a full frame as tc counts it
SINGLE_TARGET = 0.95
AGGREGATE_TARGET = 0.90
JAIN_TARGET = 0.98


@dataclass(frozen=True)
class Case:
    """One measurement: which fabric variant, which flows, where the bottleneck is."""

    name: str
    variant: str  # "base" or the tier kept at its rate: "nic", "tor_agg", "agg_core"
    flows: tuple[Flow, ...]
    rate_bps: float  # configured rate of the bottleneck
    # picks the expected bottleneck link(s) among the measured links
    bottleneck: Callable[[LinkDirectionLoad], bool]
    what: str


@dataclass
class Run:
    case: str
    cc: str  # TCP congestion control of the senders ("default": the namespaces' default)
    queue: str  # leaf queues, SWITCH[/HOST] ("recipe": orchestrator.emulation.shaping's)
    recipe: str  # the emulator recipe (orchestrator.emulation.recipe)
    goodput_bps: list[float]
    aggregate_ratio: float
    ceiling_ratio: float
    link_busy: float
    link: str
    jain: float
    retransmits: int
    path: list[str]
    cpu_busy: float
    vswitchd_cores: float
    loadavg: tuple[float, float, float]


@dataclass
class Summary:
    case: Case
    recipe: str
    cc: str
    queue: str
    runs: list[Run] = field(default_factory=list)


# --- fabrics and cases ---------------------------------------------------------------------


def tier_variant(spec: FabricSpec, tier: str) -> FabricSpec:
    """One NIC port per GPU; ``tier`` at its configured rate, every other tier at 2x it."""
    rate = float(getattr(spec.speeds, tier))
    rates = {kind: (rate if kind == tier else 2 * rate) for kind in ("nic", "tor_agg", "agg_core")}
    speeds = Speeds(**rates, nvlink=spec.speeds.nvlink)
    return replace(spec, nic_ports=1, speeds=speeds)


def tor_of(fabric: Fabric, gpu: str) -> str:
    return next(link.other(gpu) for link in fabric.links_of(gpu) if link.kind is LinkKind.NIC)


def far_gpus(fabric: Fabric, src: str) -> list[str]:
    """GPUs by decreasing switch hops from ``src``, other pods first, then rank."""
    hops = switch_hops(fabric, src)
    pod = fabric.gpus[src].pod
    gpus = fabric.gpus
    return sorted(hops, key=lambda g: (-hops[g], gpus[g].pod == pod, gpus[g].rank))


def longest_case(spec: FabricSpec) -> Case:
    fabric = build_fabric(spec)
    src = fabric.gpus_by_rank()[0].name
    dst = far_gpus(fabric, src)[0]
    rate = spec.emulation.emulated(spec.speeds.nic)
    return Case(
        "longest",
        "base",
        (Flow(src, dst),),
        rate,
        lambda link: True,
        f"1 flow {src} -> {dst}, {switch_hops(fabric, src)[dst]} switches",
    )


def tier_cases(spec: FabricSpec, tier: str) -> list[Case]:
    variant = tier_variant(spec, tier)
    fabric = build_fabric(variant)
    if not fabric.links_of_kind(LinkKind(tier)):
        return []
    ranked = [g.name for g in fabric.gpus_by_rank()]
    s1 = ranked[0]
    far = far_gpus(fabric, s1)
    d, d2 = far[0], far[1]
    mates = [g for g in ranked if g not in (s1, d) and tor_of(fabric, g) == tor_of(fabric, s1)]
    s2 = mates[0] if mates else next(g for g in ranked if g not in (s1, d))
    rate = variant.emulation.emulated(float(getattr(variant.speeds, tier)))
    into_d = tuple(Flow(s1 if i % 2 == 0 else s2, d) for i in range(FLOWS))
    if tier == "nic":
        return [
            Case(
                "nic-down",
                tier,
                into_d,
                rate,
                lambda link: link.kind == "nic" and link.receiver == d,
                f"{FLOWS} flows {s1},{s2} -> {d}: {tor_of(fabric, d)} -> {d}",
            ),
            Case(
                "nic-up",
                tier,
                tuple(Flow(s1, d if i % 2 == 0 else d2) for i in range(FLOWS)),
                rate,
                lambda link: link.kind == "nic" and link.sender == s1,
                f"{FLOWS} flows {s1} -> {d},{d2}: {s1} -> {tor_of(fabric, s1)}",
            ),
        ]
    upward = Tier.TOR if tier == "tor_agg" else Tier.AGG
    switches = fabric.switches

    def bottleneck(link: LinkDirectionLoad) -> bool:
        sender = switches.get(link.sender)
        return link.kind == tier and sender is not None and sender.tier is upward

    hop = "ToR -> agg" if tier == "tor_agg" else "agg -> core"
    return [
        Case(
            tier.replace("_", "-"),
            tier,
            into_d,
            rate,
            bottleneck,
            f"{FLOWS} flows {s1},{s2} -> {d}: {hop}",
        )
    ]


def build_cases(spec: FabricSpec, wanted: Sequence[str]) -> dict[str, list[Case]]:
    """Cases by fabric variant, in the order they run."""
    cases: dict[str, list[Case]] = {}
    if "longest" in wanted:
        cases["base"] = [longest_case(spec)]
    for tier in ("nic", "tor_agg", "agg_core"):
        chosen = [c for c in tier_cases(spec, tier) if c.name in wanted]
        if chosen:
            cases[tier] = chosen
    return cases


def variant_spec(spec: FabricSpec, variant: str) -> FabricSpec:
    return spec if variant == "base" else tier_variant(spec, variant)


# --- measuring -----------------------------------------------------------------------------


def set_switch_queues(emu: Emulation, queue: str) -> None:
    """Give every switch-side shaper the leaf queue ``queue`` of the recipe's depth
    (``queue_s`` at the link rate): ``head-drop`` (pfifo_head_drop of as many full frames,
    the recipe's), ``bfifo`` (drop-tail in bytes), or ``recipe`` (leave what it built)."""
    if queue == "recipe":
        return
    assert emu.wiring is not None and emu.fitted_recipe is not None
    recipe = replace(emu.fitted_recipe.shaping, switch_queue=queue)
    commands: list[list[str]] = []
    for shaper in emu.wiring.shapers:
        # a leaf of another kind cannot be replaced in place
        commands.append(["tc", "qdisc", "del", "dev", shaper.intf, "parent", "1:1"])
        commands.append(["tc", "qdisc", "add", "dev", shaper.intf, "parent", "1:1"])
        commands[-1] += ["handle", "10:", *recipe.leaf(shaper.rate_bps)]
    batch.run_steps(commands, f"switching switch queues to {queue}")


def _class_rate(shaping: Sequence[Sequence[str]], intf: str) -> float:
    """The HTB class rate (bit/s) the host configuration gives ``intf``."""
    for argv in shaping:
        if argv[2] == "class" and argv[argv.index("dev") + 1] == intf:
            return float(argv[argv.index("rate") + 1].removesuffix("bit"))
    raise ValueError(f"no HTB class for {intf}")


def set_host_queues(emu: Emulation, queue: str) -> None:
    """Give every GPU-side shaper (NIC and NVLink ports) the leaf ``queue``: ``sfq`` (the
    recipe's), ``pfifo``, ``head-drop`` (the switches' queue), or ``recipe`` (leave what it
    built)."""
    if queue == "recipe":
        return
    assert emu.fitted_recipe is not None
    recipe = replace(emu.fitted_recipe.shaping, host_queue=queue)
    for gpu, config in emu.host_configs.items():
        for argv in config.shaping:
            if "parent" not in argv or argv[argv.index("parent") + 1] != "1:1":
                continue
            if argv[2] != "qdisc":
                continue
            intf = argv[argv.index("dev") + 1]
            emu.cmd(gpu, ["tc", "qdisc", "del", "dev", intf, "parent", "1:1"])
            leaf = recipe.leaf(_class_rate(config.shaping, intf), host_side=True)
            emu.cmd(
                gpu, ["tc", "qdisc", "add", "dev", intf, "parent", "1:1", "handle", "10:", *leaf]
            )


def measure(emu: Emulation, case: Case, cc: str, queue: str, duration: float, omit: float) -> Run:
    """One run of ``case`` on ``emu`` (its recipe, leaf queues ``queue``, senders' ``cc``)."""
    result: TrafficResult = run_flows(
        emu,
        list(case.flows),
        duration=duration,
        omit=omit,
        congestion_control=None if cc == DEFAULT_CC else cc,
    )
    candidates = [link for link in result.links if case.bottleneck(link)]
    busiest = max(candidates, key=lambda link: link.utilization)
    goodputs = [f.goodput_bps for f in result.flows]
    total = sum(goodputs)
    path = result.path(total / 2) if len(case.flows) == 1 else []
    assert emu.fitted_recipe is not None
    payload_share = emu.fitted_recipe.payload_share
    return Run(
        case=case.name,
        cc=cc,
        queue=queue,
        recipe=emu.recipe.name,
        goodput_bps=goodputs,
        aggregate_ratio=total / case.rate_bps,
        ceiling_ratio=total / (case.rate_bps * payload_share),
        link_busy=busiest.sent_bps / case.rate_bps,
        link=f"{busiest.sender}>{busiest.receiver}",
        jain=result.jain,
        retransmits=result.retransmits,
        path=path,
        cpu_busy=result.cpu_busy,
        vswitchd_cores=result.vswitchd_cores,
        loadavg=result.loadavg,
    )


def run_line(run: Run) -> str:
    flows = " ".join(f"{g / 1e6:.2f}" for g in run.goodput_bps)
    path = f" path {'>'.join(run.path)}" if run.path else ""
    return (
        f"  {run.case:9} {run.recipe:13} {run.cc:7} {run.queue:9} "
        f"goodput/R {run.aggregate_ratio:.3f} "
        f"/ceiling {run.ceiling_ratio:.3f} "
        f"busy {run.link_busy:.3f} ({run.link}) Jain {run.jain:.3f} retx {run.retransmits} "
        f"| CPU {run.cpu_busy:.0%} ovs {run.vswitchd_cores:.2f} cores load "
        f"{run.loadavg[0]:.2f} | Mbit/s: {flows}{path}"
    )


# --- reporting -----------------------------------------------------------------------------


def stats(values: Sequence[float]) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.3f} ±{sd:.3f} ({min(values):.3f}-{max(values):.3f})"


def verdicts(summary: Summary) -> str:
    runs = summary.runs
    aggregate = statistics.fmean(r.aggregate_ratio for r in runs)
    if len(summary.case.flows) == 1:
        ceiling = statistics.fmean(r.ceiling_ratio for r in runs)
        return (
            f"goodput/R >= {SINGLE_TARGET}: {_ok(aggregate >= SINGLE_TARGET)}; "
            f"/ceiling >= {SINGLE_TARGET}: {_ok(ceiling >= SINGLE_TARGET)}"
        )
    jain = statistics.fmean(r.jain for r in runs)
    return (
        f"goodput/R >= {AGGREGATE_TARGET}: {_ok(aggregate >= AGGREGATE_TARGET)}; "
        f"Jain >= {JAIN_TARGET}: {_ok(jain >= JAIN_TARGET)}"
    )


def _ok(passed: bool) -> str:
    return "ok" if passed else "MISSED"


def table(summaries: Sequence[Summary]) -> list[str]:
    head = (
        f"{'case':9} {'recipe':13} {'cc':7} {'queue':9} {'R':>5} {'flows':>5}  "
        f"{'goodput/R (mean ±sd, range)':29} "
        f"{'/ceiling':29} {'link busy':29} {'Jain':29} {'retx':>6}"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        runs = s.runs
        if not runs:
            continue
        lines.append(
            f"{s.case.name:9} {s.recipe:13} {s.cc:7} {s.queue:9} "
            f"{format_rate(s.case.rate_bps):>5} "
            f"{len(s.case.flows):>5}  "
            f"{stats([r.aggregate_ratio for r in runs]):29} "
            f"{stats([r.ceiling_ratio for r in runs]):29} "
            f"{stats([r.link_busy for r in runs]):29} "
            f"{stats([r.jain for r in runs]) if len(s.case.flows) > 1 else '-':29} "
            f"{statistics.fmean(r.retransmits for r in runs):>6.0f}"
        )
    lines.append("")
    for s in summaries:
        if s.runs:
            lines.append(
                f"{s.case.name:9} {s.recipe:13} {s.cc:7} {s.queue:9} {s.case.what}; "
                f"targets: {verdicts(s)}"
            )
    return lines


def conditions(emu: Emulation | None = None) -> list[str]:
    load = os.getloadavg()
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    emulator = emu.recipe if emu is not None else current_recipe()
    if emu is not None and emu.fitted_recipe is not None:
        emulator = emu.fitted_recipe
    recipe = emulator.shaping
    flow_queues = f", {recipe.flow_queues} flow queues" if recipe.flow_queues else ""
    lines = [
        f"emulator recipe: {emulator.describe()}",
        f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"shaping: HTB rate=ceil=R, burst=cburst={recipe.burst_s * 1e3:g} ms of R, switch-side "
        f"{recipe.switch_queue} {recipe.queue_s * 1e3:g} ms of R, host-side "
        f"{recipe.host_queue} {recipe.host_queue_packets} packets, overhead "
        f"{recipe.overhead_bytes} B{flow_queues}",
        f"GPUs' TCP: {TCP_CONGESTION_CONTROL} on every route, no timestamps (payload "
        f"{emulator.payload_share:.3f} of a {emulator.mtu}-byte MTU's frame), "
        f"{emulator.segments}-segment TSO packets "
        f"(packet scale {emulator.packet_scale}); the "
        f"machine's default is {cc}",
    ]
    if emu is not None and emu.datapath is not None:
        lines.append(f"datapath: {emu.datapath.describe()}")
    return lines


def namespace_cc(emu: Emulation) -> str:
    """The congestion control the GPUs' fabric route sets (orchestrator.emulation.hostconfig puts it
    on the routes), else the namespace's default."""
    gpu = next(iter(emu.hosts))
    route = emu.cmd(gpu, ["ip", "route", "show", FABRIC_PREFIX]).split()
    if "congctl" in route:
        return f"{route[route.index('congctl') + 1]} (on the routes)"
    return emu.cmd(gpu, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"]).strip()


def rates_line(spec: FabricSpec, variant: str) -> str:
    s = spec.speeds
    e = spec.emulation.emulated
    return (
        f"fabric {spec.name} variant {variant}: {spec.nic_ports} NIC port(s), emulated nic "
        f"{format_rate(e(s.nic))}, tor-agg {format_rate(e(s.tor_agg))}, agg-core "
        f"{format_rate(e(s.agg_core))}, policy shortest"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--duration", type=float, default=8.0, help="measuring window, s")
    parser.add_argument("--omit", type=float, default=2.0, help="seconds before the window")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    parser.add_argument("--json", type=Path, default=None, help="write every run here")
    parser.add_argument("--lock-wait", type=float, default=900.0)
    parser.add_argument(
        "--queue",
        default="recipe",
        help="leaf queues to compare, comma-separated, each SWITCH[/HOST]: SWITCH the "
        "switch-side leaf, 'recipe' (as the emulation builds it), 'head-drop' or 'bfifo'; "
        "HOST the GPU-side leaf, 'recipe', 'sfq' or 'pfifo'",
    )
    parser.add_argument(
        "--recipe",
        default=current_recipe().name,
        help=f"emulator recipe(s) to compare, comma-separated: {', '.join(RECIPES)} "
        "(default: the one runs use); each variant is brought up once per recipe",
    )
    parser.add_argument(
        "--cc",
        default=DEFAULT_CC,
        help="senders' TCP congestion control(s), comma-separated: 'default' (what the GPU "
        "namespaces use, i.e. what experiments get), cubic, bbr, reno ...; each case runs "
        "under each",
    )
    args = parser.parse_args(argv)
    wanted = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(wanted) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    spec = load_fabric_spec(resolve_fabric(args.fabric))
    by_variant = build_cases(spec, wanted)
    ccs = [c for c in args.cc.split(",") if c]
    queues = [q for q in args.queue.split(",") if q]
    for queue in queues:
        switch_side, _, host_side = queue.partition("/")
        if switch_side not in QUEUES or (host_side or "recipe") not in HOST_QUEUES:
            parser.error(
                f"unknown queue {queue!r}; known: SWITCH[/HOST], SWITCH one of {QUEUES}, "
                f"HOST one of {HOST_QUEUES}"
            )
    recipes = [recipe_named(r) for r in args.recipe.split(",") if r]
    if any(r.shaping.flow_queues for r in recipes) and queues != ["recipe"]:
        parser.error("--queue replaces a single leaf; recipes with flow queues take 'recipe' only")
    combos = [(r.name, cc, queue) for r in recipes for queue in queues for cc in ccs]
    summaries = {
        (c.name, r, cc, q): Summary(c, r, cc, q)
        for cases in by_variant.values()
        for c in cases
        for r, cc, q in combos
    }
    began = time.monotonic()
    print("# before")
    for line in conditions():
        print(line)
    status = 0

    def terminate(signum: int, frame: object) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminate)  # also while waiting for another run's lock
    try:
        for variant, cases in by_variant.items():
            for recipe in recipes:
                measure_variant(spec, variant, recipe, cases, summaries, queues, ccs, args)
    except (KeyboardInterrupt, Terminated) as stop:
        # the emulation is down already (its own handlers); keep what was measured
        status = stop.exit_status if isinstance(stop, Terminated) else 130
        print(f"# interrupted ({stop or 'Ctrl-C'}): the table has the runs measured so far")
    print()
    print(f"# fidelity, up to {args.repeat} runs per case, {args.duration:g} s windows")
    keys = [(c, r, cc, q) for c in wanted for r, cc, q in combos]
    rows = [summaries[key] for key in keys if key in summaries]
    for line in table(rows):
        print(line)
    print("# after")
    for line in conditions():
        print(line)
    print(f"took {time.monotonic() - began:.0f} s")
    if args.json is not None:
        document = [
            {"case": name, "recipe": r, "cc": cc, "queue": q, "what": s.case.what}
            | {"rate_bps": s.case.rate_bps, "runs": [asdict(run) for run in s.runs]}
            for (name, r, cc, q), s in summaries.items()
        ]
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return status


def measure_variant(
    spec: FabricSpec,
    variant: str,
    recipe: EmulatorRecipe,
    cases: Sequence[Case],
    summaries: dict[tuple[str, str, str, str], Summary],
    queues: Sequence[str],
    ccs: Sequence[str],
    args: argparse.Namespace,
) -> None:
    """Bring ``variant`` of ``spec`` up under ``recipe``, run its cases ``args.repeat``
    times, tear down."""
    vspec = variant_spec(spec, variant)
    print(f"# {rates_line(vspec, variant)}; recipe {recipe.name}", flush=True)
    emu = start_emulation(
        vspec, args.lock_wait, lambda m: print(f"  ({m})", flush=True), recipe=recipe
    )
    try:
        print(
            f"  up in {emu.timings.get('total', 0):.1f} s; {conditions(emu)[-1]}; "
            f"datapath ports (everyone's) {datapath_ports()}; TCP default in the GPUs: "
            f"{namespace_cc(emu)}"
        )
        for _ in range(args.repeat):
            for queue in queues:
                switch_side, _, host_side = queue.partition("/")
                set_switch_queues(emu, switch_side)
                set_host_queues(emu, host_side or "recipe")
                for case in cases:
                    for cc in ccs:
                        run = measure(emu, case, cc, queue, args.duration, args.omit)
                        summaries[case.name, recipe.name, cc, queue].runs.append(run)
                        print(run_line(run), flush=True)
    finally:
        emu.stop()


if __name__ == "__main__":
    sys.exit(main())
