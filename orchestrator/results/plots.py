"""PNG figures of a results bundle (matplotlib, Agg backend: no display needed).

- ``plots/busbw-<collective>-<algorithm>.png``: bus bandwidth against message size, one
  line per policy, at real link speeds (emulated on the right axis), with the spread over
  timed iterations as a band, the configuration's own busbw ceiling (the algorithm's share
  of fabric vs NVLink bytes, orchestrator.collectives.ceilings) and the rail's TCP ceiling
  as references;
- ``plots/link-utilization.png``: every link direction against time, utilization = rate /
  capacity, from the switches' cumulative port counters and the capacities in fabric.json,
  with the intervals of the faults the run injected shaded and their targets outlined;
- ``plots/connections/<policy>__<collective>-<algorithm>__<size>.png``: per-connection
  throughput over time during one configuration (lines, and the same as a heat map).

Rates come from cumulative byte curves interpolated at bin edges, so a sample interval that
straddles two bins is shared between them instead of landing whole in one (no striping when
samples jitter around the bin width).
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.collectives.sizes import format_size
from orchestrator.results.store import PLOTS, ConnectionSample, ResultsBundle
from orchestrator.results.summary import ConfigurationResult, Group, group_slug, grouped
from topologies.fivetuple import FiveTuple
from topologies.units import TCP_PAYLOAD_SHARE, format_rate, parse_rate

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Array = np.ndarray[Any, np.dtype[np.float64]]

MAX_PLOT_PROCESSES = 4
MAX_BINS = 400
KIND_ORDER = ("nic", "tor_agg", "agg_core", "nvlink")
KIND_LABEL = {"nic": "GPU-ToR", "tor_agg": "ToR-Agg", "agg_core": "Agg-Core", "nvlink": "NVLink"}


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(figure)
    return path


def render_plots(bundle: ResultsBundle, results: Sequence[ConfigurationResult]) -> list[Path]:
    """Every figure the bundle's data allows; returns the files written."""
    directory = bundle.path / PLOTS
    written = busbw_plots(bundle, results, directory)
    heat_map = link_utilization_plot(bundle, directory / "link-utilization.png")
    if heat_map is not None:
        written.append(heat_map)
    jobs = []
    for result in results:
        c = result.configuration
        name = f"{group_slug(c.group)}__{format_size(c.size)}.png"
        jobs.append((result, directory / "connections" / name))
    workers = min(os.cpu_count() or 1, MAX_PLOT_PROCESSES, len(jobs))
    if workers <= 1:
        written += [p for r, path in jobs if (p := connection_plot(bundle, r, path))]
        return written
    # One figure takes 1-2 s of CPU (mostly text layout), and a run makes one per
    # configuration: split them over the cores, each process reading the bundle itself.
    # forkserver, not fork: the caller may have threads (samplers, the monitor, a held
    # fabric's helpers), and a child forked while one of them holds a lock waits on it
    # forever (seen: a plot worker stuck on a futex, the run waiting for it).
    chunks = [(bundle.path, jobs[i::workers]) for i in range(workers)]
    with multiprocessing.get_context("forkserver").Pool(workers) as pool:
        for paths in pool.map(_connection_plots, chunks):
            written += paths
    return written


def _connection_plots(chunk: tuple[Path, list[tuple[ConfigurationResult, Path]]]) -> list[Path]:
    """A child process's share of the per-connection figures (render_plots)."""
    bundle_path, jobs = chunk
    bundle = ResultsBundle.open(bundle_path)
    try:
        return [p for result, path in jobs if (p := connection_plot(bundle, result, path))]
    finally:
        bundle.close()


# --- bus bandwidth against size ------------------------------------------------------------


def nic_ceiling_real_gbps(fabric: dict[str, Any]) -> float:
    """busbw ceiling of one GPU at real speed, GB/s: its NIC ports x rate x TCP goodput
    (of the frames the run's emulator recipe used, recorded in the fabric's ``extra``)."""
    spec = fabric["spec"]
    return parse_rate(spec["speeds"]["nic"]) * spec["nic_ports"] * payload_share(fabric) / 8 / 1e9


def payload_share(fabric: dict[str, Any]) -> float:
    """TCP's payload share of a frame in the run (bundles before recipes recorded it: 1500)."""
    return float(fabric.get("extra", {}).get("tcp_payload_share", TCP_PAYLOAD_SHARE))


def busbw_plots(
    bundle: ResultsBundle, results: Sequence[ConfigurationResult], directory: Path
) -> list[Path]:
    """One figure per (collective, algorithm); one line per policy."""
    plt = pyplot()
    by_collective: dict[tuple[str, str], dict[Group, list[ConfigurationResult]]] = {}
    for group, members in grouped(results).items():
        by_collective.setdefault((group[1], group[2]), {})[group] = members
    scale = bundle.scale
    ceiling = nic_ceiling_real_gbps(bundle.fabric)
    spec = bundle.fabric["spec"]
    written = []
    for (collective, algorithm), groups in by_collective.items():
        figure, axes = plt.subplots(figsize=(8, 5))
        sizes: set[int] = set()
        ranks: set[int] = set()
        for group, members in groups.items():
            x = [m.configuration.size for m in members]
            sizes.update(x)
            ranks.update(m.configuration.ranks for m in members)
            y = [m.busbw_real for m in members]
            low = [m.busbw_min / scale for m in members]
            high = [m.busbw_max / scale for m in members]
            (line,) = axes.plot(x, y, marker="o", linewidth=2, label=f"policy {group[0]}")
            axes.fill_between(x, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
        nic = f"{spec['nic_ports']} x {spec['speeds']['nic']}"
        payload = payload_share(bundle.fabric)
        references = [(ceiling, f"rail x TCP payload ({nic} x {payload:.3f})", ":")]
        own = next((m.ceiling for members in groups.values() for m in members if m.ceiling), None)
        if own is not None and math.isfinite(own.busbw):
            top = own.busbw / scale
            share = own.fabric_share
            if abs(top - ceiling) > 1e-9 * ceiling:
                references.insert(
                    0, (top, f"{algorithm}'s ceiling (fabric share {share:.3f})", "--")
                )
            else:
                references = [(top, f"ceiling: rail x TCP payload ({nic} x {payload:.3f})", "--")]
        for value, text, style in references:
            axes.axhline(value, color="0.4", linestyle=style, linewidth=1)
            axes.annotate(
                text,
                xy=(0.01, value),
                xycoords=("axes fraction", "data"),
                xytext=(0, 4),
                textcoords="offset points",
                fontsize=9,
                color="0.3",
            )
        highest = max(value for value, _, _ in references)
        axes.set_xscale("log", base=2)
        ticks = sorted(sizes)
        axes.set_xticks(ticks, [format_size(size) for size in ticks])
        axes.minorticks_off()
        axes.set_ylim(0, max(highest * 1.15, axes.get_ylim()[1]))
        axes.set_xlabel("message size (bytes; 1K = 1024)")
        axes.set_ylabel("bus bandwidth at real link speed (GB/s)")
        right = axes.secondary_yaxis(
            "right", functions=(lambda v: v * scale * 1e3, lambda v: v / scale / 1e3)
        )
        right.set_ylabel(f"emulated (MB/s, scale {scale:g})")
        rank_text = ", ".join(str(n) for n in sorted(ranks))
        axes.set_title(
            f"{collective} ({algorithm}): bus bandwidth vs size\n"
            f"{rank_text} ranks on {bundle.run.fabric}; band = spread over timed iterations",
            fontsize=11,
        )
        axes.grid(True, alpha=0.3)
        axes.legend(loc="lower right")
        written.append(save_figure(figure, directory / f"busbw-{collective}-{algorithm}.png"))
    return written


# --- rates from cumulative curves ------------------------------------------------------------


def bin_edges(start: float, stop: float, interval: float) -> Array:
    """Bins at least ``interval`` wide (the sampling period) and at most MAX_BINS of them."""
    span = max(stop - start, 1e-9)
    width = max(interval, span / MAX_BINS)
    count = max(1, math.ceil(span / width))
    return np.asarray(start + width * np.arange(count + 1), dtype=np.float64)


def rate_per_bin(times: Array, cumulative: Array, edges: Array) -> Array:
    """Bytes per second in each bin of a cumulative byte curve, NaN outside its time span."""
    at_edges = np.interp(edges, times, cumulative)
    rates = np.diff(at_edges) / np.diff(edges)
    centres = (edges[:-1] + edges[1:]) / 2
    rates[(centres < times[0]) | (centres > times[-1])] = np.nan
    return np.asarray(rates, dtype=np.float64)


def _median_interval(times: Sequence[float], default: float) -> float:
    steps = [b - a for a, b in pairwise(times) if b > a]
    return median(steps) if steps else default


# --- link utilization ------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkDirection:
    """One direction of a link and the switch counter that measures it: the sender's tx
    where the sender is a switch, else the receiver's rx. ``capacity``: emulated bit/s."""

    kind: str
    label: str
    switch: str
    port: int
    counter: str  # "tx" or "rx"
    capacity: float


def link_directions(fabric: dict[str, Any]) -> list[LinkDirection]:
    """Both directions of every link of fabric.json that a switch counts, tiers bottom up."""
    switches = {s["name"] for s in fabric.get("switches", [])}
    directions = []
    for link in fabric.get("links", []):
        ends = [(link["a"], link["a_port"]), (link["b"], link["b_port"])]
        for (src, src_port), (dst, dst_port) in (ends, ends[::-1]):
            label, capacity = f"{src} > {dst}", float(link["emulated"])
            if src in switches:
                directions.append(LinkDirection(link["kind"], label, src, src_port, "tx", capacity))
            elif dst in switches:
                directions.append(LinkDirection(link["kind"], label, dst, dst_port, "rx", capacity))
    order = {kind: i for i, kind in enumerate(KIND_ORDER)}
    directions.sort(key=lambda d: order.get(d.kind, len(order)))
    return directions


def link_utilization(
    bundle: ResultsBundle,
) -> tuple[list[str], list[str], Array, Array] | None:
    """(row labels, row kinds, bin edges in epoch s, utilization matrix), or None."""
    series: dict[tuple[str, int], tuple[list[float], list[int], list[int]]] = {}
    for counter in bundle.port_counters():
        times, rx, tx = series.setdefault((counter.switch, counter.port), ([], [], []))
        times.append(counter.t)
        rx.append(counter.rx_bytes)
        tx.append(counter.tx_bytes)
    series = {key: value for key, value in series.items() if len(value[0]) >= 2}
    if not series:
        return None
    start = min(times[0] for times, _, _ in series.values())
    stop = max(times[-1] for times, _, _ in series.values())
    interval = median(_median_interval(times, 1.0) for times, _, _ in series.values())
    edges = bin_edges(start, stop, interval)
    labels, kinds, rows = [], [], []
    for direction in link_directions(bundle.fabric):
        if (direction.switch, direction.port) not in series:
            continue
        times, rx, tx = series[(direction.switch, direction.port)]
        counts = np.asarray(tx if direction.counter == "tx" else rx, dtype=np.float64)
        # A counter that goes backwards (switch restarted) restarts the curve there.
        steps = np.clip(np.diff(counts, prepend=counts[0]), 0, None)
        rates = rate_per_bin(np.asarray(times, dtype=np.float64), np.cumsum(steps), edges)
        labels.append(direction.label)
        kinds.append(direction.kind)
        rows.append(rates * 8 / direction.capacity)
    if not rows:
        return None
    return labels, kinds, edges, np.vstack(rows)


def link_utilization_plot(bundle: ResultsBundle, path: Path) -> Path | None:
    computed = link_utilization(bundle)
    if computed is None:
        return None
    labels, kinds, absolute, matrix = computed
    origin = float(absolute[0])
    edges = absolute - origin
    plt = pyplot()
    height = min(40.0, max(4.0, 0.14 * len(labels) + 1.8))
    figure, axes = plt.subplots(figsize=(12, height))
    image = axes.imshow(
        np.ma.masked_invalid(matrix),
        aspect="auto",
        interpolation="nearest",
        cmap="magma",
        vmin=0.0,
        vmax=1.0,
        extent=(float(edges[0]), float(edges[-1]), len(labels) - 0.5, -0.5),
    )
    axes.set_facecolor("0.85")  # no counters for that bin
    axes.set_yticks(range(len(labels)), labels, fontsize=6 if len(labels) > 40 else 8)
    # Separate the tiers and name them on the right.
    boundaries = [i for i in range(1, len(kinds)) if kinds[i] != kinds[i - 1]]
    for boundary in boundaries:
        axes.axhline(boundary - 0.5, color="white", linewidth=1.2)
    for first, last in zip([0, *boundaries], [*boundaries, len(kinds)], strict=True):
        axes.annotate(
            KIND_LABEL.get(kinds[first], kinds[first]),
            xy=(1.01, (first + last - 1) / 2),
            xycoords=("axes fraction", "data"),
            va="center",
            fontsize=9,
            rotation=90,
        )
    _mark_configurations(bundle, axes, origin)
    mark_faults(bundle, axes, origin, labels)
    axes.set_xlabel("time since the first port counter (s)")
    axes.set_title(
        f"Link utilization (rate / capacity) per direction, {bundle.run.fabric}, "
        f"run {bundle.run.experiment!r}",
        fontsize=11,
    )
    bar = figure.colorbar(image, ax=axes, pad=0.04, fraction=0.03)
    bar.set_label("utilization (values above 1 shown as 1)")
    return save_figure(figure, path)


def fault_rows(target: str, labels: Sequence[str]) -> list[int]:
    """The rows (``A > B`` labels) a fault's target names: a link ``A-B`` both directions,
    ``A>B`` one, a node every direction into or out of it; none for no target."""
    if not target:
        return []
    if ">" in target:
        a, b = target.split(">", 1)
        wanted = {f"{a} > {b}"}
    elif "-" in target:
        a, b = target.split("-", 1)
        wanted = {f"{a} > {b}", f"{b} > {a}"}
    else:
        return [i for i, label in enumerate(labels) if target in label.split(" > ")]
    return [i for i, label in enumerate(labels) if label in wanted]


def mark_faults(
    bundle: ResultsBundle, axes: Any, origin: float, labels: Sequence[str] = ()
) -> None:
    """Every fault the run injected: its interval shaded (applied to undone, or to the
    axis's end if never undone), named at the bottom, and its target's rows outlined."""
    high = axes.get_xlim()[1]
    for fault in bundle.faults():
        if fault.applied is None:
            continue
        start = fault.applied - origin
        stop = (fault.undone - origin) if fault.undone is not None else high
        axes.axvspan(start, stop, color="red", alpha=0.15, linewidth=0)
        axes.axvline(start, color="red", linewidth=1.0)
        axes.annotate(
            f"#{fault.id} {fault.kind} {fault.target}".strip(),
            xy=(start, 0.01),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            color="red",
            rotation=90,
            va="bottom",
        )
        for row in fault_rows(fault.target, labels):
            axes.add_patch(
                pyplot().Rectangle(
                    (start, row - 0.5), stop - start, 1.0, fill=False, edgecolor="red", lw=1.2
                )
            )


def _mark_configurations(bundle: ResultsBundle, axes: Any, origin: float) -> None:
    """Dotted lines where configurations start (from the phase timelines, if recorded), named
    on a top axis where there is room for a name."""
    spans = bundle.spans()
    if not spans:
        return
    configurations = {c.id: c for c in bundle.configurations()}
    low, high = axes.get_xlim()
    ticks, names = [], []
    for config_id, (start, stop) in sorted(spans.items(), key=lambda item: item[1][0]):
        c = configurations.get(config_id)
        x = start - origin
        if c is None or not low <= x <= high:
            continue
        axes.axvline(x, color="cyan", linestyle=":", linewidth=0.8)
        ticks.append(x)
        room = (stop - start) > 0.03 * (high - low)
        names.append(f"{c.policy} {c.collective} {format_size(c.size)}" if room else "")
    top = axes.secondary_xaxis("top")
    top.set_xticks(ticks, names, rotation=35, ha="left", fontsize=7)
    top.tick_params(length=3)


# --- per-connection throughput ---------------------------------------------------------------


def connection_rates(
    samples: Sequence[ConnectionSample],
) -> tuple[list[tuple[int, FiveTuple]], Array, Array] | None:
    """(connections, bin edges in s since the first sample, Mbit/s matrix), emulated."""
    per_connection: dict[tuple[int, FiveTuple], tuple[list[float], list[int]]] = {}
    for sample in samples:
        times, counts = per_connection.setdefault((sample.rank, sample.five_tuple), ([], []))
        times.append(sample.t)
        counts.append(sample.bytes)
    if not per_connection:
        return None
    curves = []
    for key, (times, counts) in sorted(per_connection.items(), key=lambda item: item[0]):
        order = np.argsort(times)
        t = np.asarray(times, dtype=np.float64)[order]
        b = np.asarray(counts, dtype=np.float64)[order]
        # bytes of the first sample were sent during the period before it
        first = t[0] - _median_interval(list(t), 0.01)
        curves.append((key, np.concatenate(([first], t)), np.concatenate(([0.0], np.cumsum(b)))))
    start = min(float(c[1][0]) for c in curves)
    stop = max(float(c[1][-1]) for c in curves)
    interval = median(_median_interval(list(c[1]), 0.01) for c in curves)
    edges = bin_edges(start, stop, interval)
    rows = [np.nan_to_num(rate_per_bin(t, cum, edges)) * 8 / 1e6 for _, t, cum in curves]
    return [c[0] for c in curves], edges - start, np.vstack(rows)


def connection_plot(bundle: ResultsBundle, result: ConfigurationResult, path: Path) -> Path | None:
    computed = connection_rates(bundle.samples(result.configuration.id))
    if computed is None:
        return None
    connections, edges, matrix = computed
    plt = pyplot()
    c = result.configuration
    scale = bundle.scale
    nic_mbps = parse_rate(bundle.fabric["spec"]["speeds"]["nic"]) * scale / 1e6
    height = 3.2 + min(10.0, 0.13 * len(connections) + 0.8)
    figure, (top, bottom) = plt.subplots(
        2,
        1,
        figsize=(11, height),
        sharex=True,
        gridspec_kw={"height_ratios": [3.2, height - 3.2]},
    )
    centres = (edges[:-1] + edges[1:]) / 2
    # Rows of the heat map below name the connections; the lines show their spread.
    for row in matrix:
        top.plot(centres, row, linewidth=0.8, alpha=0.6)
    top.plot(centres, matrix.mean(axis=0), color="black", linewidth=2, label="mean")
    top.axhline(nic_mbps, color="0.4", linestyle="--", linewidth=1, label="one NIC port")
    top.set_ylim(0, max(nic_mbps, float(np.nanmax(matrix))) * 1.25)
    top.set_ylabel("throughput (Mbit/s, emulated)")
    right = top.secondary_yaxis(
        "right", functions=(lambda v: v / scale / 1e3, lambda v: v * scale * 1e3)
    )
    right.set_ylabel("real (Gbit/s)")
    top.legend(fontsize=8, loc="upper right")
    top.grid(True, alpha=0.3)
    top.set_title(
        f"Per-connection throughput: {c.collective} ({c.algorithm}), policy {c.policy}, "
        f"{format_size(c.size)}, {c.ranks} ranks ({len(connections)} connections)\n"
        f"NIC port {format_rate(nic_mbps * 1e6)}bit/s emulated = "
        f"{bundle.fabric['spec']['speeds']['nic']} real",
        fontsize=11,
    )
    image = bottom.imshow(
        matrix,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0.0,
        # the 99th percentile, not the port rate: connections share ports, and contrast
        # between them is the point (the top panel shows the port rate)
        vmax=max(1e-6, float(np.nanpercentile(matrix, 99))),
        extent=(float(edges[0]), float(edges[-1]), len(connections) - 0.5, -0.5),
    )
    labels = [f"r{rank} {five.label}" for rank, five in connections]
    bottom.set_yticks(range(len(labels)), labels, fontsize=6 if len(labels) > 24 else 8)
    bottom.set_xlabel("time since the configuration's first sample (s)")
    bar = figure.colorbar(image, ax=[top, bottom], pad=0.08, fraction=0.025)
    bar.set_label("Mbit/s (emulated)")
    return save_figure(figure, path)
