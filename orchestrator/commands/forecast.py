"""``astral forecast [EXPERIMENT.yaml]``: predict every configuration, no root, no emulation.

    astral forecast                          experiments/default.yaml
    astral forecast EXP --json               one record per configuration (summary.json's keys)
    astral forecast EXP --set speeds.nic=400G --set oversubscription.agg=15
                                             what-if: baseline and variant side by side
    astral forecast EXP --fail p0r0t0-p0r0a0 --fail c0
                                             what-if: a link (its two ends) or a switch down
    astral forecast EXP --salts 32           hash draws for ECMP's distribution (default 16)
    astral forecast EXP --paths BUNDLE       with the paths a run's connections took (its
                                             bundle's traced paths) instead of drawing them
    sudo astral forecast --calibrate         measure this machine's per-step figures (a
                                             short real run) and store them
    astral forecast --calibrate-from BUNDLE  the same, fitted on a bundle measured here

Prints, for every policy x collective x size, the nccl-tests table ``astral run`` prints,
with the predicted time, algbw and busbw (emulated and at real speed), then the
side-by-side summary. Where the paths depend on a hash (ECMP, ``host_ports: hash``) the
time is the mean over hash draws and each row names the p10-p90 busbw band. The model and
its limits: docs/forecast.md.

``--paths BUNDLE`` forecasts with the paths the connections of a run took, as its bundle
recorded them (traced through the switches), where it ran the same policy and collective:
a collective whose every connection has a recorded path is forecast once, with no hash
draws. A connection whose path the bundle lacks or only knows part of (trace-dropped,
trace-unknown, first-hop) is routed by the policy, and each table's header says how many
of its connections took a recorded path and why the rest did not. The bundle must have
been measured on the experiment's fabric (the same GPUs and links) with the same ranks on
the same GPUs.

A workload file (docs/workloads.md; it has a ``model``) is forecast as one training
iteration on ``--fabric`` (default astral-small) under ``--policy`` (default path-pinned):
orchestrator/commands/workload_forecast.py.

``--set KEY=VALUE`` takes any experiment key (``sizes.max=16M``, ``policies=[ecmp]``) or
fabric key (``speeds.nic``, ``oversubscription.agg``, ``switch.radix``, ...; a fabric the
experiment names by preset or file is read and changed inline), dotted; values are YAML.
The changed experiment is validated as a file would be: a bad key or value is an error
that names it, and nothing is forecast. A key the model does not use (``faults``,
``monitor``, ``load_limit``, ``cluster``) is such an error too, and a fabric key the
experiment's own would replace (``emulation.scale`` under its ``scale``) takes effect.

``--salts`` takes 1 to 1024 draws; ``--pods`` and ``--size`` need ``--full-size``;
``--calibration FILE`` must exist unless ``--calibrate`` or ``--calibrate-from`` writes it
(``--calibration none``: the bare model, whatever this machine's file); a ``--set`` key may
be given once.

Exit status: 0; 2 a bad experiment, option, ``--set``, ``--fail`` or ``--paths`` (a bundle of
another fabric or placement) or a ``--calibrate-from`` bundle with too few usable
configurations; 3 ``--calibrate`` without root; 6 a ``--paths`` bundle that
cannot be read.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from topologies.errors import ConfigError, EnvironmentProblem


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "forecast",
        help="predict an experiment's results from the fabric model (no root)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("experiment", nargs="?", type=Path, default=None, metavar="EXPERIMENT")
    parser.add_argument("--json", action="store_true", help="one JSON record per configuration")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="what-if: change a key"
    )
    parser.add_argument(
        "--fail", action="append", default=[], metavar="LINK|SWITCH", help="what-if: take down"
    )
    parser.add_argument("--salts", type=int, default=None, metavar="N", help="hash draws")
    parser.add_argument(
        "--paths",
        type=Path,
        default=None,
        metavar="BUNDLE",
        help="forecast with the paths the connections of the run in BUNDLE took",
    )
    parser.add_argument(
        "--calibration", type=Path, default=None, metavar="FILE", help="forecast calibration file"
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine's per-step figures (root; a short real run) and store them",
    )
    parser.add_argument(
        "--calibrate-from",
        type=Path,
        default=None,
        metavar="BUNDLE",
        help="fit the per-step figures on a bundle measured on this machine, and store them",
    )
    parser.add_argument(
        "--full-size",
        action="store_true",
        help="forecast the full-size fabrics of `astral topo plan` (no experiment file), or "
        "a workload on a full-size Astral (or on --fabric) by link class",
    )
    parser.add_argument(
        "--pods",
        type=int,
        default=None,
        help="--full-size: Astral pods (default 8: 524,288 GPUs; a workload's 1: 65,536)",
    )
    parser.add_argument(
        "--size", default=None, help="--full-size: message size (default 1G = 2**30 bytes)"
    )
    parser.add_argument(
        "--fabric",
        default=None,
        metavar="FABRIC",
        help="a workload's fabric: a preset name or a fabric file (default astral-small; "
        "above 4,096 GPUs forecast by link class)",
    )
    parser.add_argument("--policy", default=None, help="a workload's policy (default path-pinned)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.commands import workload_forecast
    from orchestrator.commands.whatif import routed_around, with_settings
    from orchestrator.run.experiment import WORKLOAD_KEY

    check_options(args)
    if workload_forecast.is_workload_file(args.experiment):
        return workload_forecast.run(args, lambda: forecast_calibration(args))

    if args.paths is not None and (args.calibrate or args.full_size or args.calibrate_from):
        raise ConfigError(
            "command line",
            "--paths",
            "an experiment to forecast (not --calibrate, --calibrate-from or --full-size)",
            str(args.paths),
        )
    if args.calibrate:
        return calibrate(args)
    if args.full_size:
        return full_size(args)
    if args.calibrate_from is not None:
        return store(_stamp(fit_bundle(args.calibrate_from, args.salts), None), args)
    base = experiment_document(args.experiment)
    if WORKLOAD_KEY in base.document:  # an experiment that replays a training workload
        return workload_forecast.run_experiment(base, args, lambda: forecast_calibration(args))
    calibration = forecast_calibration(args)
    variant = None
    if args.set or args.fail:  # first: a what-if that is a mistake is said at once
        changed = with_settings(base.document, args.set, base.base_dir)
        with routed_around(args.fail):
            variant = forecast_document(
                Experiment(changed, base.source, base.base_dir), args, failures=args.fail
            )
    baseline = forecast_document(base, args)
    if args.json:
        out: dict[str, Any] = {"configurations": baseline.records()}
        if args.paths is not None:
            out["paths"] = baseline.path_records()
        if variant is not None:
            out["variant"] = {
                "set": args.set,
                "fail": args.fail,
                "configurations": variant.records(),
            }
        print(json.dumps(out, indent=1))
        return 0
    print(f"# {(calibration.describe() if calibration else 'forecast calibration: none')}")
    if baseline.rates:
        print(f"# paths: {args.paths} was measured with {baseline.rates}")
    for text in baseline.tables():
        print(text, end="")
    for line in baseline.summary():
        print(line)
    if variant is not None:
        what = ", ".join([*args.set, *(f"fail {f}" for f in args.fail)])
        print(f"# what-if: {what}")
        if variant.rates:
            print(f"# what-if paths: {args.paths} was measured with {variant.rates}")
        for line in comparison_lines(baseline, variant):
            print(line)
    return 0


#: the most hash draws --salts takes: each draw routes and plays out every configuration
#: again, and the p10-p90 band settles long before (docs/forecast.md; default 16)
MAX_SALTS = 1024


def check_options(args: argparse.Namespace) -> None:
    """Refuse an option that would be ignored or could not be what the user meant, before
    anything is read or forecast: a silently dropped option is a wrong answer."""
    if args.salts is not None and not 1 <= args.salts <= MAX_SALTS:
        raise ConfigError(
            "command line", "--salts", f"a number of hash draws from 1 to {MAX_SALTS}", args.salts
        )
    if not args.full_size:
        for flag, value in (("--pods", args.pods), ("--size", args.size)):
            if value is not None:
                raise ConfigError(
                    "command line", flag, "--full-size with it (it sizes the full-size forecast)",
                    value,
                )  # fmt: skip
    # --calibrate and --calibrate-from write the file; every other use reads it
    writes = args.calibrate or args.calibrate_from is not None
    if writes and _bare(args):
        raise ConfigError(
            "command line", "--calibration", "a file to store the calibration in", "none"
        )
    named = args.calibration is not None and not writes and not _bare(args)
    if named and not args.calibration.is_file():
        raise ConfigError(
            str(args.calibration),
            "--calibration",
            "an existing forecast calibration file (written by `astral forecast "
            "--calibrate` or `--calibrate-from`), or `none` for the bare model",
            "a directory" if args.calibration.is_dir() else "no such file",
        )
    seen: dict[str, str] = {}
    for setting in args.set:
        key = setting.partition("=")[0].strip()
        if key in seen:
            raise ConfigError(
                "--set",
                key,
                "each key set once (a second --set of it would silently replace the first)",
                f"{seen[key]} and {setting}",
            )
        seen[key] = setting


def _bare(args: argparse.Namespace) -> bool:
    """``--calibration none``: the bare model, whatever calibration this machine has."""
    return args.calibration is not None and str(args.calibration) == BARE


#: the --calibration that asks for the bare model (no overheads: docs/forecast.md)
BARE = "none"


def forecast_calibration(args: argparse.Namespace) -> Any:
    """The calibration the forecast uses: ``--calibration FILE`` (checked to exist by
    :func:`check_options`), the machine's default file, or none for ``--calibration none``."""
    from orchestrator.forecast.calibration import load_forecast_calibration

    return None if _bare(args) else load_forecast_calibration(args.calibration)


# --- the experiment, with what-if settings ----------------------------------------------------


class Experiment:
    def __init__(self, document: dict[str, Any], source: str, base_dir: Path) -> None:
        self.document = document
        self.source = source
        self.base_dir = base_dir


def experiment_document(path: Path | None) -> Experiment:
    from orchestrator.run.experiment import check_is_experiment
    from orchestrator.run.runner import DEFAULT_EXPERIMENT
    from topologies.errors import ExperimentError
    from topologies.yamlfile import read_yaml

    where = path or DEFAULT_EXPERIMENT
    document = read_yaml(where, ExperimentError, "experiment")
    if not isinstance(document, dict):
        raise ExperimentError(str(where), "(document)", "a mapping of experiment keys", document)
    # before --set, which would otherwise look for the fabric an experiment names
    check_is_experiment(document, str(where))
    return Experiment(document, str(where), where.parent)


# --- forecasting -----------------------------------------------------------------------------


class ForecastRun:
    """An experiment's forecasts, grouped as ``astral run`` groups its tables; with
    ``--paths``, per forecast how many of its connections took a recorded path."""

    def __init__(
        self,
        spec: Any,
        forecasts: list[Any],
        latency: str | None,
        coverages: Sequence[Any | None] = (),
        rates: str = "",
    ) -> None:
        self.spec = spec
        self.forecasts = forecasts
        self.latency = latency
        self.coverages = list(coverages) or [None] * len(forecasts)
        self.rates = rates  # how a --paths bundle's link rates differ ('' if they do not)

    @property
    def scale(self) -> float:
        return float(self.spec.fabric.emulation.scale)

    def records(self) -> list[dict[str, Any]]:
        from orchestrator.forecast.report import record

        return [record(f, self.scale) for f in self.forecasts]

    def path_records(self) -> list[dict[str, Any]]:
        """Per configuration forecast with ``--paths``, its connections' coverage."""
        return [
            {"policy": c.policy, "collective": c.collective, "algorithm": c.algorithm,
             "size": c.size, **coverage.record()}
            for f, coverage in zip(self.forecasts, self.coverages, strict=True)
            if coverage is not None
            for c in (f.configuration,)
        ]  # fmt: skip

    def path_lines(self, group: tuple[str, str, str]) -> list[str]:
        """A table's header lines on its paths: one when every size took the same share
        of recorded paths, else one per size."""
        found = [
            (f.configuration.size, coverage)
            for f, coverage in zip(self.forecasts, self.coverages, strict=True)
            if coverage is not None and f.configuration.group == group
        ]
        lines = list(dict.fromkeys(coverage.header() for _, coverage in found))
        if len(lines) <= 1:
            return lines
        return [f"size {size}: {coverage.header()}" for size, coverage in found]

    def groups(self) -> dict[tuple[str, str, str], list[Any]]:
        groups: dict[tuple[str, str, str], list[Any]] = {}
        for f in self.forecasts:
            groups.setdefault(f.configuration.group, []).append(f)
        return groups

    def tables(self) -> list[str]:
        from orchestrator.forecast.report import forecast_table

        spec = self.spec
        out = []
        for (policy, op, algorithm), members in self.groups().items():
            head = [
                f"FORECAST {op} ({algorithm}), policy {policy}, host ports {spec.host_ports}, "
                f"{spec.ranks} ranks, fabric {spec.fabric.name} (no emulation: the model, "
                "docs/forecast.md)",
                "time: predicted per operation (mean over hash draws where paths hash)",
                *self.path_lines((policy, op, algorithm)),
            ]
            out.append(forecast_table(members, head, self.scale, self.latency))
        return out

    def averages(self) -> dict[tuple[str, str, str], float]:
        from orchestrator.collectives.nccl import average_busbw

        return {
            group: average_busbw([f.result(self.scale).row for f in members])
            for group, members in self.groups().items()
        }

    def summary(self) -> list[str]:
        spec, scale = self.spec, self.scale
        averages = self.averages()
        width = max(len(c.label) for c in spec.collectives) + 2
        lines = [
            f"# forecast {spec.name!r}: average bus bandwidth, GB/s at real speed (emulated GB/s); "
            f"host ports {spec.host_ports}",
            f"#   {'collective':<{width}}" + "".join(f"{p:>26}" for p in spec.policies),
        ]
        for c in spec.collectives:
            cells = []
            for policy in spec.policies:
                value = averages.get((policy, c.op, c.algorithm), math.nan)
                cell = "-" if math.isnan(value) else f"{value / scale:.2f} ({value:.6f})"
                cells.append(f"{cell:>26}")
            lines.append(f"#   {c.label:<{width}}{''.join(cells)}")
        return lines


def forecast_document(
    experiment: Experiment, args: argparse.Namespace, failures: Sequence[str] = ()
) -> ForecastRun:
    from orchestrator.commands.whatif import parse_failures
    from orchestrator.forecast.configurations import Forecaster
    from orchestrator.forecast.model import DEFAULT_SALTS
    from orchestrator.run.experiment import parse_experiment
    from topologies.description import FabricDescription
    from topologies.latency import latency_record, latency_title

    spec = parse_experiment(experiment.document, experiment.source, experiment.base_dir)
    fabric = spec.fabric_model()
    failed = parse_failures(fabric, failures)
    description = FabricDescription.of(fabric)
    forecaster = Forecaster(
        description,
        spec.gpus,
        host_ports=spec.host_ports,
        calibration=forecast_calibration(args),
        failed=failed,
        salts=args.salts or DEFAULT_SALTS,
        iterations=spec.iterations,
        warmup=spec.warmup,
        paths=args.paths,
        min_batch_s=spec.batch_floor_s,
    )
    steps = list(spec.steps())
    forecasts = forecaster.forecast_all(steps)
    coverages = [
        forecaster.coverage(s.policy, s.collective.op, s.collective.algorithm, s.size)
        for s in steps
    ]
    rates = forecaster.recorded.rates if forecaster.recorded is not None else ""
    return ForecastRun(spec, forecasts, latency_title(latency_record(fabric)), coverages, rates)


def comparison_lines(baseline: ForecastRun, variant: ForecastRun) -> list[str]:
    """Average busbw per policy and collective, baseline and variant, and the ratio."""
    base, other = baseline.averages(), variant.averages()
    lines = [
        "#   policy          collective                 baseline real GB/s   variant real GB/s"
        "   variant/baseline"
    ]
    for key in dict.fromkeys([*base, *other]):
        policy, op, algorithm = key
        value, changed = base.get(key, math.nan), other.get(key, math.nan)
        a, b = value / baseline.scale, changed / variant.scale
        ratio = b / a if math.isfinite(a) and a and math.isfinite(b) else math.nan
        label = f"{op} ({algorithm})"
        lines.append(f"#   {policy:<15} {label:<26} {a:>18.2f} {b:>19.2f} {ratio:>18.3f}")
    return lines


# --- full size ---------------------------------------------------------------------------


def full_size(args: argparse.Namespace) -> int:
    """Astral at one pod and at ``--pods`` pods, then every kind at the GPU count all of
    them reach with the same switches (the planner's comparison), by link class."""
    import resource

    from orchestrator.collectives.sizes import parse_size
    from orchestrator.forecast.aggregate import ALGORITHMS, ScaleModel, scale_table
    from topologies.plan import PlanInput
    from topologies.planner import Unreachable, common_reach, plan_for_gpus, plan_spec

    try:
        size = parse_size(args.size or "1G")
    except ValueError as err:
        raise ConfigError("command line", "--size", str(err), args.size) from err
    pods = 8 if args.pods is None else args.pods
    if pods < 1:
        raise ConfigError("command line", "--pods", "a number of pods >= 1", pods)
    salts = args.salts or 8
    inputs = PlanInput(pods=pods)
    shown = ALGORITHMS[:3]
    predictions = []
    specs = [plan_spec("astral", inputs, pods=1)]
    if pods > 1:
        specs.append(plan_spec("astral", inputs))
    reach = common_reach(inputs)
    for kind in ("astral", "fat-tree", "rail-optimized", "rail-only"):
        planned = plan_for_gpus(kind, reach, inputs)
        if not isinstance(planned, Unreachable):
            specs.append(planned.spec)
    for spec in specs:
        model = ScaleModel(spec)
        for policy in ("path-pinned", "ecmp"):
            for op, algorithm in shown:
                predictions.append(model.forecast(policy, op, algorithm, size, salts=salts))
    print(
        "# full-size forecast at real speed (no emulation; the link-class model, "
        'docs/forecast.md, "Full size"): Astral at 1 and '
        f"{pods} pods, then every kind at {reach:,} GPUs with the same switches"
    )
    for line in scale_table(predictions):
        print(line)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"# peak memory {peak:.0f} MB; 'took' is each forecast's own time")
    return 0


# --- calibration -----------------------------------------------------------------------------


def calibrate(args: argparse.Namespace) -> int:
    """Run the calibration experiment on this machine, fit, store (root)."""
    import os
    import tempfile
    import time

    from orchestrator.forecast.calibration import CALIBRATION_EXPERIMENT
    from orchestrator.run.experiment import parse_experiment
    from orchestrator.run.runner import Runner, RunOptions

    if os.geteuid() != 0:
        raise EnvironmentProblem(
            "astral forecast --calibrate runs a short emulated experiment: run it as root"
        )
    spec = parse_experiment(copy.deepcopy(CALIBRATION_EXPERIMENT), "forecast calibration", ".")
    with tempfile.TemporaryDirectory(prefix="astral-forecast-") as tmp:
        out = Path(tmp) / "bundle"
        say = lambda m: print(f"astral: {m}", file=sys.stderr)  # noqa: E731
        outcome = Runner(
            spec,
            RunOptions(out=out, progress=False, plots=False, lock_wait=1800.0),
            text=yaml.safe_dump(CALIBRATION_EXPERIMENT),
            out=sys.stderr,
            say=say,
        ).run()
        if outcome.exit_status:
            print(f"astral forecast: the calibration run failed: {outcome.error}", file=sys.stderr)
            return int(outcome.exit_status)
        calibration = fit_bundle(out, args.salts)
    return store(_stamp(calibration, time.time()), args)


def store(calibration: Any, args: argparse.Namespace) -> int:
    from orchestrator.forecast.calibration import save_forecast_calibration

    path = save_forecast_calibration(calibration, args.calibration)
    print(calibration.describe())
    print(f"stored in {path}")
    return 0


#: the fewest measured cells a fit takes (four figures and two overheads on a grid)
MIN_FIT_CELLS = 3


def fit_bundle(bundle: Path, salts: int | None = None) -> Any:
    """The calibration fitted on a bundle's deterministic-path configurations: the
    play-out's figures, and the step model's overlap with them."""
    from dataclasses import replace
    from functools import partial

    from orchestrator.collectives.plans import element_count
    from orchestrator.forecast.calibration import INCASTS, Cell, fit_played
    from orchestrator.forecast.model import ConfigurationModel
    from orchestrator.forecast.schedule import schedule
    from orchestrator.results.store import ResultsBundle
    from orchestrator.results.summary import summarize
    from orchestrator.worker.spec import workers_from_description
    from topologies.description import FabricDescription

    with ResultsBundle.open(bundle) as opened:
        description = FabricDescription.from_dict(opened.fabric)
        results = summarize(opened)
    hosts = _placement(bundle, description)
    workers = workers_from_description(description, hosts)
    cells = []
    models: dict[str, ConfigurationModel] = {}
    hashed = unmeasured = 0
    for r in results:
        c = r.configuration
        model = models.setdefault(
            c.host_ports,
            ConfigurationModel(description, workers, host_ports=c.host_ports, salts=salts or 1),
        )
        router = model.router(c.policy)
        if router.hashed or c.host_ports == "hash":
            hashed += 1
            continue  # a hash decided its paths: no single model time to fit against
        if not (math.isfinite(r.row.time_us) and r.row.time_us > 0):
            unmeasured += 1
            continue  # never measured (an interrupted run, a failed configuration)
        parts = {
            incast: model.parts(c.policy, c.collective, c.algorithm, c.size, 0, incast)
            for incast in INCASTS
        }
        count = element_count(c.collective, c.size, model.layout.size)
        steps = sum(s.repeat for s in schedule(model.layout, c.collective, c.algorithm, count))
        play = partial(
            model.play, c.policy, c.collective, c.algorithm, c.size, 0, iterations=c.iterations
        )
        incast = model.converging(c.policy, c.collective, c.algorithm)
        cells.append(Cell(r.row.time_us / 1e6, parts, play, steps, incast))
    if len(cells) < MIN_FIT_CELLS:  # the fit's own check would be a bare ValueError
        raise ConfigError(
            str(bundle),
            "--calibrate-from",
            f"a bundle with at least {MIN_FIT_CELLS} collective configurations measured on "
            "paths no hash decides (a completed `astral run` of collectives under "
            "path-pinned or another deterministic policy, host_ports not 'hash'; "
            "the calibration experiment: `astral forecast --calibrate`)",
            f"{len(cells)} usable of {len(results)} configurations ({hashed} on hashed "
            f"paths, {unmeasured} not measured)",
        )
    calibration = fit_played(cells)
    return replace(calibration, source=str(bundle), fabric=description.fabric.name)


def _placement(bundle: Path, description: Any) -> list[str]:
    """The GPUs a bundle's ranks played, from its experiment file (default: all)."""
    from orchestrator.run.experiment import load_experiment

    try:
        return list(load_experiment(bundle / "experiment.yaml").gpus)
    except Exception:  # an experiment that no longer loads: every GPU, in rank order
        return [g.name for g in description.fabric.gpus_by_rank()]


def _stamp(calibration: Any, when: float | None) -> Any:
    import os
    import time
    from dataclasses import replace
    from datetime import datetime, timezone

    when = time.time() if when is None else when
    return replace(
        calibration,
        measured_at=datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        conditions={"cpus": os.cpu_count(), "loadavg": list(os.getloadavg())},
    )
