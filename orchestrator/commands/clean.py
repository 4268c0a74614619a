"""``astral clean``: remove what killed runs left behind, from their records only.

A run that ends normally (or by Ctrl-C/SIGTERM) removes everything itself. One killed with
SIGKILL, or lost with its machine's power, leaves bridges, veth pairs and maybe processes;
its record (``<state dir>/runs/<id>/state.json``, state dir ``$ASTRAL_STATE_DIR`` or
``/run/astral``) lists them, and this command removes exactly those, printing what it
removed. Nothing that is not in a record is touched (no ``mn -c``, no killing by name).
It refuses while a run is in progress (it would pull the network from under it).
``astral up`` does the same on its own before it starts. ``--on MACHINE`` cleans that
machine of the inventory instead (docs/remote.md).

A state dir that does not exist holds no record: nothing to clean, and nothing is created.
A record that cannot be read, or is not one (not JSON, a key missing or of the wrong type),
is reported by file and problem: what its run left is unknown, so the machine is not
said to be clean.

Exit status: 0 clean (or nothing to clean); 2 ``--state-dir`` is not a directory; 4 a
recorded resource would not go, or a record could not be read; 5 a run is in progress.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.cleanup import clean_other_machines
from orchestrator.commands.remote import add_on_arguments, refuse, run_on
from orchestrator.emulation.lock import RunLock
from orchestrator.emulation.state import clean, state_dir, unclean_runs, unreadable_runs
from topologies.errors import ConfigError, EmulationError


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
    if not base.exists():  # taking the lock would create it (a typo left stray directories)
        print(f"nothing to clean: no state dir {base} (no run has recorded anything there)")
        return 0
    if not base.is_dir():
        raise ConfigError("command line", "--state-dir", "a directory of run records", str(base))
    problems = []
    with RunLock(base, purpose="clean"):
        leftovers = unclean_runs(base)
        unreadable = unreadable_runs(base)
        for path, problem in unreadable:
            print(f"unreadable run record {path}: {problem} (what its run left is unknown)")
            problems.append(f"{path}: {problem}")
        if not leftovers and not unreadable:
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
            "some recorded resources could not be removed, or a record could not be read (the "
            "records are kept; run `astral clean` again, or look at an unreadable record and "
            "remove what it names by hand): " + "; ".join(problems[:6])
        )
    return 0
