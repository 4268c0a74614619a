"""The monitor's figures in a bundle's ``plots/`` (matplotlib, as orchestrator.results.plots):

- ``plots/gantt.png``: one row per rank, one bar per operation (start to end, coloured by
  configuration; its steps as ticks when there are few enough), with the faults' intervals
  shaded: a straggler or a slowed link shows as longer bars in the shaded span;
- ``plots/faults/fault-<id>-<kind>.png``: per fault with a target, the throughput and the
  RTT (the sender's TCP_INFO) of the connections whose recorded path crosses the target,
  with the fault's interval shaded.

The heat map with the faults marked is orchestrator.results.plots' (link-utilization.png).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from orchestrator.collectives.sizes import format_size
from orchestrator.monitor.queries import touched_connections
from orchestrator.results.plots import bin_edges, mark_faults, pyplot, rate_per_bin, save_figure
from orchestrator.results.store import PLOTS, InjectedFault, ResultsBundle

MAX_TOUCHED = 12  # connections drawn per fault figure
MAX_STEP_TICKS = 4000  # steps drawn as ticks in the Gantt up to this many
RATE_BIN_S = 0.1  # the touched connections' throughput, per bin of this width


def render_monitor_plots(bundle: ResultsBundle) -> list[Path]:
    """Every monitor figure the bundle's data allows; returns the files written."""
    directory = bundle.path / PLOTS
    written = []
    gantt = gantt_plot(bundle, directory / "gantt.png")
    if gantt is not None:
        written.append(gantt)
    for fault in bundle.faults():
        path = fault_connections_plot(bundle, fault, directory / "faults")
        if path is not None:
            written.append(path)
    return written


def operations(bundle: ResultsBundle) -> dict[int, list[tuple[float, float, int]]]:
    """Rank -> its operations as (start, end, configuration id), epoch s; from the
    iterations' starts (version 3), else from the phase timelines."""
    by_rank: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for c in bundle.configurations():
        records = bundle.iterations(c.id)
        if records and all(r.start is not None for r in records):
            for r in records:
                assert r.start is not None
                by_rank[r.rank].append((r.start, r.start + r.time_us / 1e6, c.id))
            continue
        spans: dict[tuple[int, int], list[float]] = {}
        for phase in bundle.timelines(c.id):
            span = spans.setdefault((phase.iteration, phase.rank), [phase.start, phase.end])
            span[0], span[1] = min(span[0], phase.start), max(span[1], phase.end)
        for (_, rank), (start, end) in spans.items():
            by_rank[rank].append((start, end, c.id))
    return by_rank


def gantt_plot(bundle: ResultsBundle, path: Path) -> Path | None:
    by_rank = operations(bundle)
    if not by_rank:
        return None
    origin = min(start for ops in by_rank.values() for start, _, _ in ops)
    configurations = {c.id: c for c in bundle.configurations()}
    plt = pyplot()
    colours = plt.get_cmap("tab20")
    ranks = sorted(by_rank)
    figure, axes = plt.subplots(figsize=(12, min(20.0, 1.5 + 0.32 * len(ranks))))
    order = {cid: i for i, cid in enumerate(sorted(configurations))}
    for row, rank in enumerate(ranks):
        bars = [(s - origin, max(e - s, 1e-6)) for s, e, _ in by_rank[rank]]
        faces = [colours(order.get(cid, 0) % 20) for _, _, cid in by_rank[rank]]
        axes.broken_barh(bars, (row - 0.4, 0.8), facecolors=faces, linewidth=0)
    steps = [s for c in configurations for s in bundle.steps(c)]
    if 0 < len(steps) <= MAX_STEP_TICKS:
        row_of = {rank: row for row, rank in enumerate(ranks)}
        xs = [s.start - origin for s in steps if s.rank in row_of]
        ys = [row_of[s.rank] for s in steps if s.rank in row_of]
        axes.scatter(xs, ys, marker="|", s=30, color="black", linewidths=0.4, label="step start")
    axes.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
    axes.invert_yaxis()
    mark_faults(bundle, axes, origin)
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=colours(order[cid] % 20))
        for cid in sorted(configurations)[:20]
    ]
    names = [
        f"{c.policy} {c.collective} {format_size(c.size)}"
        for cid, c in sorted(configurations.items())[:20]
    ]
    axes.legend(handles, names, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes.set_xlabel("time since the first operation (s)")
    axes.set_title(
        f"Operations per rank, run {bundle.run.experiment!r} (faults shaded red)", fontsize=11
    )
    return save_figure(figure, path)


def fault_connections_plot(
    bundle: ResultsBundle, fault: InjectedFault, directory: Path
) -> Path | None:
    """Throughput and RTT of the connections the fault touched, around the fault."""
    ids = touched_connections(bundle, fault.target)[:MAX_TOUCHED]
    if not ids or fault.applied is None:
        return None
    plt = pyplot()
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    origin = fault.applied
    connections = {c.id: c for c in bundle.connections()}
    drawn, peak = 0, 0.0
    for connection_id in ids:
        c = connections.get(connection_id)
        rows = bundle.sql(
            "SELECT t, bytes FROM connection_samples WHERE connection_id = ? ORDER BY t",
            (connection_id,),
        )
        if len(rows) < 2 or c is None:
            continue
        t = np.asarray([r[0] for r in rows], dtype=np.float64)
        cumulative = np.cumsum(np.asarray([r[1] for r in rows], dtype=np.float64))
        edges = bin_edges(float(t[0]), float(t[-1]), RATE_BIN_S)  # as the results' plots bin
        rate = rate_per_bin(t, cumulative, edges) * 8 / 1e6
        label = f"r{c.src_rank}>r{c.dst_rank} {c.five_tuple.src_port}"
        top.plot((edges[:-1] + edges[1:]) / 2 - origin, rate, linewidth=0.8, label=label)
        peak = max(peak, float(np.nanmax(rate)) if np.isfinite(rate).any() else 0.0)
        info = bundle.tcp_info(connection_id)
        if info:
            bottom.plot([s.t - origin for s in info], [s.rtt_us / 1e3 for s in info], linewidth=0.7)
        drawn += 1
    if not drawn:
        pyplot().close(figure)
        return None
    for axes in (top, bottom):
        end = (fault.undone - origin) if fault.undone is not None else axes.get_xlim()[1]
        axes.axvspan(0.0, end, color="red", alpha=0.15, linewidth=0)
        axes.grid(True, alpha=0.3)
    top.set_ylim(0, max(peak, 1e-6) * 1.25)
    top.set_ylabel(f"throughput (Mbit/s, emulated, {RATE_BIN_S:g} s bins)")
    top.legend(fontsize=6, ncol=3, loc="upper right")
    bottom.set_ylabel("smoothed RTT (ms, sender's TCP_INFO)")
    bottom.set_xlabel("time since the fault was applied (s)")
    top.set_title(
        f"Fault #{fault.id} {fault.kind} on {fault.target}: the {drawn} connections whose "
        "path crosses it",
        fontsize=11,
    )
    return save_figure(figure, directory / f"fault-{fault.id}-{fault.kind}.png")
