"""A study's results bundle: every variant's run bundle, with the variant as a dimension.

Layout (``results/<timestamp>-<study>/``)::

    study.json          what the study is (question, axes, variants and their settings),
                        how each variant's run ended, the verdicts, timings
    experiment.yaml     the study file as written
    variants/NN-<label>/  one complete run bundle per variant (astral report, diagnose,
                        compare and monitor work on each as on any run)
    summary.json        every variant's configurations, each with its variant and settings
    report.txt          the study table (average real-speed busbw per variant, policy and
                        collective), the question, what was expected and the verdicts
    plots/              per collective, busbw vs size with a line per variant x policy;
                        study-<metric>.png: average busbw against the swept key

:func:`orchestrator.study.report.render_study` rewrites summary.json, report.txt and plots/
from the variants' bundles and study.json alone (``astral report STUDY``), as a run
bundle's are.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.collectives.nccl import average_busbw
from orchestrator.results.store import ResultsBundle, read_workload
from orchestrator.results.summary import ConfigurationResult, grouped, summarize, summary_document
from topologies.errors import ResultsError

STUDY_FILE = "study.json"
STUDY_TEXT = "experiment.yaml"
REPORT = "report.txt"
VARIANTS = "variants"
STUDY_SCHEMA = 1


@dataclass
class VariantRun:
    """One variant's run as the study bundle knows it (study.json), and its figures."""

    index: int
    label: str
    settings: dict[str, Any]
    directory: str  # relative to the study bundle
    status: str = "not run"
    exit_status: int | None = None
    error: str | None = None
    results: list[ConfigurationResult] = field(default_factory=list)
    scale: float = math.nan
    summary: dict[str, Any] | None = None
    bundle_missing: bool = False  # it ran (study.json says), but its bundle is not there

    @property
    def shown(self) -> str:
        """How the variant ended, as the study's report says it: never a bare "ok" for a
        variant whose bundle (its figures) is gone, deleted or not copied with the study."""
        if not self.bundle_missing:
            return self.status
        return "bundle missing" if self.status == "ok" else f"{self.status}, no bundle"

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "label": self.label,
            "settings": self.settings,
            "bundle": self.directory,
            "status": self.status,
            "exit_status": self.exit_status,
            "error": self.error,
        }


@dataclass
class StudyBundle:
    """An opened study bundle: study.json and each variant's figures."""

    path: Path
    document: dict[str, Any]
    variants: list[VariantRun]

    @property
    def name(self) -> str:
        return str(self.document.get("name", self.path.name))

    @classmethod
    def open(cls, path: str | Path) -> StudyBundle:
        path = Path(path)
        file = path / STUDY_FILE
        try:
            document = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ResultsError(path, f"a study bundle ({STUDY_FILE})", "none") from None
        except (OSError, ValueError) as err:
            raise ResultsError(path, f"a readable {STUDY_FILE}", err) from None
        variants = []
        for entry in document.get("variants", []):
            run = VariantRun(
                index=entry["index"],
                label=entry["label"],
                settings=entry.get("settings", {}),
                directory=entry["bundle"],
                status=entry.get("status", "not run"),
                exit_status=entry.get("exit_status"),
                error=entry.get("error"),
            )
            where = path / run.directory
            if (where / "results.sqlite").is_file():
                with ResultsBundle.open(where) as bundle:
                    run.results = summarize(bundle)
                    run.scale = bundle.scale
                    run.summary = summary_document(bundle, run.results)
            else:  # a variant not run has none; one that ran had one (or failed to start)
                run.bundle_missing = run.status != "not run"
            variants.append(run)
        return cls(path, document, variants)


def is_study_bundle(path: str | Path) -> bool:
    return (Path(path) / STUDY_FILE).is_file()


# --- what the study bundle derives ------------------------------------------------------------


def study_summary(study: StudyBundle) -> dict[str, Any]:
    """summary.json: every variant's configurations and averages, each with the variant."""
    configurations: list[dict[str, Any]] = []
    averages: list[dict[str, Any]] = []
    variants = []
    for run in study.variants:
        variants.append(run.to_dict() | ({"bundle_missing": True} if run.bundle_missing else {}))
        if run.summary is None:
            continue
        tag = {"variant": run.label, "variant_index": run.index, "settings": run.settings}
        configurations += [{**tag, **record} for record in run.summary["configurations"]]
        averages += [{**tag, **record} for record in run.summary["averages"]]
    return {
        "schema_version": STUDY_SCHEMA,
        "units": "GB/s = 1e9 bytes/s; emulated unless under 'real' (emulated / emulation_scale)",
        "study": study.name,
        "axes": study.document.get("axes", []),
        "variants": variants,
        "configurations": configurations,
        "averages": averages,
        "verdicts": study.document.get("verdicts", []),
    }


def average_real(run: VariantRun, metric: str = "busbw") -> dict[tuple[str, str, str], float]:
    """(policy, collective, algorithm) -> nccl-tests' average of ``metric`` (busbw or
    algbw) over the sizes, at real speed (GB/s)."""
    averages = {}
    for group, members in grouped(run.results).items():
        if metric == "busbw":
            value = average_busbw([m.row for m in members])
        else:
            finite = [m.row.algbw for m in members if not math.isnan(m.row.algbw)]
            value = sum(finite) / len(finite) if finite else math.nan
        averages[group] = value / run.scale
    return averages


def study_table(study: StudyBundle) -> list[str]:
    """The variants side by side, per collective: each policy's average real-speed busbw,
    and (with several variants) its ratio to the first variant's under the same policy."""
    collectives: list[tuple[str, str]] = []
    policies: list[str] = []
    for run in study.variants:
        for policy, op, algorithm in average_real(run):
            if (op, algorithm) not in collectives:
                collectives.append((op, algorithm))
            if policy not in policies:
                policies.append(policy)
    several = len(study.variants) > 1
    width = max([len(run.label) for run in study.variants] + [7])
    lines = [
        '# average bus bandwidth at real link speed (GB/s; nccl-tests\' "Avg bus bandwidth" '
        "over the sizes)" + (", (x) = ratio to the first variant's" if several else ""),
    ]
    reference = average_real(study.variants[0]) if study.variants else {}
    column = 20 if several else 12
    for op, algorithm in collectives:
        lines += ["#", f"# {op} ({algorithm})"]
        lines.append(
            f"#  {'variant':<{width}}"
            + "".join(f"  {policy:>{column}}" for policy in policies)
            + "  status"
        )
        for run in study.variants:
            averages = average_real(run)
            cells = []
            for policy in policies:
                value = averages.get((policy, op, algorithm), math.nan)
                first = reference.get((policy, op, algorithm), math.nan)
                cell = _fmt(value, "8.2f")
                if several:
                    ratio = value / first if first and not math.isnan(first) else math.nan
                    cell += f" ({_fmt(ratio, '.3f')})"
                cells.append(f"  {cell:>{column}}")
            lines.append(f"   {run.label:<{width}}" + "".join(cells) + f"  {run.shown}")
    return lines


def workload_records(study: StudyBundle, run: VariantRun) -> dict[str, dict[str, Any]]:
    """A variant's workload replays per policy (its bundle's workload.json), or none."""
    document = read_workload(study.path / run.directory)
    policies = document.get("policies", {}) if document is not None else {}
    return policies if isinstance(policies, dict) else {}


def workload_table(study: StudyBundle) -> list[str]:
    """A workload study's variants side by side: each policy's iteration time at real
    speed, replayed (and forecast), with the ratio to the first variant's."""
    records = {run.index: workload_records(study, run) for run in study.variants}
    policies = list(dict.fromkeys(p for r in records.values() for p in r))
    if not policies:
        return []
    width = max([len(run.label) for run in study.variants] + [7])
    first = records[study.variants[0].index]
    lines = [
        "#",
        "# training iteration at real speed, ms: replayed (forecast) [ratio to the first "
        "variant's, replayed]",
        f"#  {'variant':<{width}}" + "".join(f"  {p:>28}" for p in policies) + "  status",
    ]
    for run in study.variants:
        cells = []
        for policy in policies:
            record = records[run.index].get(policy)
            if record is None:
                cells.append(f"  {'-':>28}")
                continue
            forecast = record.get("forecast") or {}
            base = first.get(policy, {}).get("real_ms", math.nan)
            cell = (
                f"{record['real_ms']:.3f} ({_fmt(forecast.get('real_ms', math.nan), '.3f')}) "
                f"[{_fmt(record['real_ms'] / base if base else math.nan, '.3f')}]"
            )
            cells.append(f"  {cell:>28}")
        lines.append(f"   {run.label:<{width}}" + "".join(cells) + f"  {run.shown}")
    return lines


def report_lines(study: StudyBundle) -> list[str]:
    """report.txt: the question, the variants' table, what was expected and the verdicts."""
    doc = study.document
    lines = [f"# study {study.name} ({study.path})"]
    if doc.get("question"):
        lines.append(f"# question: {doc['question']}")
    axes = ", ".join(doc.get("axes", [])) or "nothing"
    lines.append(f"# {len(study.variants)} variants ({doc.get('mode', 'product')} over {axes})")
    for run in study.variants:
        ended = run.shown if not run.error else f"{run.shown}: {run.error}"
        lines.append(f"#   {run.index + 1:>2}. {run.label}  [{ended}]  {run.directory}")
    lines += study_table(study) + workload_table(study)
    if doc.get("expected"):
        lines += ["#", f"# expected: {doc['expected']}"]
    verdicts = doc.get("verdicts", [])
    if verdicts:
        lines.append("#")
        for verdict in verdicts:
            lines.append(f"# verdict: {verdict['verdict']}: {verdict['check']}: {verdict['text']}")
        lines.append(f"# study verdict: {doc.get('verdict', 'unmeasured')}")
    return lines


def _fmt(value: float, spec: str) -> str:
    width = spec.split(".")[0]
    return f"{'-':>{width}}" if math.isnan(value) else format(value, spec)
