"""``astral compare A B``: two bundles' tables side by side, with B/A bus bandwidth ratios.

Configurations match on policy, collective, algorithm and size. ``--a-policy`` and
``--b-policy`` pick one policy per side to compare across policies (A and B may be the same
bundle); giving only one picks that policy on both sides. ``astral compare A --forecast``
sets A's measurements beside the forecasts its run made (the model, docs/forecast.md).
On studies (docs/studies.md): ``astral compare STUDY`` sets every variant beside the first,
``astral compare STUDY_A STUDY_B`` each variant of A beside B's variant of the same label;
a variant's own bundle (STUDY/variants/NN-...) compares as any run's.
On bundles that replayed a workload (docs/workloads.md): their iterations per policy, B/A
at real speed, with the exposed communication per kind; ``--forecast`` sets a replay
beside its forecast. Bundles of different kinds (collectives, a replay, a study) are a
mistake (exit 2) in either order. Exits 1 when nothing matches; a policy chosen that its
side did not run is a mistake (exit 2) that names the policies it did run, since an empty
comparison would leave the user to guess which of the two sides lacked it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
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
    from orchestrator.results.store import readable_database

    bundles = [args.a] if args.b is None else [args.a, args.b]
    with readable_database(*bundles):  # a damaged database: exit 6, not a traceback
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from orchestrator.results.compare import compare_bundles, compare_forecasts
    from orchestrator.results.store import ResultsBundle, read_workload
    from orchestrator.study.bundle import is_study_bundle
    from topologies.errors import ConfigError

    if is_study_bundle(args.a) and not args.forecast:
        return _studies(args)
    replayed = read_workload(args.a)
    if replayed is not None:
        return _workloads(args, replayed)
    if args.forecast:
        if args.b is not None:
            raise ConfigError("command line", "B", "no second bundle with --forecast", str(args.b))
        _no_b_policy(args)
        with ResultsBundle.open(args.a) as a:
            if args.a_policy is not None:
                _check_policy("--a-policy", args.a_policy, f"bundle A ({args.a})", _ran(a))
            comparison = compare_forecasts(a, policy=args.a_policy)
        print(comparison.text, end="")
        if comparison.matched == 0:
            print("astral compare: A holds no forecast (a bundle from before)", file=sys.stderr)
            return 1
        return 0
    if args.b is None:
        raise ConfigError("command line", "B", "a second bundle (or --forecast)", None)
    # the same refusal whichever side the other kind is on (a replay as A says it too)
    if read_workload(args.b) is not None:
        raise ConfigError(
            "command line", "B", "a bundle of collectives, as A is (B replayed a workload)",
            str(args.b),
        )  # fmt: skip
    if is_study_bundle(args.b):
        raise ConfigError("command line", "B", "a run bundle, as A is (B is a study)", str(args.b))

    with ResultsBundle.open(args.a) as a, ResultsBundle.open(args.b) as b:
        ran_a, ran_b = _ran(a), _ran(b)
        check_policies(args, ran_a, ran_b)
        comparison = compare_bundles(a, b, a_policy=args.a_policy, b_policy=args.b_policy)
    print(comparison.text, end="")
    if comparison.matched == 0:
        print(
            "astral compare: no configuration in common between A and B"
            + policy_hint(args, ran_a, ran_b),
            file=sys.stderr,
        )
        return 1
    return 0


def policy_hint(args: argparse.Namespace, ran_a: Collection[str], ran_b: Collection[str]) -> str:
    """The hint on ``--a-policy``/``--b-policy`` where it would help: neither was given and
    the two sides ran no policy in common (an empty string otherwise: a hint about options
    that were given, or would not change the outcome, misleads)."""
    if args.a_policy is not None or args.b_policy is not None:
        return ""
    if set(ran_a) & set(ran_b) or not ran_a or not ran_b:
        return ""
    return (
        f" (A ran {', '.join(sorted(ran_a))}, B {', '.join(sorted(ran_b))}: "
        "--a-policy/--b-policy compare different policies)"
    )


def _workloads(args: argparse.Namespace, a: dict[str, Any]) -> int:
    """Two replays' iterations side by side, or (``--forecast``) a replay beside its
    forecast: what ``astral run`` printed, from the bundles' workload.json (A's read)."""
    from orchestrator.results.store import read_workload
    from orchestrator.run.replay import compare_workloads, replay_table
    from topologies.errors import ConfigError

    if args.forecast:
        if args.b is not None:
            raise ConfigError("command line", "B", "no second bundle with --forecast", str(args.b))
        _no_b_policy(args)
        records = a["policies"]
        if args.a_policy is not None:
            _check_policy("--a-policy", args.a_policy, f"bundle A ({args.a})", records)
            records = {args.a_policy: records[args.a_policy]}
        print(replay_table(a["workload"], records, a["scale"]))
        return 0
    if args.b is None:
        raise ConfigError("command line", "B", "a second bundle (or --forecast)", None)
    b = read_workload(args.b)
    if b is None:
        raise ConfigError(
            "command line", "B", "a bundle that replayed a workload, as A did", str(args.b)
        )
    check_policies(args, a["policies"], b["policies"])
    text, matched = compare_workloads(a, b, a_policy=args.a_policy, b_policy=args.b_policy)
    print(text, end="")
    if matched == 0:
        print(
            "astral compare: no policy in common between A and B"
            + policy_hint(args, a["policies"], b["policies"]),
            file=sys.stderr,
        )
        return 1
    return 0


def _studies(args: argparse.Namespace) -> int:
    """A study's variants against its first, or two studies variant by variant."""
    from orchestrator.results.compare import compare_bundles
    from orchestrator.results.store import ResultsBundle
    from orchestrator.study.bundle import StudyBundle, is_study_bundle
    from topologies.errors import ConfigError

    a = StudyBundle.open(args.a)
    measured = [v for v in a.variants if (args.a / v.directory / "results.sqlite").is_file()]
    if args.b is None:
        if len(measured) < 2:
            raise ConfigError("command line", "A", "a study with two measured variants", args.a)
        pairs = [(args.a, measured[0], args.a, v) for v in measured[1:]]
    else:
        if not is_study_bundle(args.b):
            raise ConfigError("command line", "B", "a study bundle, as A is", str(args.b))
        b = StudyBundle.open(args.b)
        by_label = {v.label: v for v in b.variants}
        pairs = [(args.a, v, args.b, by_label[v.label]) for v in measured if v.label in by_label]
    if pairs:  # the variants a policy chosen may come from: A's of the pairs, and B's
        check_policies(
            args,
            _ran_in(sorted({(p[0], p[1].directory) for p in pairs})),
            _ran_in(sorted({(p[2], p[3].directory) for p in pairs})),
            "study",
        )
    matched = 0
    for path_a, variant_a, path_b, variant_b in pairs:
        where_b = path_b / variant_b.directory
        if not (where_b / "results.sqlite").is_file():
            print(f"# === {variant_b.label}: not measured in B ({variant_b.status})")
            continue
        print(f"# === A {variant_a.label}  vs  B {variant_b.label}")
        with (
            ResultsBundle.open(path_a / variant_a.directory) as bundle_a,
            ResultsBundle.open(where_b) as bundle_b,
        ):
            comparison = compare_bundles(
                bundle_a, bundle_b, a_policy=args.a_policy, b_policy=args.b_policy
            )
        print(comparison.text, end="")
        matched += comparison.matched
    if matched == 0:
        print("astral compare: no configuration in common", file=sys.stderr)
        return 1
    return 0


# --- the policies chosen ---------------------------------------------------------------------


def check_policies(
    args: argparse.Namespace, ran_a: Collection[str], ran_b: Collection[str], what: str = "bundle"
) -> None:
    """A ConfigError (exit 2) when ``--a-policy`` or ``--b-policy`` names a policy its side
    did not run (``ran_a``, ``ran_b``); one of them alone picks its policy on both sides.
    Why: the comparison would be empty, and "nothing in common" leaves the user to guess
    that a policy was misspelt, or which side lacks it."""
    sides = (
        ("A", args.a, ran_a, args.a_policy, "--a-policy", args.b_policy, "--b-policy"),
        ("B", args.b or args.a, ran_b, args.b_policy, "--b-policy", args.a_policy, "--a-policy"),
    )
    for label, path, ran, own, own_option, other, other_option in sides:
        if own is not None:
            _check_policy(own_option, own, f"{what} {label} ({path})", ran)
        elif other is not None:
            _check_policy(
                other_option,
                other,
                f"{what} {label} ({path})",
                ran,
                detail=f"given alone, {other_option} picks its policy on both sides; "
                f"{own_option} picks {label}'s",
            )


def _check_policy(
    option: str, policy: str, side: str, ran: Collection[str], detail: str = ""
) -> None:
    if policy not in ran:
        from topologies.errors import ConfigError

        listed = ", ".join(sorted(ran)) or "none"
        raise ConfigError(
            "command line", option, f"a policy that {side} ran: {listed}", policy, detail=detail
        )


def _no_b_policy(args: argparse.Namespace) -> None:
    """``--b-policy`` with ``--forecast``: there is no B to pick from."""
    if args.b_policy is not None:
        from topologies.errors import ConfigError

        raise ConfigError(
            "command line",
            "--b-policy",
            "no --b-policy with --forecast (A's measurements beside its own forecasts; "
            "--a-policy picks A's policy)",
            args.b_policy,
        )


def _ran(bundle: Any) -> set[str]:
    """The policies an open run bundle ran."""
    return {c.policy for c in bundle.configurations()}


def _ran_in(bundles: Collection[tuple[Path, str]]) -> set[str]:
    """The policies any of a study's variant bundles (study path, variant directory) ran."""
    from orchestrator.results.store import ResultsBundle

    ran: set[str] = set()
    for study, directory in bundles:
        with ResultsBundle.open(study / directory) as bundle:
            ran |= _ran(bundle)
    return ran
