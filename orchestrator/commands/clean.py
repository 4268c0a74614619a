"""``astral clean``: remove what killed runs left behind, from their records only.

A run that ends normally (or by Ctrl-C/SIGTERM) removes everything itself. One killed with
SIGKILL, or lost with its machine's power, leaves bridges, veth pairs and maybe processes;
its record (``<state dir>/runs/<id>/state.json``, state dir ``$ASTRAL_STATE_DIR`` or
``/run/astral``) lists them, and this command removes exactly those, printing what it
removed. Nothing that is not in a record is touched (no ``mn -c``, no killing by name).
It refuses while a run is in progress (it would pull the network from under it).
``astral up`` does the same on its own before it starts. ``--on MACHINE`` cleans that
machine of the inventory instead (docs/remote.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.cleanup import clean_other_machines
from orchestrator.commands.remote import add_on_arguments, refuse, run_on
from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.state import clean, state_dir, unclean_runs
from topologies.errors import EmulationError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "clean",
        help="remove what a killed run left (from its record only)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where run records live (default: $ASTRAL_STATE_DIR or /run/astral)",
    )
    add_on_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.on:
        if args.state_dir is not None:
            return refuse("--state-dir names a directory here; with --on, clean uses its own")
        return run_on(args, ["clean"])
    base = args.state_dir or state_dir()
    problems = []
    with RunLock(base, purpose="clean"):
        leftovers = unclean_runs(base)
        if not leftovers:
            print(f"nothing to clean: no unfinished run in {base / 'runs'}")
            return 0
        for state in leftovers:
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.created))
            command = " ".join(state.command) or "?"
            print(f"run {state.run_id} (pid {state.owner_pid}, {started}: {command})")
            began = time.monotonic()
            report = clean(state)
            for line in report.lines():
                print(f"  {line}")
            # a cluster run: its parts on the other machines (docs/cluster.md)
            for line in clean_other_machines(state.run_dir):
                print(f"  {line}")
            print(f"  done in {time.monotonic() - began:.2f} s")
            problems += [f"run {state.run_id}: {error}" for error in report.errors]
    if problems:
        raise EmulationError(
            "some recorded resources could not be removed (the records are kept; run "
            "`astral clean` again): " + "; ".join(problems[:6])
        )
    return 0
