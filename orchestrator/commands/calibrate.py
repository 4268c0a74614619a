"""``astral calibrate``: how much traffic this machine's emulator carries before fidelity drops.

    sudo astral calibrate                     default fabric (astral-small), about a minute
    sudo astral calibrate --quick             2-3 short steps (the last at the default
                                              experiment's packets), well under a minute
    sudo astral calibrate FABRIC --out FILE   another fabric, another file
    astral calibrate --show                   print the stored calibration, measure nothing

It brings up the fabric with trunks faster than its NICs, runs 1, 2, 4, ... TCP flows at
the emulated NIC rate across it (the longest paths, one flow per NIC port at most, each on
a path of its own), then all of them with every link re-shaped 2x, 4x, 8x faster, until
the goodput falls below 0.9 of what a perfect emulator would carry; under a recipe whose
packets grow with the rate (the default), per packet size. The capacity is in hop-bit/s:
bit/s summed over the Open vSwitch switches each bit crosses (the userspace datapath's
work is per packet per switch). It is stored with the
conditions it was measured under (cores, load, datapath, TSO, OVS version, date) in
``/var/lib/astral/calibration.json`` (``$ASTRAL_CALIBRATION`` or ``--out`` to change it).
``astral run`` compares each experiment's offered load (GPUs x NIC ports x emulated NIC
rate x mean switch hops) against the safe share (default 0.7) of it and refuses above,
unless forced (``--force``; the results are then marked emulator-bound).
orchestrator/calibration/ has the details (capacity.py: the unit, the file, the verdict;
measure.py: the measurement); docs/calibration.md and docs/fidelity.md the measurements.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.calibration import capacity as cal
from orchestrator.calibration import measure
from orchestrator.emulation.recipe import RECIPES, current_recipe, packet_scale_of, recipe_named
from orchestrator.run.experiment import ExperimentSpec, load_experiment
from orchestrator.run.runner import DEFAULT_EXPERIMENT
from topologies.catalog import DEFAULT_PRESET, resolve_fabric
from topologies.errors import AstralError
from topologies.spec import load_fabric_spec
from topologies.units import TCP_PAYLOAD_SHARE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure how much traffic the emulator carries faithfully here (needs root)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "fabric",
        nargs="?",
        default=DEFAULT_PRESET,
        metavar="FABRIC",
        help="fabric YAML file or preset name to calibrate on (default: astral-small)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"calibration file (default: ${cal.ENV_VAR} or {cal.DEFAULT_PATH})",
    )
    parser.add_argument(
        "--quick", action="store_true", help="2-3 short steps (a first run, tests, a glance)"
    )
    parser.add_argument(
        "--recipe",
        default=None,
        metavar="NAME",
        help="emulator recipe to measure (default: $ASTRAL_RECIPE or the one runs use; "
        "docs/capacity.md)",
    )
    parser.add_argument("--show", action="store_true", help="print the stored calibration and exit")
    parser.add_argument(
        "--safe-share",
        type=_share,
        default=cal.DEFAULT_SAFE_SHARE,
        metavar="SHARE",
        help=f"share of the capacity runs may offer (default {cal.DEFAULT_SAFE_SHARE})",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=None,
        metavar="SECONDS",
        help="measuring window of each step (default 4, --quick 2.5)",
    )
    parser.add_argument(
        "--lock-wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long to wait for another astral run to finish (default 600)",
    )
    parser.set_defaults(func=run)


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, found {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, found {value:g}")
    return value


def say(message: str) -> None:
    print(f"astral: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    path = cal.calibration_path(args.out)
    spec = load_fabric_spec(resolve_fabric(args.fabric))
    if args.show:
        stored = cal.load_calibration(path)
        if stored is None:
            print(f"no calibration at {path}: run `sudo astral calibrate`")
            return 1
        print_calibration(stored, spec)
        return 0
    plan = measure.QUICK_PLAN if args.quick else measure.DEFAULT_PLAN
    if args.duration is not None:
        plan = replace(plan, duration=args.duration)
    began = time.monotonic()
    recipe = recipe_named(args.recipe) if args.recipe else current_recipe()
    say(f"emulator recipe: {recipe.describe()}")
    default = _default_experiment()  # --quick measures what the default run is judged by
    scale = packet_scale_of(default.fabric, recipe) if default is not None else 1
    result = measure.calibrate(
        spec,
        plan,
        safe_share=args.safe_share,
        lock_wait=args.lock_wait,
        log=say,
        recipe=recipe,
        packet_scale=scale,
    )
    where = cal.save_calibration(result, path)
    result = cal.load_calibration(where) or result  # what a run will read
    print_calibration(result, spec, default)
    print(f"took {time.monotonic() - began:.0f} s; written to {where}")
    return 0


def _default_experiment() -> ExperimentSpec | None:
    """What `astral run` runs with no argument, to say whether it fits (None if unreadable:
    the calibration is still worth printing)."""
    try:
        return load_experiment(DEFAULT_EXPERIMENT)
    except AstralError:
        return None


def print_calibration(
    calibration: cal.Calibration, spec: Any, default: ExperimentSpec | None = None
) -> None:
    """The calibration's steps and summary, and the verdicts for ``spec``'s fabric and the
    default experiment (``default``: already loaded by the caller, else loaded here)."""
    fabric = calibration.fabric
    print(
        f"# astral calibrate: fabric {fabric.get('name', '?')} with trunks "
        f"{fabric.get('trunk_factor', '?')}x the NIC rate, policy {fabric.get('policy', '?')}, "
        f"{fabric.get('duration_s', '?')} s per step; ratio = goodput / (flows x rate x "
        f"TCP's payload share of the recipe's frames, {TCP_PAYLOAD_SHARE:.3f} at 1500 bytes)"
    )
    for line in cal.step_lines(calibration.steps):
        print(f"  {line}")
    for line in calibration.lines():
        print(line)
    # Each judged at its own packet scale, as the load guard judges a run.
    recipe = RECIPES.get(calibration.recipe)
    at_scale = calibration.at_packet_scale(packet_scale_of(spec, recipe))
    assessment = cal.assess(spec, calibration=at_scale)
    print(f"example    {spec.name}, every GPU: {assessment.line()}")
    default = default or _default_experiment()
    if default is not None:
        at_scale = calibration.at_packet_scale(packet_scale_of(default.fabric, recipe))
        verdict = cal.assess(default.fabric, default.gpus, at_scale)
        print(f"default    experiment {default.name} ({DEFAULT_EXPERIMENT.name}): {verdict.line()}")
    if calibration.source and os.environ.get(cal.ENV_VAR):
        print(f"(file from ${cal.ENV_VAR}: {calibration.source})")
