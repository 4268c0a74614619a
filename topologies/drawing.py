"""A PNG drawing of a small fabric: one row per tier, colours per tier and per link kind.

Layout, bottom up: NVLink switches, GPUs (framed by server), ToRs, aggregation switches
(spines), cores. Each row is in name order (pod, rail, index), so a rail plane or a pod is
a contiguous block. Parallel links are drawn once, thicker, with their count; links whose
capacity is below the tier's nominal speed (oversubscribed) are dashed.

Only fabrics of at most :data:`MAX_NODES` nodes (switches + GPUs) are drawn; larger ones
would be unreadable (:func:`drawable` says why). Uses matplotlib's Agg canvas directly, so
it needs no display and touches no global pyplot state.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from topologies.model import Fabric, LinkKind, Switch, Tier
from topologies.units import format_rate

MAX_NODES = 200

TIER_COLOUR = {
    Tier.NVLINK: "#9e9e9e",
    Tier.TOR: "#1f77b4",
    Tier.AGG: "#ff7f0e",
    Tier.CORE: "#d62728",
}
GPU_COLOUR = "#2ca02c"
LINK_COLOUR = {
    LinkKind.NVLINK: "#9e9e9e",
    LinkKind.NIC: "#6baed6",
    LinkKind.TOR_AGG: "#fdae6b",
    LinkKind.AGG_CORE: "#fc9272",
}
TIER_LABEL = {
    Tier.NVLINK: "NVLink switch",
    Tier.TOR: "ToR / leaf / edge",
    Tier.AGG: "aggregation / spine",
    Tier.CORE: "core",
}
# Rows (y), bottom up; tiers a fabric lacks leave no gap.
_NV_ROW, _GPU_ROW, _TIER_GAP = 0.0, 1.0, 1.2


def drawable(fabric: Fabric) -> tuple[bool, str]:
    """Whether the fabric is small enough to draw, and if not, why."""
    nodes = len(fabric.switches) + len(fabric.gpus)
    if nodes > MAX_NODES:
        return False, f"{nodes} nodes is more than the {MAX_NODES} a drawing shows legibly"
    return True, ""


def _nominal(fabric: Fabric, kind: LinkKind) -> float:
    speeds = fabric.spec.speeds
    return {
        LinkKind.NVLINK: speeds.nvlink,
        LinkKind.NIC: speeds.nic,
        LinkKind.TOR_AGG: speeds.tor_agg,
        LinkKind.AGG_CORE: speeds.agg_core,
    }[kind]


def _row_order(switch: Switch) -> tuple[int, int, int]:
    """(pod, rail, index): numeric, so c10 comes after c9, and planes stay together."""
    return (
        -1 if switch.pod is None else switch.pod,
        -1 if switch.rail is None else switch.rail,
        switch.index,
    )


def _positions(fabric: Fabric) -> tuple[dict[str, tuple[float, float]], float, float]:
    """Node positions, the drawing's width and the y of its top row."""
    gpus = [g.name for g in fabric.gpus_by_rank()]
    rows = [
        [s.name for s in sorted(fabric.switches_in(tier), key=_row_order)]
        for tier in (Tier.TOR, Tier.AGG, Tier.CORE)
        if fabric.switches_in(tier)
    ]
    width = float(max([len(gpus), *(len(r) for r in rows)], default=1))
    pos: dict[str, tuple[float, float]] = {}
    for i, name in enumerate(gpus):
        pos[name] = ((i + 0.5) * width / len(gpus), _GPU_ROW)
    for server in fabric.servers.values():
        xs = [pos[g][0] for g in server.gpus]
        pos[server.nvswitch] = (sum(xs) / len(xs), _NV_ROW)
    top = _GPU_ROW
    for names in rows:
        top += _TIER_GAP
        for i, name in enumerate(names):
            pos[name] = ((i + 0.5) * width / len(names), top)
    return pos, width, top


def draw_fabric(fabric: Fabric, path: str | Path) -> Path:
    """Write a PNG of ``fabric`` to ``path``; raises ValueError when it is too large."""
    ok, why = drawable(fabric)
    if not ok:
        raise ValueError(why)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    pos, width, top = _positions(fabric)
    gpu_step = width / max(len(fabric.gpus), 1)
    fig_width = max(8.0, min(40.0, 0.5 * width + 3))
    fig = Figure(figsize=(fig_width, (2.0 + 1.2 * top) * max(1.0, fig_width / 20)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_axis_off()

    # Links, bottom layer. Parallel links collapse into one thicker line with a count.
    bundles: Counter[tuple[str, str, LinkKind, float]] = Counter()
    for link in fabric.links:
        a, b = sorted((link.a, link.b))
        bundles[(a, b, link.kind, link.capacity)] += 1
    for (a, b, kind, capacity), count in bundles.items():
        (xa, ya), (xb, yb) = pos[a], pos[b]
        dashed = capacity < _nominal(fabric, kind) * 0.999
        ax.plot(
            [xa, xb],
            [ya, yb],
            color=LINK_COLOUR[kind],
            linewidth=0.8 + 0.9 * (count - 1),
            linestyle="--" if dashed else "-",
            zorder=1,
        )
        if count > 1:
            ax.text(
                xa + (xb - xa) * 0.3,
                ya + (yb - ya) * 0.3,
                f"x{count}",
                fontsize=6,
                color="#555555",
                ha="center",
                va="center",
                zorder=2,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7},
            )

    # Server frames around their GPUs and NVLink switch.
    for server in fabric.servers.values():
        xs = [pos[g][0] for g in server.gpus]
        left, right = min(xs) - 0.42 * gpu_step, max(xs) + 0.42 * gpu_step
        ax.add_patch(
            Rectangle(
                (left, _NV_ROW - 0.42),
                right - left,
                _GPU_ROW - _NV_ROW + 0.67,
                facecolor="#f4f4f4",
                edgecolor="#bbbbbb",
                linewidth=0.6,
                zorder=0,
            )
        )

    crowded = max(len(fabric.gpus), *(len(fabric.switches_in(t)) for t in Tier)) > 24
    label_size = 5.5 if crowded else 7
    rotation = 90 if crowded else 0
    for name, switch in fabric.switches.items():
        x, y = pos[name]
        ax.scatter(
            [x], [y], s=140, marker="s", color=TIER_COLOUR[switch.tier], zorder=3, linewidths=0
        )
        below = switch.tier is Tier.NVLINK
        ax.text(
            x,
            y - 0.12 if below else y + 0.12,
            name,
            fontsize=label_size,
            rotation=rotation,
            ha="center",
            va="top" if below else "bottom",
            zorder=4,
        )
    for name in fabric.gpus:
        x, y = pos[name]
        ax.scatter([x], [y], s=110, marker="o", color=GPU_COLOUR, zorder=3, linewidths=0)
        ax.text(
            x,
            y - 0.12,
            name,
            fontsize=label_size,
            rotation=rotation,
            ha="center",
            va="top",
            zorder=4,
        )

    spec = fabric.spec
    ax.set_title(
        f"{fabric.name} ({fabric.kind})\n{len(fabric.gpus)} GPUs in {len(fabric.servers)} "
        f"servers, {spec.pods} pod(s), {spec.rails} rail(s), {spec.nic_ports} NIC port(s) "
        f"per GPU" + (", GPUs forward over NVLink" if fabric.gpu_forwarding else ""),
        fontsize=10,
    )
    present_tiers = {s.tier for s in fabric.switches.values()}
    handles = [
        Line2D([], [], marker="o", linestyle="", color=GPU_COLOUR, markersize=7, label="GPU")
    ]
    handles += [
        Line2D(
            [],
            [],
            marker="s",
            linestyle="",
            color=TIER_COLOUR[tier],
            markersize=7,
            label=TIER_LABEL[tier],
        )
        for tier in Tier
        if tier in present_tiers
    ]
    kinds: dict[LinkKind, set[float]] = defaultdict(set)
    for link in fabric.links:
        kinds[link.kind].add(link.capacity)
    handles += [
        Line2D(
            [],
            [],
            color=LINK_COLOUR[kind],
            linewidth=2,
            label=f"{kind.value} link " + "/".join(format_rate(c) for c in sorted(kinds[kind])),
        )
        for kind in LinkKind
        if kind in kinds
    ]
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.01),
        ncol=min(len(handles), 5),
        fontsize=7,
        frameon=False,
    )
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(_NV_ROW - 0.6, top + 0.6)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, format="png")
    return path
