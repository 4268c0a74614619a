"""``astral doctor [FABRIC]``: can this machine run FABRIC? A table of checks and fixes.

FABRIC is a preset name (astral-small, the default) or a path to a fabric file. Exits 0
when a run can work here (WARN lines allowed), 3 when a check FAILs. With ``--on MACHINE``
the checks run on that machine of the inventory (docs/remote.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from orchestrator.commands.remote import add_on_arguments, run_on
from topologies.catalog import DEFAULT_PRESET, resolve_fabric
from topologies.errors import AstralError, EnvironmentProblem

DEFAULT_FABRIC = DEFAULT_PRESET


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check that this machine can run a fabric, and say how to fix what is missing",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument(
        "fabric",
        nargs="?",
        default=DEFAULT_FABRIC,
        metavar="FABRIC",
        help=f"a preset name or a fabric file (default: {DEFAULT_FABRIC})",
    )
    add_on_arguments(parser)
    parser.set_defaults(func=run)


def fabric_path(value: str) -> Path:
    """The file the FABRIC argument names (FabricSpecError for an unknown preset)."""
    return resolve_fabric(value)


def run(args: argparse.Namespace) -> int:
    if args.on:
        return run_on(args, ["doctor"], fabric=args.fabric)
    from orchestrator.emulation.doctor import diagnose, render
    from orchestrator.worker import rto
    from topologies.generators import build_fabric
    from topologies.spec import load_fabric_spec

    fabric = build_fabric(load_fabric_spec(fabric_path(args.fabric)))
    report = diagnose(fabric, rto_min=rto.probe)  # the workers' own probe (emulation/
    # does not import worker/)
    print(render(report.results, report.demand))
    for line in capacity_lines():
        print(line)
    return 0 if report.ok else EnvironmentProblem.exit_status


def capacity_lines() -> list[str]:
    """The emulator recipe runs use here, what this machine's stored calibration says the
    emulator carries (per packet size, where it measured several), and under which recipe
    it was measured (docs/calibration.md, docs/capacity.md)."""
    from orchestrator.calibration import capacity as cal
    from orchestrator.emulation.recipe import current_recipe

    recipe = current_recipe()
    lines = [f"recipe: {recipe.describe()}"]
    path = cal.calibration_path(None)
    try:
        stored = cal.load_calibration(path)
    except AstralError as err:
        return [*lines, f"capacity: the calibration file is unusable: {err}"]
    if stored is None:
        return [
            *lines,
            f"capacity: not calibrated ({path} absent): `sudo astral calibrate` measures it",
        ]
    measured_under = stored.conditions.get("recipe", cal.UNNAMED_RECIPE)
    lines.append(
        f"capacity: {cal.hop_mbps(stored.capacity_bps)} measured {stored.measured_at} under "
        f"recipe {measured_under} ({path})"
    )
    lines += [f"  {line}" for line in stored.scale_lines()]
    if stored.recipe != recipe.name:
        lines.append(
            f"capacity: measured under another recipe than runs use here: `sudo astral "
            f"calibrate` measures {recipe.name}"
        )
    return lines
