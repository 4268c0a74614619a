"""``astral diagnose BUNDLE [--json]``: name what broke in a run, from its results bundle.

Works on any bundle, finished, failed or killed: it reads the monitor's layers (operations
and steps, connections with their samples, kernel view and paths, port counters, the
controller's events) and prints "healthy" or the suspects, most likely first, each with
the fault it looks like, a score and its evidence across the layers (docs/diagnosis.md).
Exit status 0 when healthy, 1 when there are suspects.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="name the faulty link, switch, GPU or controller of a run, from its bundle",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("bundle", type=Path, help="a results bundle directory (a run's output)")
    parser.add_argument("--json", action="store_true", help="the same as one JSON document")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.diagnosis import diagnose_bundle
    from orchestrator.results.store import readable_database

    _not_a_study(args.bundle)
    # a damaged database is exit 6, never a traceback's 1, which means "suspects" here
    with readable_database(args.bundle):
        diagnosis = diagnose_bundle(args.bundle)
    if args.json:
        print(json.dumps(diagnosis.to_dict(), indent=2))
    else:
        print(f"# astral diagnose {args.bundle}")
        print(diagnosis.render())
    return 0 if diagnosis.healthy else 1


def _not_a_study(path: Path) -> None:
    """A study's bundle has no database of its own: each variant's bundle under variants/
    has one. Say so, naming a variant to diagnose, instead of "expected a results.sqlite"."""
    from orchestrator.study.bundle import VARIANTS, is_study_bundle
    from topologies.errors import ResultsError

    if not is_study_bundle(path):
        return
    variants = sorted(p for p in (path / VARIANTS).glob("*") if p.is_dir())
    example = variants[0] if variants else path / VARIANTS / "NN-<label>"
    where = f"{len(variants)} under {path / VARIANTS}" if variants else f"under {path / VARIANTS}"
    raise ResultsError(
        path,
        "a run's bundle; a study's variants each have their own "
        f"({where}): diagnose one, e.g. astral diagnose {example}",
        "a study's bundle (study.json, no results.sqlite)",
    )
