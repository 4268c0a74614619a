"""``astral topo show [FILE]`` and ``astral topo plan``: a fabric's properties, without root.

``show`` loads a fabric file (default: the preset ``astral-small``; a preset's name works
too), generates the fabric and prints its counts, capacity per tier, bisection and the
paths between representative GPU pairs (``topologies.properties``); ``--png PATH`` draws it
(``topologies.drawing``), ``--json`` prints the same as JSON.

``plan`` dimensions a full-size Astral fabric from the switch radix and the port speed in
closed form and compares every kind at the same GPU count (``topologies.planner``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topologies.catalog import DEFAULT_PRESET, preset_names, resolve_fabric
from topologies.errors import FabricSpecError
from topologies.generators import MAX_RADIX, default_registry
from topologies.model import LinkKind, Tier
from topologies.units import parse_rate

if TYPE_CHECKING:
    from topologies.plan import Plan, PlanInput
    from topologies.planner import Unreachable
    from topologies.properties import FabricProperties

# Plan inputs are checked as a fabric spec; errors name the option, not the spec key.
_PLAN_OPTIONS = {
    "switch.radix": "--radix",
    "switch.down_ports": "--down-ports",
    "gpus_per_server": "--rails",
    "nic_ports": "--nic-ports",
    "pods": "--pods",
    "servers_per_pod": "--servers-per-pod",
    "speeds.nic": "--port-speed",
    "oversubscription.tor": "--oversubscription-tor",
    "oversubscription.agg": "--oversubscription-agg",
}
_LINK_NAME = {
    LinkKind.NIC: "NIC - ToR",
    LinkKind.TOR_AGG: "ToR - agg",
    LinkKind.AGG_CORE: "agg - core",
    LinkKind.NVLINK: "NVLink",
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "topo",
        help="show a fabric's properties, or plan a full-size one",
        description="Fabric properties and planning; no root needed.",
    )
    sub = parser.add_subparsers(dest="topo_command", metavar="SUBCOMMAND")
    sub.required = True

    show = sub.add_parser(
        "show",
        help="counts, capacity per tier, bisection and paths of a fabric file",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    show.add_argument(
        "fabric",
        nargs="?",
        default=DEFAULT_PRESET,
        metavar="FILE",
        help="fabric YAML file, or a preset's name "
        f"({', '.join(preset_names())}); default: {DEFAULT_PRESET}",
    )
    show.add_argument(
        "--png", type=Path, metavar="PATH", help="also draw the fabric into this PNG file"
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of the report")
    show.set_defaults(func=run_show)

    plan = sub.add_parser(
        "plan",
        help="dimension a full-size fabric and compare every kind",
        description=__doc__.split("\n\n")[2] if __doc__ else None,
    )
    plan.add_argument("--radix", type=int, default=256, help="switch ports (default 256)")
    plan.add_argument("--port-speed", default="200G", help="rate of every port (default 200G)")
    plan.add_argument("--rails", type=int, default=8, help="GPUs (= NICs) per server (8)")
    plan.add_argument(
        "--nic-ports", type=int, default=2, help="ports per NIC: 2 = dual-ToR (default), 1"
    )
    plan.add_argument("--pods", type=int, default=8, help="Astral pods (default 8)")
    plan.add_argument(
        "--down-ports", type=int, default=None, help="down ports per switch (default radix/2)"
    )
    plan.add_argument("--servers-per-pod", type=int, default=None, help="default: full pods")
    plan.add_argument("--oversubscription-tor", type=float, default=1.0, metavar="RATIO")
    plan.add_argument("--oversubscription-agg", type=float, default=1.0, metavar="RATIO")
    plan.add_argument(
        "--compare-gpus",
        type=int,
        default=None,
        metavar="N",
        help="GPU count to compare the kinds at (default: the planned fabric's)",
    )
    plan.add_argument("--json", action="store_true", help="print JSON instead of the report")
    plan.set_defaults(func=run_plan)


# --- formatting --------------------------------------------------------------------------


def rate(bps: float | None) -> str:
    """``2e11`` -> ``200G``, ``1.05e17`` -> ``104.9P``; ``-`` for none."""
    if bps is None:
        return "-"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if bps >= scale:
            value = bps / scale
            digits = 1 if value >= 100 else (2 if value >= 10 else 3)
            text = f"{value:.{digits}f}".rstrip("0").rstrip(".")
            return f"{text}{prefix}"
    return f"{bps:.0f}"


def table(rows: Sequence[Sequence[object]], align: str = "", indent: str = "  ") -> list[str]:
    """Align columns; ``align`` has one letter per column, ``l`` or ``r`` (default: the
    first column left, the others right)."""
    cells = [[str(c) for c in row] for row in rows]
    columns = max(len(row) for row in cells)
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(columns)]
    align = align or "l" + "r" * (columns - 1)
    lines = []
    for row in cells:
        parts = [
            cell.ljust(widths[i]) if align[i] == "l" else cell.rjust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append((indent + "  ".join(parts)).rstrip())
    return lines


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


# --- show --------------------------------------------------------------------------------


def run_show(args: argparse.Namespace) -> int:
    from topologies.drawing import draw_fabric, drawable
    from topologies.generators import build_fabric
    from topologies.latency import latency_record, latency_title
    from topologies.properties import fabric_properties
    from topologies.spec import load_fabric_spec

    spec = load_fabric_spec(resolve_fabric(args.fabric))
    fabric = build_fabric(spec)
    props = fabric_properties(fabric)

    png_note = "not written (add --png PATH to draw it)"
    png: Path | None = None
    if args.png is not None:
        ok, why = drawable(fabric)
        if not ok:
            png_note = f"skipped: {why}"
        else:
            try:
                png = draw_fabric(fabric, args.png)
            except OSError as err:
                print(f"astral: error: cannot write {args.png}: {err.strerror}", file=sys.stderr)
                return 1
            png_note = f"written to {png.resolve()}"

    if args.json:
        out = props.to_dict()
        out["png"] = str(png.resolve()) if png else None
        print(json.dumps(out, indent=1))
        if args.png is not None and png is None:
            print(f"astral: drawing {png_note}", file=sys.stderr)
        return 0
    print("\n".join(show_report(props, fabric.spec.emulation.scale)))
    print(f"  {latency_title(latency_record(fabric))}")  # docs/latency.md
    print(f"\nDrawing: {png_note}")
    return 0


def show_report(props: FabricProperties, scale: float) -> list[str]:
    """The text report of ``astral topo show``."""
    fabric_kind = default_registry().get(props.kind, props.source)
    gpu_bw = props.bisection.gpu_bandwidth
    nic = props.link_capacity.get(LinkKind.NIC)
    ports = "dual-ToR, 2 NIC ports per GPU" if props.nic_ports == 2 else "1 NIC port per GPU"
    servers_per_pod = props.servers // props.pods if props.pods else 0
    rails = (
        f"{props.rails} rail(s)"
        if fabric_kind.has_rails
        else f"GPU index means nothing to a {props.kind}"
    )
    lines = [
        f"{props.name}: {props.kind} fabric from {props.source}",
        f"  {props.gpus:,} GPUs = {props.pods} pod(s) x {servers_per_pod} server(s) x "
        f"{props.rails} GPUs; {rails}; {ports}",
        f"  per GPU {rate(gpu_bw)} ({props.nic_ports} x {rate(nic)}), per server "
        f"{rate(gpu_bw * props.rails)}; emulated rates = real x {scale:g} "
        f"({rate(nic)} -> {rate(nic * scale if nic else None)})",
    ]
    if props.gpu_forwarding:
        lines.append("  GPUs forward cross-rail traffic over NVLink (rail-only)")

    lines += ["", "Switches and capacity per tier (real rates in bit/s, one direction)"]
    rows: list[list[object]] = [
        ["tier", "switches", "down links", "up links", "down", "up", "down:up", "worst switch"]
    ]
    for t in props.tiers:
        rows.append(
            [
                fabric_kind.tier_names[t.tier],
                f"{t.switches:,}",
                f"{t.down_links:,}",
                f"{t.up_links:,}" if t.up_links else "-",
                rate(t.down_capacity),
                rate(t.up_capacity) if t.up_capacity else "-",
                _ratio(t.ratio),
                _ratio(t.worst_ratio),
            ]
        )
    lines += table(rows)
    nv = props.switches.get(Tier.NVLINK, 0)
    lines.append(
        f"  network switches: {props.network_switches:,}; NVLink switches: {nv:,} "
        "(one per server, inside it)"
    )

    lines += ["", "Links"]
    rows = [["kind", "count", "capacity", "emulated"]]
    for kind in (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE, LinkKind.NVLINK):
        count = props.links.get(kind, 0)
        if not count:
            continue
        capacity = props.link_capacity[kind]
        rows.append([_LINK_NAME[kind], f"{count:,}", rate(capacity), rate(capacity * scale)])
    lines += table(rows)

    b = props.bisection
    lines += ["", "Bisection: max-flow across balanced cuts of the GPUs (one direction)"]
    if b.cuts:
        rows = [["cut", "GPUs per side", "capacity", "per GPU", "x NIC bw", "halves"]]
        for cut in b.cuts:
            per_gpu = cut.capacity / cut.side
            rows.append(
                [
                    cut.name,
                    f"{cut.side:,}",
                    rate(cut.capacity),
                    rate(per_gpu),
                    _ratio(per_gpu / gpu_bw if gpu_bw else None),
                    cut.description,
                ]
            )
        lines += table(rows, "lrrrrl")
        worst = b.worst.name if b.worst else "-"
        lines.append(
            f"  bisection bandwidth: {rate(b.capacity)} = {rate(b.per_gpu)} per GPU = "
            f"{b.ratio:.2f} x a GPU's NIC bandwidth (worst cut: {worst})"
        )
    else:
        lines.append("  (fewer than 2 GPUs: no cut)")

    from topologies.properties import PAIR_CLASS_TEXT

    src = next((p.src for p in props.pairs if p.src), None)
    lines += [
        "",
        f"GPU pairs, from {src or '-'}: hops = switches crossed, paths = equal-cost shortest paths",
    ]
    rows = [["class", "pair", "hops", "paths", "one path"]]
    for p in props.pairs:
        if not p.present:
            rows.append([PAIR_CLASS_TEXT[p.cls], "absent", "-", "-", ""])
            continue
        via = ""
        if p.nvlink_hops or p.gpu_transits:
            via = f" ({p.nvlink_hops} NVLink, {p.gpu_transits} GPU transit)"
        rows.append(
            [
                PAIR_CLASS_TEXT[p.cls],
                f"{p.src} -> {p.dst}",
                f"{p.hops}{via}",
                f"{p.paths:,}",
                " ".join(p.example),
            ]
        )
    lines += table(rows, "llrrl")
    lines.append(f"  maximum hops between any two GPUs: {props.max_hops}")
    return lines


# --- plan --------------------------------------------------------------------------------


def _plan_inputs(args: argparse.Namespace) -> PlanInput:
    from topologies.plan import PlanInput
    from topologies.planner import SOURCE

    try:
        port_speed = parse_rate(args.port_speed)
    except ValueError as err:
        raise FabricSpecError(SOURCE, "--port-speed", str(err), args.port_speed) from None
    if args.radix > MAX_RADIX:  # the closed forms walk the ToR groups: a hang beyond
        raise FabricSpecError(
            SOURCE,
            "--radix",
            f"at most {MAX_RADIX:,} ports (real switches have hundreds)",
            args.radix,
        )
    return PlanInput(
        radix=args.radix,
        port_speed=port_speed,
        rails=args.rails,
        nic_ports=args.nic_ports,
        pods=args.pods,
        down_ports=args.down_ports,
        servers_per_pod=args.servers_per_pod,
        oversubscription_tor=args.oversubscription_tor,
        oversubscription_agg=args.oversubscription_agg,
    )


def run_plan(args: argparse.Namespace) -> int:
    from topologies.planner import SOURCE, Unreachable, common_reach, compare, plan_astral

    inputs = _plan_inputs(args)
    try:
        astral = plan_astral(inputs)
    except FabricSpecError as err:
        option = _PLAN_OPTIONS.get(err.key, err.key)
        raise FabricSpecError(SOURCE, option, err.expected, err.found, detail=err.detail) from None
    if args.compare_gpus is not None and args.compare_gpus < 2:
        raise FabricSpecError(SOURCE, "--compare-gpus", "an integer >= 2", args.compare_gpus)
    sizes = [args.compare_gpus or astral.gpus]
    comparisons = {n: compare(n, inputs) for n in sizes}
    if any(isinstance(c, Unreachable) for c in comparisons[sizes[0]]):
        reach = common_reach(inputs)
        if reach >= 2 and reach not in comparisons:
            sizes.append(reach)
            comparisons[reach] = compare(reach, inputs)

    if args.json:
        out = {
            "plan": astral.to_dict(),
            "comparisons": [
                {
                    "gpus": n,
                    "kinds": [
                        {"reachable": not isinstance(c, Unreachable), **c.to_dict()}
                        for c in comparisons[n]
                    ],
                }
                for n in sizes
            ],
        }
        print(json.dumps(out, indent=1))
        return 0
    lines = plan_report(astral)
    for i, n in enumerate(sizes):
        why = "" if i == 0 else " (the most every kind reaches)"
        lines += ["", *comparison_report(n, comparisons[n], why)]
    print("\n".join(lines))
    return 0


def plan_report(p: Plan) -> list[str]:
    """The Astral part of ``astral topo plan``."""
    spec = p.spec
    radix, down, up = spec.switch.radix, spec.switch.down_ports, spec.switch.up_ports
    port = spec.speeds.nic
    pair = "dual-ToR pairs" if spec.nic_ports == 2 else "ToRs"
    tors_per_plane = p.switches.get(Tier.TOR, 0) // (spec.pods * spec.rails)
    aggs_per_plane = up
    groups = tors_per_plane // spec.nic_ports
    lines = [
        f"Astral plan: {radix} x {rate(port)} ports per switch ({rate(radix * port)}), "
        f"{down} down / {up} up; {spec.rails} rails; "
        + ("dual-ToR" if spec.nic_ports == 2 else "single-ToR")
        + f"; {spec.pods} pod(s)",
        "(rates in bit/s, one direction: G = 1e9, T = 1e12, P = 1e15)",
    ]
    rows: list[list[object]] = [
        ["GPUs per ToR", f"{p.gpus_per_tor:,}", ""],
        [
            "GPUs per rail plane",
            f"{p.gpus_per_plane:,}",
            f"{tors_per_plane:,} ToRs ({groups:,} {pair}) under {aggs_per_plane:,} "
            "aggregation switches",
        ],
        ["GPUs per pod", f"{p.gpus_per_pod:,}", f"{spec.rails} rail planes"],
        ["GPUs", f"{p.gpus:,}", f"{spec.pods} pod(s), {p.servers:,} servers"],
        [
            "bandwidth per GPU",
            rate(p.gpu_bandwidth),
            f"{spec.nic_ports} x {rate(port)}; per server {rate(p.server_bandwidth)}",
        ],
    ]
    lines += table(rows, "lrl")

    lines += ["", "Switches per tier"]
    rows = [["tier", "switches", "down:up"]]
    ratios = p.tier_ratios()
    names = default_registry().get(p.kind, spec.source).tier_names
    for tier in (Tier.TOR, Tier.AGG, Tier.CORE):
        if tier in p.switches:
            rows.append([names[tier], f"{p.switches[tier]:,}", _ratio(ratios.get(tier))])
    rows.append(["network total", f"{p.network_switches:,}", ""])
    rows.append(["NVLink (servers)", f"{p.switches.get(Tier.NVLINK, 0):,}", ""])
    lines += table(rows)

    lines += ["", "Links per tier and transceivers (2 per link, one optic at each end)"]
    rows = [["link", "links", "transceivers"]]
    for kind in (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE):
        if kind in p.links:
            rows.append([_LINK_NAME[kind], f"{p.links[kind]:,}", f"{2 * p.links[kind]:,}"])
    rows.append(["network total", f"{p.network_links:,}", f"{p.transceivers:,}"])
    lines += table(rows)
    lines.append(
        f"  of which switch-to-switch: {p.switch_transceivers:,}; NIC - ToR: "
        f"{p.nic_transceivers:,} (drop these if NIC cables are copper)"
    )
    lines += ["", f"Maximum hops: {p.max_hops} switches"]
    cuts = ", ".join(f"{name} {rate(c)}" for name, c in p.cuts.items()) or "no aligned cut"
    lines.append(
        f"Bisection: {rate(p.bisection)} = {rate(p.bisection_per_gpu)} per GPU "
        f"({(p.bisection_per_gpu or 0) / p.gpu_bandwidth:.2f} x NIC bandwidth); cuts: {cuts}"
    )
    return lines


def comparison_report(gpus: int, results: Sequence[Plan | Unreachable], why: str = "") -> list[str]:
    """One table comparing the kinds at ``gpus`` GPUs; kinds out of reach listed below."""
    from topologies.planner import Unreachable

    lines = [
        f"Kinds compared at {gpus:,} GPUs{why}: same switches and ports; a fat-tree host has "
        "1 NIC port"
    ]
    rows: list[list[object]] = [
        [
            "kind",
            "GPUs",
            "pods",
            "switches",
            "links",
            "transceivers",
            "max hops",
            "bisection",
            "per GPU",
            "NIC bw",
        ]
    ]
    out_of_reach = []
    for r in results:
        if isinstance(r, Unreachable):
            out_of_reach.append(f"  {r.kind}: out of reach ({r.reason})")
            continue
        rows.append(
            [
                r.kind,
                f"{r.gpus:,}",
                f"{r.pods:,}",
                f"{r.network_switches:,}",
                f"{r.network_links:,}",
                f"{r.transceivers:,}",
                r.max_hops,
                rate(r.bisection),
                rate(r.bisection_per_gpu),
                rate(r.gpu_bandwidth),
            ]
        )
    lines += table(rows)
    return lines + out_of_reach
