"""The workload Gantt (``plots/workload-<policy>.png``): one row per rank, the replayed
iteration above and its forecast below on the same axis, at real speed.

Each slot of a rank's timeline (orchestrator/workload/timeline.py) is drawn as its compute
(grey) followed by the communication it did not hide, coloured by kind (tp, ep, pp, dp):
the slot's exposed time. Inside a slot the two overlap in truth (the compute is spread
over the slot's steps, which also move bytes); drawn end to end, a row's coloured length
is the rank's exposed communication, and where the rows end is the iteration time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.results.plots import pyplot, save_figure
from orchestrator.workload.timeline import COMPUTE, KINDS, Timeline

COLOURS = {COMPUTE: "#b0b0b0", "tp": "#1f77b4", "ep": "#d62728", "pp": "#2ca02c", "dp": "#ff7f0e"}


def _draw(axes: Any, timeline: Timeline, scale: float, title: str) -> None:
    to_ms = scale * 1e3
    ranks = sorted(timeline)
    for row, rank in enumerate(ranks):
        computes, exposed, colours = [], [], []
        for span in timeline[rank]:
            if span.compute > 0:
                computes.append((span.start * to_ms, span.compute * to_ms))
            if span.exposed > 0:
                exposed.append(((span.start + span.compute) * to_ms, span.exposed * to_ms))
                colours.append(COLOURS.get(span.kind, "black"))
        axes.broken_barh(computes, (row - 0.4, 0.8), facecolors=COLOURS[COMPUTE], linewidth=0)
        axes.broken_barh(exposed, (row - 0.4, 0.8), facecolors=colours, linewidth=0)
    axes.set_yticks(range(len(ranks)), [f"rank {r}" for r in ranks], fontsize=8)
    axes.invert_yaxis()
    axes.set_title(title, fontsize=10)


def workload_gantt(
    path: Path,
    workload: str,
    policy: str,
    scale: float,
    measured: Timeline,
    forecast: Timeline | None = None,
) -> Path:
    """The replay's timeline (and the forecast's, when there is one) drawn to ``path``."""
    plt = pyplot()
    panels = 2 if forecast else 1
    height = 1.2 + 0.3 * len(measured)
    figure, axes = plt.subplots(
        panels, 1, figsize=(12, min(20.0, panels * height)), sharex=True, squeeze=False
    )
    _draw(axes[0][0], measured, scale, f"replayed on the emulated fabric, policy {policy}")
    if forecast:
        _draw(axes[1][0], forecast, scale, f"forecast (no emulation), policy {policy}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[k]) for k in (COMPUTE, *KINDS)]
    names = ["compute", *(f"{k} exposed" for k in KINDS)]
    names[1 + KINDS.index("pp")] = "pp exposed (incl. the pipeline bubble)"
    axes[0][0].legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    axes[-1][0].set_xlabel("ms of one iteration at real speed (emulated seconds x scale)")
    figure.suptitle(f"Workload {workload!r}: one training iteration per rank", fontsize=11)
    return save_figure(figure, path)
