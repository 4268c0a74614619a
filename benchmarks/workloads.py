"""Training workloads replayed against their forecast: iteration time side by side.

    sudo .venv/bin/python benchmarks/workloads.py [--fabric astral-small]
        [--workloads workloads/gpt3-like.yaml,workloads/deepseek-like.yaml]
        [--policies path-pinned,ecmp] [--iterations 2] [--fail LINK]

Brings the fabric up once, and for every policy and shipped workload: forecasts one
iteration of the workload's program (orchestrator/forecast/program.py: the same slots the
workers run, each operation's time from the collectives forecast with this machine's
calibration), then replays it (orchestrator/run/replay.py: 1 warm-up and ``--iterations``
timed iterations on the real emulated fabric, every byte verified) and prints per cell:
the replayed and forecast iteration time (emulated seconds, and milliseconds at real
speed), the relative error of the forecast, the compute floor (the busiest rank's compute
alone), tokens per second and MFU at real speed, and the exposed communication per kind on
the rank that ends last, replayed (measured from the workers' per-step records grouped by
slot, orchestrator/workload/timeline.py) and forecast side by side. Then the median and
largest absolute error, and each policy's iteration time over the first policy's,
replayed and forecast (the policy's effect). With ``--fail LINK`` (a link of the fabric,
``a-b``), every cell is measured a second time with that link down (the same fault
``astral fault apply link-down`` applies, undone after the cell) and forecast with the
link failed: the effect of one failed link, replayed and forecast, side by side.

Targets (the issue's): median <= 5 %, max <= 10 %. A forecast is made before its replay,
so it cannot have seen it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator import REPO
from orchestrator.emulation.network import Terminated
from orchestrator.forecast.calibration import load_forecast_calibration
from orchestrator.forecast.program import ProgramForecaster
from orchestrator.run.replay import replay
from orchestrator.testbed.testbed import Testbed
from orchestrator.workload.iteration import iteration_program
from orchestrator.workload.spec import load_workload
from orchestrator.workload.timeline import KINDS
from topologies.catalog import resolve_fabric
from topologies.errors import ConcurrentRunError
from topologies.spec import load_fabric_spec


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", default="astral-small")
    default = ",".join(str(p) for p in sorted((REPO / "workloads").glob("*.yaml")))
    parser.add_argument("--workloads", default=default)
    parser.add_argument("--policies", default="path-pinned,ecmp")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--fail", default=None, metavar="LINK", help="also with LINK down")
    args = parser.parse_args()
    spec = load_fabric_spec(resolve_fabric(args.fabric))
    policies = args.policies.split(",")
    bed = Testbed(spec, policy=policies[0], telemetry_interval=None)
    try:
        bed.start()
    except ConcurrentRunError as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 5
    try:
        return measure(args, bed, policies)
    except (KeyboardInterrupt, Terminated) as stop:
        print(f"benchmark: interrupted ({stop or 'SIGINT'}); torn down", file=sys.stderr)
        return 130 if isinstance(stop, KeyboardInterrupt) else stop.exit_status
    finally:
        bed.stop()


def measure(args: argparse.Namespace, bed: Testbed, policies: list[str]) -> int:
    workers = bed.workers(None)
    gpus = [w.host for w in workers]
    servers = {w.server for w in workers}
    per_server = len(workers) // len(servers)
    calibration = load_forecast_calibration()
    print(
        f"# fabric {bed.description.fabric.name}, {len(gpus)} GPUs, scale {bed.scale:g}; "
        f"calibration: {'this machine' if calibration else 'none (the bare model)'}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"# {'workload':<16} {'policy':<12} {'replay s':>9} {'forecast s':>10} {'error':>7}"
        f" {'real ms':>8} {'floor s':>8} {'tokens/s':>10} {'MFU':>6}  exposed on the last rank,"
        " replay/forecast (s)"
    )
    errors = []
    wrong = 0
    cells: dict[tuple[str, str, bool], tuple[float, float]] = {}  # -> (replay, forecast)
    began = time.monotonic()
    failure = fault(bed, gpus, args.fail) if args.fail else None
    for policy in policies:
        bed.use_policy(policy)
        for path in args.workloads.split(","):
            spec = load_workload(Path(path), gpus=len(gpus), gpus_per_server=per_server)
            program = iteration_program(spec, bed.scale)
            healthy = None
            for down in (False, True) if failure else (False,):
                failed = frozenset(failure[1].target.links) if down and failure else frozenset()
                forecaster = ProgramForecaster(
                    bed.description, gpus, policy=policy, calibration=calibration, failed=failed
                )
                predicted = forecaster.forecast(program)
                if down and failure:
                    failure[0].apply(failure[1])
                    time.sleep(3.0)  # the controller reroutes around it
                try:
                    result = replay(bed, spec, warmup=1, iterations=args.iterations)
                finally:
                    if down and failure:
                        failure[0].undo(failure[1])
                        time.sleep(3.0)
                wrong += result.wrong
                error = (predicted.seconds - result.iteration_s) / result.iteration_s
                errors.append(abs(error))
                floor = max(result.compute_s(r) for r in range(spec.gpus))
                exposed = predicted.exposed[predicted.last_rank]
                measured = result.exposed()
                shown = " ".join(f"{k} {measured[k]:.2f}/{exposed.get(k, 0.0):.2f}" for k in KINDS)
                label = f"{policy}{' ' + args.fail + ' down' if down else ''}"
                effect = ""
                if healthy is not None:
                    effect = (
                        f"  link down / healthy: replay {result.iteration_s / healthy[0]:.3f},"
                        f" forecast {predicted.seconds / healthy[1]:.3f}"
                    )
                healthy = healthy or (result.iteration_s, predicted.seconds)
                cells[(spec.name, policy, down)] = (result.iteration_s, predicted.seconds)
                print(
                    f"  {spec.name:<16} {label:<12} {result.iteration_s:>9.2f}"
                    f" {predicted.seconds:>10.2f} {error:>+7.1%} {result.real_s * 1e3:>8.3f}"
                    f" {floor:>8.2f} {result.tokens_per_s:>10.3g} {result.mfu:>6.1%}  {shown}"
                    f"{effect}",
                    flush=True,
                )
    for line in policy_effects(cells, policies):
        print(line)
    print(
        f"# {len(errors)} cells: median |error| {statistics.median(errors):.1%}, max "
        f"{max(errors):.1%} (targets 5 %, 10 %); #wrong {wrong}; "
        f"{time.monotonic() - began:.0f} s; load average {os.getloadavg()[0]:.2f}"
    )
    return 0 if wrong == 0 else 7


def policy_effects(
    cells: dict[tuple[str, str, bool], tuple[float, float]], policies: list[str]
) -> list[str]:
    """Each policy's iteration time over the first policy's, per workload (healthy, and
    with the link down when measured), replayed and forecast side by side."""
    lines = []
    for (name, policy, down), (replayed, forecast) in cells.items():
        base = cells.get((name, policies[0], down))
        if policy == policies[0] or base is None:
            continue
        state = "link down" if down else "healthy"
        lines.append(
            f"# policy effect, {name} ({state}): {policy} / {policies[0]} iteration time "
            f"{replayed / base[0]:.3f}x replayed, {forecast / base[1]:.3f}x forecast"
        )
    return lines


def fault(bed: Testbed, gpus: list[str], link: str) -> tuple[Any, Any]:
    """The injector and the link-down fault of ``link`` (validated on the fabric)."""
    from orchestrator.testbed.faults import injector_on
    from orchestrator.testbed.faultspec import parse_faults
    from topologies.errors import ConfigError
    from topologies.spec import _Reader

    read = _Reader("--fail")
    read.error = ConfigError
    (spec,) = parse_faults(read, [{"kind": "link-down", "target": link}], bed.description.fabric)
    injector, _ = injector_on(bed, gpus)
    return injector, spec


if __name__ == "__main__":
    sys.exit(main())
