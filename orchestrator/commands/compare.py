"""``astral compare A B``: two bundles' tables side by side, with B/A bus bandwidth ratios.

Configurations match on policy, collective, algorithm and size. ``--a-policy`` and
``--b-policy`` pick one policy per side to compare across policies (A and B may be the same
bundle); giving only one picks that policy on both sides. ``astral compare A --forecast``
sets A's measurements beside the forecasts its run made (the model, docs/forecast.md).
Exits 1 when nothing matches.
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
    parser.add_argument("b", type=Path, metavar="B", nargs="?", help="the bundle compared with A")
    parser.add_argument(
        "--forecast",
        action="store_true",
        help="compare A's measurements with the forecasts its run stored (no B)",
    )
    parser.add_argument("--a-policy", metavar="POLICY", help="use only A's configurations of it")
    parser.add_argument("--b-policy", metavar="POLICY", help="use only B's configurations of it")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.results.compare import compare_bundles, compare_forecasts
    from orchestrator.results.store import ResultsBundle
    from topologies.errors import ConfigError

    if args.forecast:
        if args.b is not None:
            raise ConfigError("command line", "B", "no second bundle with --forecast", args.b)
        with ResultsBundle.open(args.a) as a:
            comparison = compare_forecasts(a)
        print(comparison.text, end="")
        if comparison.matched == 0:
            print("astral compare: A holds no forecast (a bundle from before)", file=sys.stderr)
            return 1
        return 0
    if args.b is None:
        raise ConfigError("command line", "B", "a second bundle (or --forecast)", None)

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
