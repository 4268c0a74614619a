"""A study bundle's derived files rendered from the variants' bundles and study.json alone:
summary.json, report.txt and plots/ (``astral report STUDY``, and the study runner at its
end), as a run bundle's are (orchestrator.results.report)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.results.store import SUMMARY, _write_json
from orchestrator.study.bundle import REPORT, StudyBundle, report_lines, study_summary
from orchestrator.study.plots import render_study_plots


def render_study(path: str | Path, *, plots: bool = True) -> tuple[StudyBundle, list[str]]:
    """Rewrite summary.json, report.txt and (``plots``) plots/ of the study at ``path``."""
    study = StudyBundle.open(path)
    _write_json(study.path / SUMMARY, study_summary(study))
    lines = report_lines(study)
    (study.path / REPORT).write_text("\n".join(lines) + "\n", encoding="utf-8")
    if plots:
        render_study_plots(study)
    return study, lines
