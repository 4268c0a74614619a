"""Scripted experiments: build an experiment or a study in Python, run it, read its results.

The same objects ``astral run`` and the pytest plugin use, not a second path: an
experiment is validated by the experiment file's validator (a mistake is the same
ConfigError naming its key), run by the same :class:`~orchestrator.run.runner.Runner` (a
study by :class:`~orchestrator.study.runner.StudyRunner`) into the same bundle, and read
back through the bundle's own summary (summary.json's records)::

    from orchestrator import api

    spec = api.experiment(
        name="mine", fabric="astral-small", policies=["ecmp", "path-pinned"],
        collectives=["all-to-all"], sizes={"min": "256K", "max": "1M", "factor": 4},
        iterations=3, warmup=1, scale=0.6e-4,
    )
    outcome = api.run(spec, out="results/mine")      # root, Open vSwitch: as astral run
    results = api.results(outcome.bundle)
    results.average("path-pinned", "all-to-all")     # real-speed GB/s, nccl-tests' average

    study = api.study(spec_document, sweep={"oversubscription.agg": [1, 15]})
    api.run(study).verdict                            # the study's checks, if it has any

Keys are the experiment file's (``docs/studies.md`` for a study's); a document can be
given whole as the first argument and keyword arguments update it. A fabric may be a
preset's name, a file, or a mapping. Nothing here needs root except :func:`run`.
``examples/`` has two scripts that use it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.results.store import read_workload
from orchestrator.run.experiment import ExperimentSpec, load_experiment, parse_experiment
from orchestrator.run.runner import Runner, RunOptions, RunOutcome
from orchestrator.study.runner import StudyOutcome, StudyRunner
from orchestrator.study.spec import StudySpec, is_study, load_study, parse_study
from topologies.errors import ExperimentError
from topologies.yamlfile import read_yaml

SCRIPT = "<script>"  # where errors say an experiment built in code comes from


def experiment(
    document: Mapping[str, Any] | None = None, /, *, base_dir: str | Path = ".", **keys: Any
) -> ExperimentSpec:
    """An experiment from a document and/or keyword keys, validated as a file would be."""
    return parse_experiment({**(document or {}), **keys}, SCRIPT, base_dir)


def study(
    document: Mapping[str, Any] | None = None, /, *, base_dir: str | Path = ".", **keys: Any
) -> StudySpec:
    """A study (``fabrics``, ``sweep``, ``sweep_mode``, ``study``), every variant validated."""
    return parse_study({**(document or {}), **keys}, SCRIPT, base_dir)


def load(path: str | Path) -> ExperimentSpec | StudySpec:
    """An experiment or study file, whichever it is."""
    if is_study(read_yaml(Path(path), ExperimentError, "experiment")):
        return load_study(path)
    return load_experiment(path)


def run(
    spec: ExperimentSpec | StudySpec,
    *,
    out: str | Path | None = None,
    force: bool = False,
    calibrate: bool = False,
    plots: bool = True,
    monitor: str | None = None,
    verbose: bool = False,
) -> RunOutcome | StudyOutcome:
    """Run it as ``astral run`` does (root and Open vSwitch needed; the run lock taken);
    the bundle goes to ``out`` (default results/<time>-<name>). ``calibrate``: run the
    quick calibration first where the machine has none (``astral run`` does);
    ``verbose``: the status lines and tables on the terminal."""
    options = RunOptions(
        out=Path(out) if out is not None else None,
        force=force,
        calibrate=calibrate,
        plots=plots,
        monitor=monitor,
    )
    say = (lambda message: print(f"astral: {message}", flush=True)) if verbose else None
    quiet = None if verbose else open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
    try:
        if isinstance(spec, StudySpec):
            return StudyRunner(spec, options, say=say, out=quiet).run()
        return Runner(spec, options, say=say, out=quiet).run()
    finally:
        if quiet is not None:
            quiet.close()


@dataclass(frozen=True)
class Results:
    """A bundle's results as summary.json has them: one record per configuration (with
    ``variant`` and ``settings`` for a study), nccl-tests' figures, emulated and real."""

    path: Path
    records: list[dict[str, Any]]
    study: bool

    @property
    def workload(self) -> dict[str, Any] | None:
        """A workload replay's workload.json (per policy the iteration time, tokens/s,
        MFU, exposed communication per kind and timeline, replayed and forecast), or None
        for a run of collectives (docs/workloads.md)."""
        return read_workload(self.path)

    def variants(self) -> list[str]:
        """The study's variants in order (empty for a single run)."""
        return list(dict.fromkeys(r["variant"] for r in self.records)) if self.study else []

    def select(
        self,
        policy: str | None = None,
        collective: str | None = None,
        *,
        variant: str | None = None,
        algorithm: str | None = None,
    ) -> list[dict[str, Any]]:
        """The records that match every key given."""
        wanted = {
            "policy": policy,
            "collective": collective,
            "algorithm": algorithm,
            "variant": variant,
        }
        return [
            r
            for r in self.records
            if all(value is None or r.get(key) == value for key, value in wanted.items())
        ]

    def average(
        self,
        policy: str | None = None,
        collective: str | None = None,
        *,
        variant: str | None = None,
        algorithm: str | None = None,
    ) -> float:
        """nccl-tests' "Avg bus bandwidth" at real speed (GB/s) over the matching records'
        sizes (nan when none matches)."""
        values = [
            r["real"]["busbw_GBps"]
            for r in self.select(policy, collective, variant=variant, algorithm=algorithm)
            if r["real"]["busbw_GBps"] is not None
        ]
        return sum(values) / len(values) if values else math.nan


def results(path: str | Path) -> Results:
    """Read a run's or a study's bundle: the records its summary.json has, computed from
    its database by the same code (nothing is written)."""
    from orchestrator.results.store import ResultsBundle
    from orchestrator.results.summary import summarize, summary_document
    from orchestrator.study.bundle import StudyBundle, is_study_bundle, study_summary

    path = Path(path)
    if is_study_bundle(path):
        return Results(path, study_summary(StudyBundle.open(path))["configurations"], True)
    with ResultsBundle.open(path) as bundle:
        return Results(path, summary_document(bundle, summarize(bundle))["configurations"], False)
