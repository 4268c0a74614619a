"""``astral run STUDY.yaml``: every variant of a study, each fabric brought up once, into one
study bundle (orchestrator.study.bundle has its layout).

::

    study = load_study(path)                        # every variant validated (exit 2)
    outcome = StudyRunner(study, RunOptions(), text=path.read_text()).run()
    outcome.bundle                                  # results/<timestamp>-<study>/

What :meth:`StudyRunner.run` does, in order:

1. an ``--out`` that is neither new nor an empty directory refuses the study (exit 2);
   then the load guard judges every variant before anything starts (one calibration, the
   machine's): a variant above the emulator's safe share refuses the whole study, naming
   it, unless forced; nothing is created;
2. per fabric (variants grouped by the fabric they emulate, in order of first appearance,
   StudySpec.by_fabric): brings it up once, runs each of its variants on it with the
   experiment runner (orchestrator.run.runner.Runner on the given testbed: its policies,
   faults, monitor, forecasts and bundle as for any run, the bundle under
   ``variants/NN-<label>/``), and tears it down; one progress bar with an ETA spans the
   whole study;
3. a variant that fails (a worker that hangs because its GPUs were cut off, #wrong > 0) is
   recorded and the study goes on with the next; a Ctrl-C or SIGTERM ends the study there
   (the fabric torn down, the study bundle written with what was measured);
4. judges the study's checks on the measured figures, writes study.json and renders the
   study's summary.json, report.txt and plots, and prints the study table and verdicts.

Exit status: 0 when every variant completed or ended as a ``completes: false`` check
expected; otherwise the first unexpected variant's status (4 a worker failed, 7 wrong
data); 130/143 interrupted; 2 a bad study or a refused load (nothing created); 5 another
run holds the lock.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from orchestrator.calibration.capacity import Calibration
from orchestrator.cluster.emulation import cluster_of
from orchestrator.emulation.network import Terminated
from orchestrator.emulation.recipe import packet_scale_of
from orchestrator.results.store import _write_json
from orchestrator.run.interrupts import noted_interrupts
from orchestrator.run.loadguard import LoadVerdict, ensure_calibration, load_guard
from orchestrator.run.runner import (
    Messages,
    Runner,
    RunOptions,
    RunOutcome,
    Say,
    bundle_directory,
    quick_calibration,
    software_versions,
)
from orchestrator.study.bundle import (
    STUDY_FILE,
    STUDY_SCHEMA,
    STUDY_TEXT,
    VARIANTS,
    VariantRun,
)
from orchestrator.study.checks import Verdict
from orchestrator.study.progress import StudyProgress
from orchestrator.study.report import render_study
from orchestrator.study.spec import StudySpec, Variant
from orchestrator.testbed.testbed import Testbed
from topologies.errors import AstralError, ConfigError, ExperimentError


@dataclass
class StudyOutcome:
    """How a study ended: ``status`` ok (every variant ran), failed (a variant ended
    unexpectedly) or interrupted; each variant's run; the verdicts."""

    study: StudySpec
    bundle: Path | None = None
    status: str = "running"
    exit_status: int = 0
    runs: list[RunOutcome | None] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # what stopped the study before its variants ran

    @property
    def verdict(self) -> str:
        """agrees when every check agrees; disagrees when any disagrees; else unmeasured."""
        outcomes = {v.outcome for v in self.verdicts}
        if not outcomes:
            return "no checks"
        if "disagrees" in outcomes:
            return "disagrees"
        return "agrees" if outcomes == {"agrees"} else "unmeasured"


def variant_text(study: StudySpec, variant: Variant) -> str:
    """The variant as an experiment file, its bundle's experiment.yaml: re-runnable alone,
    from wherever the bundle lies (its fabric and workload files are inlined)."""
    return (
        f"# variant {variant.index + 1} of study {study.name} ({study.source}): "
        f"{variant.label}\n" + yaml.safe_dump(dict(variant.document), sort_keys=False)
    )


@dataclass(frozen=True)
class _Figures:
    """A variant's run as the checks read it."""

    status: str
    results: Sequence[Any]
    scale: float


class StudyRunner(Messages):
    """Runs a study (see the module docstring)."""

    def __init__(
        self,
        study: StudySpec,
        options: RunOptions | None = None,
        *,
        text: str | None = None,
        out: TextIO | None = None,
        say: Say | None = None,
        command: Sequence[str] = (),
        calibrate: Callable[[], Any] | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        self.study = study
        self.options = options or RunOptions()
        self.text = text
        self.out = out or sys.stdout
        self._say = say
        self.command = list(command)
        self._calibrate = calibrate
        # the capacity each variant's load is judged against (None: this machine's file)
        self.calibration = calibration
        self.progress: StudyProgress | None = None

    def bundle_path(self) -> Path:
        return bundle_directory(self.options, self.study.name)

    def check_bundle_path(self) -> Path:
        """The study bundle's directory, refused (exit 2) unless it is new or empty: a run
        accepts an empty ``--out`` and so does a study, but one that holds anything would
        mix another bundle's files with the study's. Judged before the load guard, so
        nothing is calibrated, brought up or created for a study that cannot be written."""
        path = self.bundle_path()
        if path.exists() and not path.is_dir():
            found = f"{path}, a file"
        elif path.is_dir() and any(path.iterdir()):
            found = f"{path}, a directory that is not empty"
        else:
            return path
        raise ConfigError(
            "command line" if self.options.out is not None else self.study.source,
            "--out" if self.options.out is not None else "name",
            "a new or empty directory for the study bundle",
            found,
        )

    # -- the study ------------------------------------------------------------------------

    def judge_loads(self) -> list[LoadVerdict]:
        """Every variant's load verdict, before anything starts; a refused one raises."""
        calibration = self.calibration
        if calibration is None and self.options.calibrate:
            calibration = ensure_calibration(
                self._quick_calibration, say=self.say, packet_scale=self._packet_scale()
            )
        verdicts = []
        for variant in self.study.variants:
            verdict = load_guard(variant.spec, force=self.options.force, calibration=calibration)
            if verdict.refused:
                err = verdict.error()
                raise ExperimentError(
                    self.study.source,
                    err.key,
                    err.expected,
                    err.found,
                    detail=f"variant {variant.index + 1} ({variant.label})",
                )
            for line in verdict.lines():
                self.say(f"variant {variant.index + 1} ({variant.label}): {line}")
            verdicts.append(verdict)
        return verdicts

    def run(self) -> StudyOutcome:
        """Run every variant (see the module docstring)."""
        study = self.study
        outcome = StudyOutcome(study)
        began = time.monotonic()
        path = self.check_bundle_path()
        verdicts = self.judge_loads()
        path.mkdir(parents=True, exist_ok=True)
        outcome.bundle = path
        if self.text is not None:
            (path / STUDY_TEXT).write_text(self.text, encoding="utf-8")
        outcome.runs = [None] * len(study.variants)
        records = [
            VariantRun(v.index, v.label, dict(v.settings), f"{VARIANTS}/{v.slug}")
            for v in study.variants
        ]
        document = self._document(records, verdicts, started=time.time())
        _write_json(path / STUDY_FILE, document)  # a study killed midway is still readable
        self.say(
            f"study {study.name}: {len(study.variants)} variants on "
            f"{len(study.by_fabric())} fabric bring-ups; bundle {path}"
        )
        self.progress = StudyProgress(study.variants, self.options.progress)
        bring_ups: list[dict[str, Any]] = []
        outcome.timings["bring_ups"] = bring_ups
        with noted_interrupts():
            try:
                for group in study.by_fabric():
                    self._run_group(group, outcome, records, bring_ups)
                    if outcome.status == "interrupted":
                        break
            except (KeyboardInterrupt, Terminated) as interruption:
                outcome.status = "interrupted"
                outcome.exit_status = (
                    interruption.exit_status if isinstance(interruption, Terminated) else 130
                )
            except AstralError as error:  # a fabric that did not come up, another run's lock
                outcome.status = "failed"
                outcome.exit_status = error.exit_status
                outcome.error = str(error)
                self.say(f"study stopped: {error}")
            finally:
                self.progress.close()
                self.progress = None
        outcome.timings["total"] = round(time.monotonic() - began, 3)
        self._finish(outcome, records, document)
        return outcome

    def _run_group(
        self,
        group: list[Variant],
        outcome: StudyOutcome,
        records: list[VariantRun],
        bring_ups: list[dict[str, Any]],
    ) -> None:
        """One fabric: up once, its variants run on it, down."""
        assert outcome.bundle is not None and self.progress is not None
        first = group[0].spec
        testbed = Testbed(
            first.fabric,
            policy=first.policies[0],
            state_base=self.options.state_base,
            ready_timeout=self.options.ready_timeout,
            log=self.say,
            lock_wait=self.options.lock_wait,
            # a study's `cluster:` spreads each of its fabrics the same way (docs/cluster.md)
            cluster=cluster_of(first.cluster) if first.cluster else None,
        )
        self.say(f"bringing up fabric {first.fabric.name} for {len(group)} variant(s)")
        timing: dict[str, Any] = {"fabric": first.fabric.name, "variants": [v.index for v in group]}
        bring_ups.append(timing)
        try:
            testbed.start()
            timing["bring_up"] = round(testbed.emulation.timings.get("total", 0.0), 3)
            for variant in group:
                run = self._run_variant(variant, testbed, outcome.bundle)
                outcome.runs[variant.index] = run
                record = records[variant.index]
                record.status, record.exit_status, record.error = (
                    run.status,
                    run.exit_status,
                    run.error,
                )
                if run.status == "interrupted":
                    outcome.status = "interrupted"
                    outcome.exit_status = run.exit_status
                    return
        finally:
            report = testbed.emulation.stop()
            timing["teardown"] = round(testbed.emulation.timings.get("teardown", 0.0), 3)
            if report.errors:
                self.say("teardown problems: " + "; ".join(report.errors[:4]))

    def _run_variant(self, variant: Variant, testbed: Testbed, bundle: Path) -> RunOutcome:
        assert self.progress is not None
        self.say(f"variant {variant.index + 1}/{len(self.study.variants)}: {variant.label}")
        options = replace(
            self.options, out=bundle / VARIANTS / variant.slug, calibrate=False, progress=False
        )
        text = variant_text(self.study, variant)
        runner = Runner(
            variant.spec,
            options,
            text=text,
            out=self.out,
            say=self._say,
            command=self.command,
            progress=self.progress.view(variant),
        )
        self.emit(f"# === variant {variant.index + 1}/{len(self.study.variants)}: {variant.label}")
        try:
            return runner.run(testbed)
        except AstralError as error:  # a variant that could not start (its load, its policy)
            failed = RunOutcome(variant.spec, status="failed", error=str(error))
            failed.exit_status = error.exit_status
            return failed

    # -- the study bundle -------------------------------------------------------------------

    def _document(
        self, records: list[VariantRun], verdicts: list[LoadVerdict], *, started: float
    ) -> dict[str, Any]:
        study = self.study
        versions = software_versions()
        return {
            "schema_version": STUDY_SCHEMA,
            "name": study.name,
            "source": study.source,
            "description": study.description,
            "question": study.question,
            "expected": study.expected,
            "mode": study.mode,
            "axes": list(study.axes),
            "plot": dict(study.plot) if study.plot else None,
            "command": self.command,
            "started": started,
            "status": "running",
            "versions": {"python": versions.python, "ovs": versions.ovs},
            "load_guard": [verdict.to_dict() for verdict in verdicts],
            "variants": [record.to_dict() for record in records],
        }

    def _finish(
        self, outcome: StudyOutcome, records: list[VariantRun], document: dict[str, Any]
    ) -> None:
        assert outcome.bundle is not None
        study = self.study
        figures = [
            _Figures(
                run.status if run else "not run",
                run.results if run else [],
                run.spec.fabric.emulation.scale if run else 1.0,
            )
            for run in outcome.runs
        ]
        outcome.verdicts = [check.judge(study.variants, figures) for check in study.checks]
        if outcome.status == "running":
            outcome.status, outcome.exit_status = self._ending(outcome)
        document.update(
            {
                "status": outcome.status,
                "error": outcome.error,
                "finished": time.time(),
                "timings": outcome.timings,
                "variants": [record.to_dict() for record in records],
                "verdicts": [verdict.to_dict() for verdict in outcome.verdicts],
                "verdict": outcome.verdict,
            }
        )
        _write_json(outcome.bundle / STUDY_FILE, document)
        try:
            _, lines = render_study(
                outcome.bundle, plots=self.options.plots and outcome.status != "interrupted"
            )
        except (AstralError, OSError, ValueError) as error:
            self.say(f"rendering the study failed: {error}")
            return
        for line in lines:
            self.emit(line)

    def _ending(self, outcome: StudyOutcome) -> tuple[str, int]:
        """ok when every variant completed or ended as a completes-false check expected."""
        expected_to_fail = {
            check.of.variant for check in self.study.checks if check.completes is False
        }
        for variant, run in zip(self.study.variants, outcome.runs, strict=True):
            if run is None:
                return "failed", 1
            if run.status != "ok" and variant.index not in expected_to_fail:
                return "failed", run.exit_status or 1
        return "ok", 0

    def _quick_calibration(self) -> Any:
        if self._calibrate is not None:
            return self._calibrate()
        return quick_calibration(self.say, self._packet_scale())

    def _packet_scale(self) -> int:
        """The largest packets of the study's variants (a calibration for them serves all)."""
        return max((packet_scale_of(v.spec.fabric) for v in self.study.variants), default=1)
