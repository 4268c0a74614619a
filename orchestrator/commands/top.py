"""``astral top RUN_DIR``: the live view of a run in progress, from another terminal.

    astral top /run/astral/runs/<run>     a fabric's run directory (astral run and astral
                                          up print it when the fabric is up)
    astral top                            the most recent run directory with a live file
    astral top RUN_DIR --once             draw once and exit (scripts, a quick look)

Reads only the files the run writes (docs/monitoring.md, "The live view"): the ranks'
progress, the switch counters, the faults applied, the controller's events. Redraws every
0.4 s (``--refresh``, above 0) until Ctrl-C. RUN_DIR must be a fabric's run directory (it
has the fabric's state.json or a live.json): the view of one whose fabric is up but whose
launch has not started waits for the launch's live.json; a results bundle or any other
directory is refused. A live.json that is not the launcher's is named in the view, which
keeps watching for a valid one.

Exit status 0; 2 when RUN_DIR is not a run directory, ``--refresh`` is not above 0, or,
with ``--once``, live.json is malformed.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
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

    from orchestrator.emulation.state import STATE_FILE, runs_dir
    from orchestrator.monitor.live import (
        LIVE_NAME,
        REFRESH_S,
        LiveSource,
        newest_run_dir,
        render,
        snapshot,
        watch,
    )
    from topologies.errors import ConfigError

    refresh = REFRESH_S if args.refresh is None else args.refresh
    if not (math.isfinite(refresh) and refresh > 0):
        raise ConfigError(
            "command line", "--refresh", "a redraw period in seconds above 0", refresh
        )
    run_dir = args.run_dir
    if run_dir is None:
        base = runs_dir()
        run_dir = newest_run_dir(base)
        if run_dir is None:
            raise ConfigError(
                str(base), "RUN_DIR", "a run directory (none with a live view found under it)"
            )
    if not run_dir.is_dir():
        found = "a file" if run_dir.exists() else "no such directory"
        raise ConfigError(str(run_dir), "RUN_DIR", "a run's directory", found)
    if not ((run_dir / STATE_FILE).is_file() or (run_dir / LIVE_NAME).is_file()):
        # a bundle has telemetry.jsonl and fabric.json too, but never a run to wait for
        raise ConfigError(
            str(run_dir),
            "RUN_DIR",
            f"a run's directory (with a fabric's {STATE_FILE} or a launch's {LIVE_NAME}: the "
            "one `astral run` and `astral up` print; not a results bundle)",
            f"neither {STATE_FILE} nor {LIVE_NAME}",
        )
    if args.once:
        state = snapshot(LiveSource(run_dir))
        Console().print(render(state))
        if state.problem is not None:  # a script's one look: say it where errors go, too
            print(f"astral: error: {state.problem}", file=sys.stderr)
            return 2
        return 0
    with contextlib.suppress(KeyboardInterrupt):
        watch(run_dir, refresh=refresh)
    return 0
