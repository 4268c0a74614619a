"""The ``astral`` command line.

Each subcommand lives in its own module under ``orchestrator/commands/`` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the
parsed arguments and returning an exit status. The list below is the explicit registry:
add a module here to add a command.

Only this module turns an :class:`~topologies.errors.AstralError` into a one-line message
and an exit status; library code raises.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from topologies.errors import AstralError

COMMAND_MODULES = (
    "orchestrator.commands.topo",
    "orchestrator.commands.report",
    "orchestrator.commands.diagnose",
    "orchestrator.commands.compare",
    "orchestrator.commands.up",
    "orchestrator.commands.run",
    "orchestrator.commands.clean",
    "orchestrator.commands.fault",
    "orchestrator.commands.doctor",
    "orchestrator.commands.calibrate",
    "orchestrator.commands.top",
    "orchestrator.commands.forecast",
    "orchestrator.commands.remote",
    "orchestrator.commands.schema",
    "orchestrator.commands.workload",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astral",
        description="Emulated testbed for the network of LLM training clusters (Astral).",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status: int = args.func(args)
    except AstralError as error:
        print(f"astral: error: {error}", file=sys.stderr)
        return error.exit_status
    except KeyboardInterrupt:
        print("astral: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`astral topo show | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush doesn't raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
