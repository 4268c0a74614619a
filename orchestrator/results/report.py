"""Render a bundle's derived files from its database and fabric.json alone.

Used by :meth:`ResultsWriter.finish` at the end of a run and by ``astral report`` later
(after a crash, or when the plots or tables change): summary.json, tables/ and plots/ are
rewritten, the database is only read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.results.store import ResultsBundle
from orchestrator.results.summary import (
    ConfigurationResult,
    format_group,
    grouped,
    summarize,
    write_summary,
    write_tables,
)


@dataclass
class Report:
    """What rendering produced: the results, the nccl-tests tables (text) and the files."""

    bundle: Path
    results: list[ConfigurationResult]
    tables: list[str]
    files: list[Path] = field(default_factory=list)


def render_bundle(path: str | Path, *, plots: bool = True) -> Report:
    """Rewrite summary.json, tables/ and (``plots``) plots/ of the bundle at ``path``."""
    with ResultsBundle.open(path) as bundle:
        results = summarize(bundle)
        tables = [
            format_group(group, members, bundle) for group, members in grouped(results).items()
        ]
        files = [write_summary(bundle, results), *write_tables(bundle, results)]
        if plots:
            from orchestrator.results.plots import render_plots

            files += render_plots(bundle, results)
        return Report(bundle.path, results, tables, files)
