"""What the monitor's full detail costs: the default experiment's busbw, full vs light.

    sudo .venv/bin/python benchmarks/monitor_overhead.py [--experiment experiments/default.yaml]
        [--sizes 256K:1M] [--rounds 2] [--iterations 3]

Brings the experiment's fabric up once, then runs its configurations (every policy and
collective; sizes shortened by ``--sizes MIN:MAX`` to keep it to a few minutes) as
``astral run`` runs them (orchestrator.run.runner.Runner on the one testbed), alternately
with the monitor at ``full`` and at ``light`` (orchestrator/testbed/monitoring.py), the
order swapped every round so that a machine that slows down over time favours neither.
``--full-poll S`` gives the full level another counter polling, to tell the polling's
cost from the rest of full detail's.
Prints, per policy and collective, the average busbw at each level and their ratio
(full / light; 1.0 = no cost), then the ratio over everything. The issue's goal: within
5 %. The figures vary with what else the machine runs: say so when quoting them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from statistics import fmean

from orchestrator.run.experiment import parse_experiment
from orchestrator.run.runner import DEFAULT_EXPERIMENT, Runner, RunOptions
from orchestrator.testbed.monitoring import FULL, LIGHT
from orchestrator.testbed.testbed import Testbed
from topologies.errors import ExperimentError
from topologies.yamlfile import read_yaml

Group = tuple[str, str, str]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", type=Path, default=DEFAULT_EXPERIMENT)
    parser.add_argument("--sizes", default="256K:1M", help="MIN:MAX of the size sweep")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument(
        "--full-poll",
        type=float,
        default=None,
        metavar="SECONDS",
        help="attribution: the full level with this counter polling instead of its own",
    )
    args = parser.parse_args()
    full = FULL if args.full_poll is None else replace(FULL, telemetry_interval=args.full_poll)
    document = read_yaml(args.experiment, ExperimentError, "experiment")
    if not isinstance(document, dict):
        raise SystemExit(f"{args.experiment}: not an experiment mapping")
    low, high = args.sizes.split(":")
    document["sizes"] = {**document.get("sizes", {}), "min": low, "max": high}
    if args.iterations is not None:
        document["iterations"] = args.iterations
    spec = parse_experiment(document, str(args.experiment), args.experiment.parent)
    results: dict[str, dict[Group, list[float]]] = {FULL.name: {}, LIGHT.name: {}}
    runner_level = {FULL.name: full, LIGHT.name: LIGHT}
    with (
        tempfile.TemporaryDirectory(prefix="monitor-overhead-") as tmp,
        Testbed(spec.fabric, policy=spec.policies[0], ready_timeout=120, lock_wait=600) as testbed,
    ):
        print(f"# fabric {spec.fabric.name} up ({testbed.run_dir})", file=sys.stderr)
        for round_ in range(args.rounds):
            levels = (full, LIGHT) if round_ % 2 == 0 else (LIGHT, full)
            for level in levels:
                document["monitor"] = level.name
                run_spec = parse_experiment(document, str(args.experiment), args.experiment.parent)
                out = Path(tmp) / f"{round_}-{level.name}"
                options = RunOptions(out=out, plots=False, force=True)
                with open(Path(tmp) / "tables.txt", "a") as tables:  # not on the screen
                    runner = Runner(run_spec, options, out=tables)
                    runner.monitor = runner_level[level.name]
                    outcome = runner.run(testbed)
                if outcome.status != "ok":
                    print(f"# round {round_} {level.name}: {outcome.error}", file=sys.stderr)
                    return 1
                for group, busbw in outcome.averages().items():
                    results[level.name].setdefault(group, []).append(busbw)
                print(f"# round {round_} {level.name}: done", file=sys.stderr)
    print(f"# monitor overhead: {spec.name}, sizes {low}-{high}, {args.rounds} rounds "
          f"alternating, busbw in GB/s emulated (mean of the rounds); full polls every "
          f"{full.telemetry_interval:g} s, light every {LIGHT.telemetry_interval:g} s")  # fmt: skip
    print(f"{'policy':<14}{'collective':<24}{'full':>12}{'light':>12}{'full/light':>12}")
    ratios = []
    for group in sorted(results[FULL.name]):
        at_full = fmean(results[FULL.name][group])
        at_light = fmean(results[LIGHT.name].get(group, [float("nan")]))
        ratio = at_full / at_light if at_light else float("nan")
        ratios.append(ratio)
        policy, collective, algorithm = group
        print(f"{policy:<14}{collective + ' (' + algorithm + ')':<24}{at_full:>12.6f}"
              f"{at_light:>12.6f}{ratio:>12.3f}")  # fmt: skip
    print(f"# overall full/light: {fmean(ratios):.3f} (goal: at least 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
