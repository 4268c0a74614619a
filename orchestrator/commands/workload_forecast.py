"""``astral forecast WORKLOAD.yaml --fabric F``: one training iteration predicted without
emulation, with what-ifs (docs/workloads.md).

The workload's iteration is compiled into the program the workers would replay
(orchestrator/workload/iteration.py) and played slot by slot with each operation's
forecast time (orchestrator/forecast/program.py). Printed: the iteration time, emulated
and at real speed, the compute floor, tokens per second and MFU at real speed, and the
exposed communication per kind on the rank that ends last. ``--set KEY=VALUE`` changes a
fabric key (``speeds.nic=400G``, ``oversubscription.agg=15``, ``scale=1e-4``) and ``--fail
LINK|SWITCH`` takes a link or switch down: the baseline and the variant side by side with
the ratio. Fabrics the flow-by-flow model fits (up to a few thousand GPUs); a full-size pod
needs the aggregated model, which workloads do not use yet.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topologies.errors import ConfigError

MAX_GPUS = 4096  # flow by flow, per group: beyond this the aggregated model is needed


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
    policy: str
    scale: float
    seconds: float  # emulated
    floor: float  # the busiest rank's compute, emulated
    tokens_per_s: float
    mfu: float
    exposed: dict[str, float]

    @property
    def real_ms(self) -> float:
        return self.seconds * self.scale * 1e3

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "fabric": self.fabric,
            "policy": self.policy,
            "emulation_scale": self.scale,
            "iteration_s": self.seconds,
            "iteration_real_ms": self.real_ms,
            "compute_floor_s": self.floor,
            "tokens_per_s_real": self.tokens_per_s,
            "mfu": self.mfu,
            "exposed_s_last_rank": self.exposed,
        }


def forecast_iteration(
    path: Path,
    fabric_ref: str,
    policy: str,
    settings: Sequence[str] = (),
    failures: Sequence[str] = (),
) -> IterationForecast:
    """The forecast of one iteration of the workload at ``path`` on fabric ``fabric_ref``."""
    from orchestrator.commands.whatif import parse_failures, with_settings
    from orchestrator.forecast.calibration import load_forecast_calibration
    from orchestrator.forecast.program import ProgramForecaster
    from orchestrator.run.overrides import is_fabric_key
    from orchestrator.workload import costs
    from orchestrator.workload.iteration import iteration_program
    from orchestrator.workload.spec import load_workload
    from topologies.description import FabricDescription
    from topologies.generators import build_fabric
    from topologies.spec import parse_fabric_spec

    for setting in settings:
        key = setting.partition("=")[0].strip()
        if not (is_fabric_key(key) or key == "scale"):
            raise ConfigError(
                "--set", key, "a fabric key (speeds.nic, oversubscription.agg, ...) or scale", key
            )
    document = with_settings({"fabric": fabric_ref}, settings, Path.cwd())
    fabric_doc = document["fabric"]
    if isinstance(fabric_doc, str):
        from topologies.catalog import resolve_fabric
        from topologies.spec import load_fabric_spec

        spec = load_fabric_spec(resolve_fabric(fabric_doc, Path.cwd()))
    else:
        spec = parse_fabric_spec(fabric_doc, "--fabric")
    if "scale" in document:  # an experiment key: the fabric's emulation scale
        from dataclasses import replace

        from topologies.fabricspec import EmulationSpec

        spec = replace(spec, emulation=EmulationSpec(scale=float(document["scale"])))
    fabric = build_fabric(spec)
    if len(fabric.gpus) > MAX_GPUS:
        raise ConfigError(
            "--fabric",
            "fabric",
            f"a fabric of at most {MAX_GPUS} GPUs (a workload is forecast flow by flow; "
            "full-size fabrics need the aggregated model, not built for workloads yet)",
            f"{len(fabric.gpus)} GPUs",
        )
    gpus = [g.name for g in fabric.gpus_by_rank()]
    workload = load_workload(path, gpus=len(gpus), gpus_per_server=spec.gpus_per_server)
    program = iteration_program(workload, spec.emulation.scale)
    description = FabricDescription.of(fabric)
    forecaster = ProgramForecaster(
        description,
        gpus,
        policy=policy,
        calibration=load_forecast_calibration(),
        failed=parse_failures(fabric, failures),
    )
    predicted = forecaster.forecast(program)
    scale = spec.emulation.scale
    real = predicted.seconds * scale
    tokens = workload.batch.global_batch * workload.model.seq_len
    peak = workload.gpus * workload.gpu.peak_flops
    return IterationForecast(
        workload=workload.name,
        fabric=spec.name,
        policy=policy,
        scale=scale,
        seconds=predicted.seconds,
        floor=max(predicted.compute),
        tokens_per_s=tokens / real,
        mfu=costs.model_flops_per_iteration(workload) / (peak * real),
        exposed=predicted.exposed[predicted.last_rank],
    )


def run(args: argparse.Namespace) -> int:
    """The command (called by ``astral forecast`` for a workload file)."""
    if args.paths is not None or args.calibrate or args.full_size:
        raise ConfigError(
            "command line",
            "--paths/--calibrate/--full-size",
            "none of them with a workload (--fabric, --policy, --set, --fail, --json)",
            str(args.experiment),
        )
    policy = args.policy or "path-pinned"
    baseline = forecast_iteration(args.experiment, args.fabric, policy)
    variant = None
    if args.set or args.fail:
        variant = forecast_iteration(args.experiment, args.fabric, policy, args.set, args.fail)
    if args.json:
        out: dict[str, Any] = {"iteration": baseline.to_dict()}
        if variant is not None:
            out["variant"] = {"set": args.set, "fail": args.fail, "iteration": variant.to_dict()}
        print(json.dumps(out, indent=1))
        return 0
    rows = [("baseline", baseline)]
    if variant is not None:
        rows.append((", ".join([*args.set, *(f"fail {f}" for f in args.fail)]), variant))
    print(
        f"# FORECAST one iteration of {baseline.workload} on {baseline.fabric}, policy "
        f"{policy} (no emulation: the program the workers would replay, each operation's "
        "time from the collectives forecast; docs/workloads.md)"
    )
    print(
        f"# {'':<28} {'iteration s':>11} {'real ms':>9} {'floor s':>8} {'tokens/s':>10} "
        f"{'MFU':>6}  exposed on the last rank (s): tp ep pp dp"
    )
    for label, f in rows:
        exposed = " ".join(f"{f.exposed.get(k, 0.0):.2f}" for k in ("tp", "ep", "pp", "dp"))
        print(
            f"  {label[:28]:<28} {f.seconds:>11.2f} {f.real_ms:>9.3f} {f.floor:>8.2f} "
            f"{f.tokens_per_s:>10.3g} {f.mfu:>6.1%}  {exposed}"
        )
    if variant is not None:
        print(f"# variant / baseline iteration time: {variant.seconds / baseline.seconds:.3f}")
    return 0
