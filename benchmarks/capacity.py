"""The emulator's capacity under each emulator recipe, side by side in one run.

    sudo .venv/bin/python benchmarks/capacity.py [--recipe small-packets,large-packets]
        [--fabric astral-small] [--factors 1,2,4,8,16] [--repeat 1] [--duration 4]
        [--omit 2] [--json FILE] [--lock-wait SECONDS] [--reach 16,24]

The calibration's measurement (orchestrator.calibration.measure, docs/calibration.md):
astral-small's calibration fabric (tor-agg and agg-core links at 4x the NIC rate), 8 TCP
flows GPU i <-> i + n/2 across the pods (5 switches each), with every link re-shaped to
F x the NIC rate (20 Mbit/s) for each ``--factors`` F. Each recipe
(orchestrator.emulation.recipe) gets its own bring-up of the fabric; the recipes take
turns at every factor (``--repeat`` rounds), so that what else runs on the machine
weighs on all of them alike. Per window:

    hop-load   offered load: flows x rate x switches crossed (hop-Mbit/s)
    ratio      goodput / (flows x rate x 1460/1514): the calibration's fidelity ratio
    Jain       Jain's index over the 8 flows' goodputs

and per recipe the capacity: where the mean ratio falls below 0.9, interpolated in log
load as the calibration does (orchestrator.calibration.capacity.find_capacity), and its
ratio to the first recipe's. This measures throughput only; whether a recipe keeps the
fidelity targets (one flow >= 0.95 of R, 8 flows on a bottleneck >= 0.93, Jain >= 0.98) is
``benchmarks/fidelity.py --recipe A,B`` (docs/capacity.md has both).

``--reach N,M``: then, per recipe, ``astral run`` of direct all-to-all of 1 MiB under
path-pinned on astral fabrics of N, M, ... GPUs at 12 Mbit/s per port (2 pods x GPUs/4
servers x 2 GPUs, benchmarks/cluster.py's reach experiment, on this machine only): the
largest each recipe runs without the saturation flag, and each run's bring-up time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import reduce
from pathlib import Path

from orchestrator.calibration.capacity import LoadStep, find_capacity, hop_mbps, switch_hops
from orchestrator.calibration.measure import (
    calibration_fabric,
    calibration_flows,
    merge_steps,
    reshape,
    start_emulation,
    step_of,
)
from orchestrator.emulation.network import Emulation, Terminated
from orchestrator.emulation.recipe import ENV_VAR, EmulatorRecipe, recipe_named
from orchestrator.testbed.traffic import Flow, run_flows
from topologies.catalog import resolve_fabric
from topologies.fabricspec import FabricSpec
from topologies.generators import build_fabric
from topologies.spec import load_fabric_spec

THRESHOLD = 0.9


@dataclass
class Window:
    """One measurement: a recipe at a rate factor, as the calibration's LoadStep."""

    recipe: str
    factor: float
    step: LoadStep


def measure_recipe(
    spec: FabricSpec,
    recipe: EmulatorRecipe,
    flows: Sequence[Flow],
    hops: dict[Flow, int],
    factors: Sequence[float],
    args: argparse.Namespace,
) -> list[Window]:
    """Bring the calibration fabric up under ``recipe`` and measure ``flows`` at every
    factor, once (one round)."""
    emu: Emulation = start_emulation(spec, args.lock_wait, lambda _: None, recipe=recipe)
    base = spec.emulation.emulated(spec.speeds.nic)
    windows = []
    try:
        for factor in factors:
            fitted = reshape(emu, spec.emulation.scale * factor)
            rate = base * factor
            result = run_flows(emu, flows, duration=args.duration, omit=args.omit)
            step = step_of(result, flows, rate, hops, fitted.payload_share, fitted.packet_scale)
            print(
                f"  {recipe.name:15} x{factor:<4g} {rate / 1e6:5.0f}M "
                f"{fitted.segments:2}x{fitted.mtu - 40} B packets "
                f"{step.offered_hop_bps / 1e6:6.0f} hop-Mbit/s  ratio {step.ratio:.3f}  "
                f"Jain {step.jain:.3f}  ovs {step.vswitchd_cores:.2f} cores  "
                f"CPU {step.cpu_busy:.0%}  load {step.loadavg:.1f}",
                flush=True,
            )
            windows.append(Window(recipe.name, factor, step))
    finally:
        emu.stop()
    return windows


def capacity_of(windows: Sequence[Window]) -> tuple[float, str]:
    """The capacity (hop-bit/s) and its bound from the rounds at each factor averaged as
    the calibration averages a repeated step (measure.merge_steps)."""
    steps = []
    for factor in sorted({w.factor for w in windows}):
        step = reduce(merge_steps, [w.step for w in windows if w.factor == factor])
        steps.append(step)
        if step.ratio < THRESHOLD:
            break
    return find_capacity(steps, THRESHOLD)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--recipe", default="small-packets,large-packets")
    parser.add_argument("--fabric", default="astral-small", help="preset name or fabric file")
    parser.add_argument("--factors", default="1,2,4,8,16", help="link rates as NIC-rate multiples")
    parser.add_argument("--repeat", type=int, default=1, help="rounds (recipes take turns)")
    parser.add_argument("--duration", type=float, default=4.0, help="measuring window, s")
    parser.add_argument("--omit", type=float, default=2.0, help="seconds before the window")
    parser.add_argument("--json", type=Path, default=None, help="write every window here")
    parser.add_argument("--lock-wait", type=float, default=900.0)
    parser.add_argument("--reach", default="", help="GPU counts: the largest unflagged fabric")
    args = parser.parse_args(argv)
    recipes = [recipe_named(name) for name in args.recipe.split(",") if name]
    factors = [float(f) for f in args.factors.split(",") if f]
    if os.geteuid() != 0:
        parser.error("builds emulated fabrics: run it as root")
    spec = calibration_fabric(load_fabric_spec(resolve_fabric(args.fabric)))
    model = build_fabric(spec)
    flows = calibration_flows(model)[:8]
    hops = {f: switch_hops(model, f.src)[f.dst] for f in flows}

    def terminate(signum: int, frame: object) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminate)
    began = time.monotonic()
    print(f"# {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; {len(flows)} flows")
    windows: list[Window] = []
    status = 0
    try:
        for _ in range(args.repeat):
            for recipe in recipes:
                windows += measure_recipe(spec, recipe, flows, hops, factors, args)
    except (KeyboardInterrupt, Terminated) as stop:
        status = stop.exit_status if isinstance(stop, Terminated) else 130
        print("# interrupted: the summary has the windows measured so far")
    print()
    print(f"# capacity (mean ratio per factor below {THRESHOLD} ends the search)")
    first = None
    for recipe in recipes:
        mine = [w for w in windows if w.recipe == recipe.name]
        if not mine:
            continue
        capacity, bound = capacity_of(mine)
        first = first or capacity
        print(
            f"{recipe.name:15} {hop_mbps(capacity):>18} ({bound})  x{capacity / first:.2f} of "
            f"{recipes[0].name}   {recipe.summary}"
        )
    counts = [int(n) for n in args.reach.split(",") if n]
    if counts and status == 0:
        reach(recipes, counts)
    print(
        f"# load average at the end {os.getloadavg()[0]:.2f}; took {time.monotonic() - began:.0f} s"
    )
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(w) for w in windows], indent=1) + "\n")
    return status


def reach(recipes: Sequence[EmulatorRecipe], counts: Sequence[int]) -> None:
    """The reach experiment per recipe and GPU count (module docstring)."""
    from cluster import REACH_SCALE, reach_experiment, reach_row

    rate = 200e9 * REACH_SCALE / 1e6
    print(f"\n# reach: direct all-to-all of 1 MiB, path-pinned, {rate:g} Mbit/s per port")
    print(f"{'recipe':15} {'GPUs':>5} {'busbw GB/s':>11} {'saturated':>10} {'bring-up s':>11}")
    with tempfile.TemporaryDirectory(prefix="astral-capacity-reach-") as tmp:
        for recipe in recipes:
            largest = 0
            for gpus in counts:
                where = Path(tmp) / f"{recipe.name}-{gpus}"
                where.mkdir()
                label = f"{recipe.name:15} {gpus:>5}"
                env = {ENV_VAR: recipe.name}
                if reach_row(label, reach_experiment(gpus), where, None, env):
                    largest = max(largest, gpus)
            print(f"{recipe.name:15} largest unflagged: {largest} GPUs")


if __name__ == "__main__":
    sys.exit(main())
