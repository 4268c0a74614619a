"""The monitor's part of rendering a bundle: its plots and the fault section.

``astral run`` and ``astral report`` call :func:`render_monitor` after
orchestrator.results.report.render_bundle (the results layer renders its own files and
knows nothing of the monitor above it), and ``astral report`` prints :func:`fault_lines`.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.monitor.faultreport import fault_section
from orchestrator.monitor.plots import render_monitor_plots
from orchestrator.results.store import ResultsBundle


def render_monitor(path: str | Path) -> list[Path]:
    """Write the monitor's figures into the bundle at ``path``; returns them."""
    with ResultsBundle.open(path) as bundle:
        return render_monitor_plots(bundle)


def fault_lines(path: str | Path) -> list[str]:
    """The fault section of the bundle at ``path`` (empty without faults)."""
    with ResultsBundle.open(path) as bundle:
        return fault_section(bundle)
