"""A study's plots: busbw vs size with a line per variant x policy for each collective, and
the study plot, average busbw against the swept key (orchestrator.study.bundle)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from orchestrator.collectives.sizes import format_size
from orchestrator.results.plots import pyplot, save_figure
from orchestrator.results.store import PLOTS
from orchestrator.results.summary import grouped
from orchestrator.study.bundle import StudyBundle, VariantRun, average_real


def render_study_plots(study: StudyBundle) -> list[Path]:
    directory = study.path / PLOTS
    directory.mkdir(exist_ok=True)
    measured = [run for run in study.variants if run.results]
    if not measured:
        return []
    return [*busbw_by_variant(study, measured, directory), study_plot(study, measured, directory)]


def busbw_by_variant(study: StudyBundle, runs: list[VariantRun], directory: Path) -> list[Path]:
    """One figure per (collective, algorithm): busbw at real speed vs size, a line per
    variant x policy (the same colour for a variant, a dash per policy)."""
    plt = pyplot()
    collectives: list[tuple[str, str]] = []
    for run in runs:
        for _, op, algorithm in grouped(run.results):
            if (op, algorithm) not in collectives:
                collectives.append((op, algorithm))
    styles = ["-", "--", ":", "-."]
    written = []
    for op, algorithm in collectives:
        figure, axes = plt.subplots(figsize=(9, 5.5))
        sizes: set[int] = set()
        policies: list[str] = []
        for number, run in enumerate(runs):
            colour = f"C{number % 10}"
            for (policy, g_op, g_alg), members in grouped(run.results).items():
                if (g_op, g_alg) != (op, algorithm):
                    continue
                if policy not in policies:
                    policies.append(policy)
                x = [m.configuration.size for m in members]
                sizes.update(x)
                axes.plot(
                    x,
                    [m.busbw_real for m in members],
                    marker="o",
                    linewidth=2,
                    color=colour,
                    linestyle=styles[policies.index(policy) % len(styles)],
                    label=f"{run.label} / {policy}",
                )
        axes.set_xscale("log", base=2)
        ticks = sorted(sizes)
        axes.set_xticks(ticks, [format_size(size) for size in ticks])
        axes.minorticks_off()
        axes.set_ylim(bottom=0)
        axes.set_xlabel("message size (bytes; 1K = 1024)")
        axes.set_ylabel("bus bandwidth at real link speed (GB/s)")
        axes.set_title(f"study {study.name}: {op} ({algorithm}), busbw vs size", fontsize=11)
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=8, loc="best")
        written.append(save_figure(figure, directory / f"busbw-{op}-{algorithm}.png"))
    return written


def study_plot(study: StudyBundle, runs: list[VariantRun], directory: Path) -> Path:
    """Average real-speed busbw per (policy, collective) against the variants: lines over
    the swept key's values where exactly one numeric key varies, else grouped bars, one
    group per variant (a variant that did not complete is marked, not drawn as zero)."""
    plt = pyplot()
    chosen = study.document.get("plot") or {}
    metric = chosen.get("metric", "busbw")
    axis_key, positions = _positions(study, runs, chosen.get("x"))
    figure, axes = plt.subplots(figsize=(9, 5.5))
    values = {run.index: average_real(run, metric) for run in study.variants}
    groups: list[tuple[str, str, str]] = []
    for run in runs:
        groups += [g for g in values[run.index] if g not in groups]
    if axis_key is not None:
        for group in groups:
            points = sorted(
                (x, values[run.index][group])
                for run, x in zip(runs, positions, strict=True)
                if group in values[run.index]
            )
            axes.plot(*zip(*points, strict=True), marker="o", linewidth=2, label=_label(group))
        axes.set_xticks(sorted(set(positions)))
        axes.set_xlabel(axis_key)
    else:
        everyone = study.variants
        width = 0.8 / max(len(groups), 1)
        for number, group in enumerate(groups):
            x = [i + (number - (len(groups) - 1) / 2) * width for i in range(len(everyone))]
            y = [values[run.index].get(group, math.nan) for run in everyone]
            axes.bar(x, y, width=width * 0.95, label=_label(group))
        for i, run in enumerate(everyone):
            if run.shown != "ok":
                axes.annotate(
                    run.shown, xy=(i, 0), xytext=(0, 6), textcoords="offset points",
                    ha="center", fontsize=9, color="C3",
                )  # fmt: skip
        axes.set_xticks(range(len(everyone)), [run.label for run in everyone], fontsize=8)
        for tick in axes.get_xticklabels():
            tick.set_rotation(15)
            tick.set_horizontalalignment("right")
        axes.set_xlabel("variant")
    axes.set_ylim(bottom=0)
    what = "bus bandwidth" if metric == "busbw" else "algorithm bandwidth"
    axes.set_ylabel(f"average {what} at real link speed (GB/s)")
    axes.set_title(f"study {study.name}: average {metric} over sizes per variant", fontsize=11)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return save_figure(figure, directory / f"study-{metric}.png")


def _label(group: tuple[str, str, str]) -> str:
    policy, op, algorithm = group
    return f"{op} ({algorithm}) / {policy}"


def _positions(
    study: StudyBundle, runs: list[VariantRun], chosen: str | None = None
) -> tuple[str | None, list[float]]:
    """The x of each run: the chosen swept key's value, or the one numeric key that varies;
    else the variant's position."""
    varying = (
        [chosen]
        if chosen
        else [
            key
            for key in study.document.get("axes", [])
            if len({_hashable(run.settings.get(key)) for run in study.variants}) > 1
        ]
    )
    if len(varying) == 1:
        key = varying[0]
        values = [run.settings.get(key) for run in runs]
        numbers = [float(v) for v in values if isinstance(v, (int, float)) and _is_number(v)]
        if len(numbers) == len(values):
            return key, numbers
    return None, [float(i) for i in range(len(runs))]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _hashable(value: Any) -> Any:
    return repr(value)
