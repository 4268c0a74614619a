"""``astral forecast WORKLOAD.yaml --fabric F``: one training iteration predicted without
emulation, with what-ifs (docs/workloads.md).

The workload's iteration is compiled into the program the workers would replay
(orchestrator/workload/iteration.py) and played slot by slot with each operation's
forecast time (orchestrator/forecast/program.py). Printed: the iteration time, emulated
and at real speed, the compute floor, tokens per second and MFU at real speed, and the
exposed communication per kind on the rank that ends last. ``--set KEY=VALUE`` changes a
fabric key (``speeds.nic=400G``, ``oversubscription.agg=15``, ``scale=1e-4``) and ``--fail
LINK|SWITCH`` takes a link or switch down: the baseline and the variant side by side with
the ratio.

Fabrics of up to :data:`MAX_GPUS` GPUs are forecast flow by flow, every rank of the program.
Above it, and with ``--full-size`` (``astral forecast WORKLOAD.yaml --full-size [--pods N]``:
the planned Astral of N pods, 65,536 GPUs each, or the ``--fabric`` given), the
iteration is forecast by link class (orchestrator/forecast/fullsize.py): representative
data-parallel replicas played, each group's op from the aggregated model, no fabric graph
built, at real speed (no emulation scale, so no ``--set scale``; no ``--fail``: a class's
links are all alike).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topologies.errors import ConfigError

if TYPE_CHECKING:
    from orchestrator.forecast.calibration import ForecastCalibration
    from orchestrator.forecast.program import ProgramForecast
    from orchestrator.run.experiment import ExperimentSpec
    from orchestrator.workload.spec import WorkloadSpec
    from topologies.fabricspec import FabricSpec

#: flow by flow up to this many GPUs; above, by link class. Measured (docs/workloads.md):
#: 64 GPUs flow by flow 2-3.5 s; 256 GPUs under path pinning grew past 6 GB of memory
MAX_GPUS = 128
DEFAULT_FABRIC = "astral-small"
#: the policies the link-class model knows (orchestrator/forecast/aggregate.py)
CLASS_POLICIES = ("path-pinned", "ecmp")


def is_workload_file(path: Path | None) -> bool:
    """Whether ``path`` is a workload (it has a ``model``), not an experiment."""
    from topologies.errors import WorkloadError
    from topologies.yamlfile import read_yaml

    if path is None or not path.is_file():
        return False
    document = read_yaml(path, WorkloadError, "workload")
    return isinstance(document, dict) and "model" in document and "collectives" not in document


@dataclass(frozen=True)
class IterationForecast:
    """One forecast iteration and what the table prints of it."""

    workload: str
    fabric: str
    gpus: int
    policy: str
    scale: float | None  # the emulation's; None: by link class, at real speed
    seconds: float  # emulated (real by link class)
    floor: float  # the busiest rank's compute, in the same seconds
    tokens_per_s: float
    mfu: float
    exposed: dict[str, float]  # in the same seconds
    ranks_played: int = 0
    shapes: dict[str, int] = field(default_factory=dict)  # by link class: shapes per kind
    took_s: float = 0.0  # by link class: the forecast's wall time

    @property
    def by_class(self) -> bool:
        return self.scale is None

    @property
    def real_ms(self) -> float:
        return self.seconds * (self.scale or 1.0) * 1e3

    def to_dict(self) -> dict[str, Any]:
        out = {
            "workload": self.workload,
            "fabric": self.fabric,
            "gpus": self.gpus,
            "policy": self.policy,
            "model": "link classes, real speed" if self.by_class else "flow by flow",
            "emulation_scale": self.scale,
            "iteration_s": self.seconds,
            "iteration_real_ms": self.real_ms,
            "compute_floor_s": self.floor,
            "tokens_per_s_real": self.tokens_per_s,
            "mfu": self.mfu,
            "exposed_s_last_rank": self.exposed,
            "ranks_played": self.ranks_played,
        }
        if self.by_class:
            out.update(group_shapes=self.shapes, took_s=self.took_s)
        return out


def forecast_iteration(
    path: Path,
    fabric_ref: str | None,
    policy: str,
    settings: Sequence[str] = (),
    failures: Sequence[str] = (),
    *,
    full_size: bool = False,
    pods: int | None = None,
    calibration: ForecastCalibration | None = None,
) -> IterationForecast:
    """The forecast of one iteration of the workload at ``path`` on fabric ``fabric_ref``
    (default astral-small), flow by flow; by link class at real speed on a fabric above
    :data:`MAX_GPUS`, with ``full_size`` (on ``fabric_ref``, or else the planned Astral of
    ``pods`` pods, default 1: 65,536 GPUs).

    ``calibration`` is the one flow by flow uses, as the command chose it (``--calibration``:
    :func:`orchestrator.commands.forecast.forecast_calibration`); None is the bare model. The
    link-class model takes none (its table says so)."""
    from orchestrator.run.overrides import is_fabric_key
    from topologies.planner import plan

    for setting in settings:
        key = setting.partition("=")[0].strip()
        if not (is_fabric_key(key) or key == "scale"):
            raise ConfigError(
                "--set", key, "a fabric key (speeds.nic, oversubscription.agg, ...) or scale", key
            )
    if pods is not None and (not full_size or fabric_ref is not None):
        raise ConfigError(
            "command line", "--pods", "--full-size without --fabric (the planned Astral)", pods
        )
    spec, document = _fabric_spec(fabric_ref, settings, full_size, pods)
    if full_size or plan(spec).gpus > MAX_GPUS:
        if "scale" in document:
            raise ConfigError(
                "--set",
                "scale",
                "a fabric key: the full-size forecast is at real speed, with no emulation",
                document["scale"],
            )
        if failures:
            raise ConfigError(
                "--fail",
                failures[0],
                "no --fail by link class: every link of a class is taken alike there",
                failures[0],
            )
        return _by_class(path, spec, policy)
    if "scale" in document:  # an experiment key: the fabric's emulation scale
        from dataclasses import replace

        from topologies.fabricspec import EmulationSpec

        spec = replace(spec, emulation=EmulationSpec(scale=float(document["scale"])))
    return _by_flow(path, spec, policy, failures, calibration)


def _fabric_spec(
    fabric_ref: str | None, settings: Sequence[str], full_size: bool, pods: int | None
) -> tuple[FabricSpec, dict[str, Any]]:
    """The fabric spec with the settings applied, and the document they were applied to
    (its ``scale`` key, if set, is the emulation's)."""
    from orchestrator.commands.whatif import with_settings
    from topologies.spec import parse_fabric_spec

    if fabric_ref is None and full_size:
        from topologies.plan import PlanInput
        from topologies.planner import SOURCE, plan_document

        count = 1 if pods is None else pods
        if count < 1:
            raise ConfigError("command line", "--pods", "a number of pods >= 1", count)
        planned = plan_document("astral", PlanInput(pods=count), pods=count)
        document = with_settings({"fabric": planned}, settings, Path.cwd())
        spec = parse_fabric_spec(document["fabric"], f"{SOURCE} (--full-size)")
        from topologies.generators import default_registry

        default_registry().get(spec.kind, spec.source).check(spec)
        return spec, document
    document = with_settings({"fabric": fabric_ref or DEFAULT_FABRIC}, settings, Path.cwd())
    fabric_doc = document["fabric"]
    if isinstance(fabric_doc, str):
        from topologies.catalog import resolve_fabric
        from topologies.spec import load_fabric_spec

        return load_fabric_spec(resolve_fabric(fabric_doc, Path.cwd())), document
    return parse_fabric_spec(fabric_doc, "--fabric"), document


def _by_flow(
    path: Path,
    spec: FabricSpec,
    policy: str,
    failures: Sequence[str],
    calibration: ForecastCalibration | None,
) -> IterationForecast:
    """Every rank of the program, each group's op forecast flow by flow (emulated)."""
    from orchestrator.commands.whatif import parse_failures, routed_around
    from orchestrator.forecast.program import ProgramForecaster
    from orchestrator.workload.iteration import iteration_program
    from orchestrator.workload.spec import load_workload
    from topologies.description import FabricDescription
    from topologies.generators import build_fabric

    fabric = build_fabric(spec)
    gpus = [g.name for g in fabric.gpus_by_rank()]
    workload = load_workload(
        path, gpus=len(gpus), gpus_per_server=spec.gpus_per_server, scale=spec.emulation.scale
    )
    program = iteration_program(workload, spec.emulation.scale)
    description = FabricDescription.of(fabric)
    forecaster = ProgramForecaster(
        description,
        gpus,
        policy=policy,
        calibration=calibration,
        failed=parse_failures(fabric, failures),
    )
    with routed_around(failures):
        predicted = forecaster.forecast(program)
    return _iteration(workload, spec, policy, predicted, spec.emulation.scale)


def _by_class(path: Path, spec: FabricSpec, policy: str) -> IterationForecast:
    """Representative ranks, each group's op by link class, at real speed
    (orchestrator/forecast/fullsize.py)."""
    import time

    from orchestrator.forecast.aggregate import ScaleModel, Unsupported
    from orchestrator.forecast.fullsize import FullSizeForecaster
    from orchestrator.workload.spec import load_workload
    from topologies.planner import plan

    began = time.monotonic()
    if policy not in CLASS_POLICIES:
        raise ConfigError(
            "--policy", policy, f"one of {', '.join(CLASS_POLICIES)} by link class", policy
        )
    gpus = plan(spec).gpus
    workload = load_workload(path, gpus=gpus, gpus_per_server=spec.gpus_per_server)
    try:
        model = ScaleModel(spec)
        played = FullSizeForecaster(model, workload, policy=policy).forecast()
    except Unsupported as err:
        raise ConfigError(
            "--fabric", spec.name, "a fabric the link-class model knows", str(err)
        ) from None
    return replace(
        _iteration(workload, spec, policy, played.played, None),
        ranks_played=played.ranks,
        shapes=played.shapes,
        took_s=time.monotonic() - began,
    )


def _iteration(
    workload: WorkloadSpec,
    spec: FabricSpec,
    policy: str,
    predicted: ProgramForecast,
    scale: float | None,
) -> IterationForecast:
    from orchestrator.workload import costs

    real = predicted.seconds * (scale or 1.0)
    tokens = workload.batch.global_batch * workload.model.seq_len
    peak = workload.gpus * workload.gpu.peak_flops
    return IterationForecast(
        workload=workload.name,
        fabric=spec.name,
        gpus=workload.gpus,
        policy=policy,
        scale=scale,
        seconds=predicted.seconds,
        floor=max(predicted.compute),
        tokens_per_s=tokens / real,
        mfu=costs.model_flops_per_iteration(workload) / (peak * real),
        exposed=predicted.exposed[predicted.last_rank],
        ranks_played=len(predicted.ends),
    )


def run(args: argparse.Namespace, calibration_of: Callable[[], Any]) -> int:
    """The command (called by ``astral forecast`` for a workload file); its
    ``--calibration`` is read as for an experiment, by ``calibration_of`` (``forecast``'s
    own helper, passed in: this module is below that one), once the options are checked
    and only where flow by flow uses it (the link-class model of ``--full-size`` takes
    none). The options that measure or fit one are refused, since a workload file is
    neither."""
    if args.paths is not None or args.calibrate or args.calibrate_from is not None:
        raise ConfigError(
            "command line",
            "--paths/--calibrate/--calibrate-from",
            "none of them with a workload (--fabric, --full-size, --pods, --policy, --set, "
            "--fail, --calibration, --json)",
            str(args.experiment),
        )
    policy = args.policy or "path-pinned"
    calibration = None if args.full_size else calibration_of()
    where = {"full_size": args.full_size, "pods": args.pods, "calibration": calibration}
    baseline = forecast_iteration(args.experiment, args.fabric, policy, **where)
    variant = None
    if args.set or args.fail:
        variant = forecast_iteration(
            args.experiment, args.fabric, policy, args.set, args.fail, **where
        )
    if args.json:
        out: dict[str, Any] = {"iteration": baseline.to_dict()}
        if variant is not None:
            out["variant"] = {"set": args.set, "fail": args.fail, "iteration": variant.to_dict()}
        print(json.dumps(out, indent=1))
        return 0
    rows = [("baseline", baseline)]
    if variant is not None:
        rows.append((", ".join([*args.set, *(f"fail {f}" for f in args.fail)]), variant))
    lines = _by_class_table(rows) if baseline.by_class else _by_flow_table(rows, calibration)
    for line in lines:
        print(line)
    if variant is not None:
        print(f"# variant / baseline iteration time: {variant.seconds / baseline.seconds:.3f}")
    return 0


def run_experiment(
    experiment: Any, args: argparse.Namespace, calibration_of: Callable[[], Any]
) -> int:
    """``astral forecast EXPERIMENT.yaml`` for an experiment that replays a workload: its
    iteration forecast on the experiment's fabric, placement and scale, one row per policy
    (what ``astral run`` prints beside each replay), with ``--set``/``--fail`` what-ifs,
    with the calibration ``calibration_of`` reads (as :func:`run` takes it)."""
    from orchestrator.commands.whatif import with_settings
    from orchestrator.run.experiment import parse_experiment

    if args.paths is not None or args.full_size or args.fabric or args.policy:
        raise ConfigError(
            "command line",
            "--paths/--full-size/--fabric/--policy",
            "none of them with an experiment (its fabric and policies are its own; --set "
            "and --fail change them)",
            str(args.experiment),
        )
    calibration = calibration_of()
    spec = parse_experiment(experiment.document, experiment.source, experiment.base_dir)
    rows = [
        (policy, _experiment_iteration(spec, policy, (), calibration)) for policy in spec.policies
    ]
    if args.set or args.fail:
        changed = with_settings(experiment.document, args.set, experiment.base_dir)
        variant = parse_experiment(changed, experiment.source, experiment.base_dir)
        what = ", ".join([*args.set, *(f"fail {f}" for f in args.fail)])
        rows += [
            (f"{policy}: {what}", _experiment_iteration(variant, policy, args.fail, calibration))
            for policy in variant.policies
        ]
    if args.json:
        print(json.dumps({"iterations": [{"label": k, **f.to_dict()} for k, f in rows]}, indent=1))
        return 0
    for line in _by_flow_table(rows, calibration):
        print(line)
    return 0


def _experiment_iteration(
    spec: ExperimentSpec,
    policy: str,
    failures: Sequence[str],
    calibration: ForecastCalibration | None,
) -> IterationForecast:
    """The experiment's workload iteration under ``policy``, flow by flow on its placement,
    with the ``calibration`` the command chose (None: the bare model)."""
    from orchestrator.commands.whatif import parse_failures, routed_around
    from orchestrator.forecast.program import ProgramForecaster
    from topologies.description import FabricDescription

    assert spec.workload is not None
    fabric = spec.fabric_model()
    forecaster = ProgramForecaster(
        FabricDescription.of(fabric),
        spec.gpus,
        policy=policy,
        calibration=calibration,
        host_ports=spec.host_ports,
        failed=parse_failures(fabric, failures),
    )
    with routed_around(failures):
        predicted = forecaster.forecast(spec.program())
    return _iteration(spec.workload, spec.fabric, policy, predicted, spec.fabric.emulation.scale)


def _by_flow_table(
    rows: list[tuple[str, IterationForecast]], calibration: ForecastCalibration | None
) -> list[str]:
    """The flow-by-flow table, headed by the calibration it used (as the experiment forecast
    is): a forecast's figures mean little without knowing which overheads went in."""
    b = rows[0][1]
    policies = ", ".join(dict.fromkeys(f.policy for _, f in rows))
    width = max([28, *(len(label) for label, _ in rows)])
    lines = [
        f"# FORECAST one iteration of {b.workload} on {b.fabric}, policy {policies} (no "
        "emulation: the program the workers would replay, each operation's time from the "
        "collectives forecast; docs/workloads.md)",
        f"# {calibration.describe() if calibration else 'forecast calibration: none'}",
        f"# {'':<{width}} {'iteration s':>11} {'real ms':>9} {'floor s':>8} {'tokens/s':>10} "
        f"{'MFU':>6}  exposed on the last rank (s): tp ep pp dp",
    ]
    for label, f in rows:
        exposed = " ".join(f"{f.exposed.get(k, 0.0):.2f}" for k in ("tp", "ep", "pp", "dp"))
        lines.append(
            f"  {label:<{width}} {f.seconds:>11.2f} {f.real_ms:>9.3f} {f.floor:>8.2f} "
            f"{f.tokens_per_s:>10.3g} {f.mfu:>6.1%}  {exposed}"
        )
    return lines


def _by_class_table(rows: list[tuple[str, IterationForecast]]) -> list[str]:
    b = rows[0][1]
    shapes = ", ".join(f"{kind} {n}" for kind, n in b.shapes.items())
    lines = [
        f"# FORECAST one iteration of {b.workload} on {b.fabric} ({b.gpus:,} GPUs), policy "
        f"{b.policy}, BY LINK CLASS AT REAL SPEED (no emulation scale, no calibration: "
        'the aggregated model; docs/workloads.md, "Full size")',
        f"# played {b.ranks_played:,} representative ranks of {b.gpus:,}; group shapes "
        f"timed per kind: {shapes}",
        f"# {'':<28} {'real ms':>10} {'floor ms':>10} {'tokens/s':>10} {'MFU':>6}  "
        "exposed on the last rank (ms): tp ep pp dp",
    ]
    for label, f in rows:
        exposed = " ".join(f"{f.exposed.get(k, 0.0) * 1e3:.3f}" for k in ("tp", "ep", "pp", "dp"))
        lines.append(
            f"  {label[:28]:<28} {f.real_ms:>10.3f} {f.floor * 1e3:>10.3f} "
            f"{f.tokens_per_s:>10.3g} {f.mfu:>6.1%}  {exposed}"
        )
    took = sum(f.took_s for _, f in rows)
    lines.append(f"# took {took:.1f} s")
    return lines
