"""``astral workload show WORKLOAD.yaml [--gpus N] [--gpus-per-server G] [--scale S]``.

Validates a training workload (workloads/*.yaml) and prints what one iteration is made of:
the parallel layout, the micro-batches, then per pipeline stage the parameters a GPU holds,
its FLOPs, its compute seconds (at real speed, and emulated at ``--scale``: compute is
stretched by 1 / scale as the links are slowed by scale), and the bytes of each
communication kind it takes part in (the data-parallel gradients as their buckets: count,
bytes each and the last one's when smaller). ``--gpus`` and ``--gpus-per-server`` check the
layout against a fabric; a workload with ``dp: auto`` (the presets) needs ``--gpus``, the
GPUs it fills. No root, no emulation.

Exit status: 0; 2 a bad workload file or option.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from orchestrator.commands.topo import table
from orchestrator.workload.costs import (
    compute_seconds,
    model_flops_per_iteration,
    stage_communication,
    stage_flops,
    stage_parameters,
)
from orchestrator.workload.spec import AUTO, WorkloadSpec, load_workload
from topologies.errors import WorkloadError

#: The emulated fabric's link scale the brief's presets are sized for (a 200G port at
#: 12 Mbit/s).
DEFAULT_SCALE = 0.6e-4


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "workload",
        help="show what one iteration of a training workload computes and sends",
        description="Training workloads (workloads/*.yaml); no root needed.",
    )
    sub = parser.add_subparsers(dest="workload_command", metavar="SUBCOMMAND")
    sub.required = True
    show = sub.add_parser(
        "show",
        help="the validated layout, FLOPs, compute seconds and bytes of an iteration",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    show.add_argument("workload", help="a workload file (YAML)")
    show.add_argument(
        "--gpus", type=int, metavar="N", help="the fabric's GPU count (dp: auto needs it)"
    )
    show.add_argument(
        "--gpus-per-server", type=int, metavar="G", help="GPUs per server (tp stays inside)"
    )
    show.add_argument(
        "--scale",
        type=float,
        default=DEFAULT_SCALE,
        metavar="S",
        help=f"emulated = real x scale (default {DEFAULT_SCALE:g})",
    )
    show.set_defaults(func=run_show)


def _option(value: float | None, name: str, low: float, high: float | None = None) -> None:
    if value is not None and not (low < value and (high is None or value <= high)):
        limit = f"above {low:g}" + ("" if high is None else f" and at most {high:g}")
        raise WorkloadError("command line", name, f"a number {limit}", value)


def mib(size: float) -> str:
    return f"{size / 2**20:.2f} MiB"


def render(spec: WorkloadSpec, scale: float) -> list[str]:
    """The report's lines."""
    m, p, b = spec.model, spec.parallel, spec.batch
    kind = f"MoE, {m.experts} experts, top {m.top_k}" if m.moe else "dense"
    lines = [
        f"workload {spec.name}: {m.layers} layers, h {m.hidden}, {m.heads} heads, {kind}",
        f"  layout: tp {p.tp} x pp {p.pp} x dp {p.dp} = {spec.gpus} GPUs, ep {p.ep}",
        f"  batch: {b.global_batch} sequences of {m.seq_len} tokens, "
        f"{spec.micro_batches} micro-batches of {b.micro_batch} per data-parallel rank",
        f"  model FLOPs per iteration (all GPUs, for MFU): {model_flops_per_iteration(spec):.3e}",
        "",
    ]
    rows: list[list[object]] = [
        ["stage", "layers", "parameters/GPU", "FLOPs/GPU", "real s", f"emulated s @{scale:g}"]
    ]
    for stage in range(p.pp):
        layers = spec.layers_of(stage)
        flops = stage_flops(spec, stage)
        seconds = compute_seconds(spec, flops)
        rows.append(
            [
                stage,
                f"{layers.start}-{layers.stop - 1}",
                f"{stage_parameters(spec, stage):,}",
                f"{flops:.3e}",
                f"{seconds:.3g}",
                f"{seconds / scale:.3g}",
            ]
        )
    lines += ["compute per iteration:", *table(rows), "", "communication per iteration, per GPU:"]
    rows = [["stage", "kind", "group", "count", "bytes each", "total"]]
    for stage in range(p.pp):
        for c in stage_communication(spec, stage):
            each = mib(c.bytes_each) + (f", last {mib(c.last_bytes)}" if c.last_bytes else "")
            rows.append([stage, c.kind, c.group, c.count, each, mib(c.total)])
    lines += table(rows, "llrrrr")
    return lines


def run_show(args: argparse.Namespace) -> int:
    _option(args.gpus, "--gpus", 0)
    _option(args.gpus_per_server, "--gpus-per-server", 0)
    _option(args.scale, "--scale", 0, 1)
    try:
        spec = load_workload(args.workload, gpus=args.gpus, gpus_per_server=args.gpus_per_server)
    except WorkloadError as err:
        if args.gpus is None and err.key == "parallel.dp" and err.found == AUTO:
            # the one mistake the command line, not the file, can mend: say how
            raise WorkloadError(
                err.file,
                err.key,
                err.expected,
                err.found,
                detail="give the fabric's GPU count: --gpus N; the presets are sized for "
                "astral-small, --gpus 8 --gpus-per-server 2",
            ) from None
        raise
    sys.stdout.write("\n".join(render(spec, args.scale)) + "\n")
    return 0
