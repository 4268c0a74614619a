"""``astral top RUN_DIR``: the live view of a run in progress, from another terminal.

    astral top /run/astral/runs/<run>     a fabric's run directory (astral run and astral
                                          up print it when the fabric is up)
    astral top                            the most recent run directory with a live file
    astral top RUN_DIR --once             draw once and exit (scripts, a quick look)

Reads only the files the run writes (docs/monitoring.md, "The live view"): the ranks'
progress, the switch counters, the faults applied, the controller's events. Redraws every
0.4 s until Ctrl-C; exit status 0, 2 when RUN_DIR is not a directory.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="watch a run in progress: operations, ranks, links, faults, alerts",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run_dir", nargs="?", type=Path, metavar="RUN_DIR")
    parser.add_argument("--once", action="store_true", help="draw once and exit")
    parser.add_argument(
        "--refresh", type=float, default=None, metavar="SECONDS", help="redraw period (0.4)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from orchestrator.emulation.state import runs_dir
    from orchestrator.monitor.live import (
        REFRESH_S,
        LiveSource,
        newest_run_dir,
        render,
        snapshot,
        watch,
    )
    from topologies.errors import ConfigError

    run_dir = args.run_dir
    if run_dir is None:
        run_dir = newest_run_dir(runs_dir())
        if run_dir is None:
            raise ConfigError(None, "RUN_DIR", "a run directory (none with a live view found)")
    if not run_dir.is_dir():
        raise ConfigError(None, "RUN_DIR", "a run's directory", str(run_dir))
    if args.once:
        Console().print(render(snapshot(LiveSource(run_dir))))
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        watch(run_dir, refresh=args.refresh or REFRESH_S)
    return 0
