"""``astral compare A B``: two bundles' tables side by side, with B/A bus bandwidth ratios.

Configurations match on policy, collective, algorithm and size. ``--a-policy`` and
``--b-policy`` pick one policy per side to compare across policies (A and B may be the same
bundle); giving only one picks that policy on both sides. Exits 1 when nothing matches.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare",
        help="compare two results bundles (B/A bus bandwidth)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("a", type=Path, metavar="A", help="the reference bundle")
    parser.add_argument("b", type=Path, metavar="B", help="the bundle compared with A")
    parser.add_argument("--a-policy", metavar="POLICY", help="use only A's configurations of it")
    parser.add_argument("--b-policy", metavar="POLICY", help="use only B's configurations of it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.results.compare import compare_bundles
    from orchestrator.results.store import ResultsBundle

    with ResultsBundle.open(args.a) as a, ResultsBundle.open(args.b) as b:
        comparison = compare_bundles(a, b, a_policy=args.a_policy, b_policy=args.b_policy)
    print(comparison.text, end="")
    if comparison.matched == 0:
        print(
            "astral compare: no configuration in common between A and B "
            "(--a-policy/--b-policy compare different policies)",
            file=sys.stderr,
        )
        return 1
    return 0
