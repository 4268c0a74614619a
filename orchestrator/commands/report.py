"""``astral report BUNDLE``: render a results bundle's summary, tables and plots again.

Reads only the bundle's database and fabric.json, so it works on a crashed run's bundle and
after the plotting code changed. On a study's bundle it renders every variant's bundle, then
the study's summary, report (the variants side by side and the verdicts) and plots; a
variant whose bundle is missing is said so (exit 6 where study.json says it completed).
Prints the nccl-tests tables (a workload replay's table instead, from its workload.json,
with its Gantts drawn again), then, when the run injected
faults, what was injected, when, and what each layer of the monitor saw (docs/monitoring.md),
then the files it wrote.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="render a results bundle's tables and plots again",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    parser.add_argument("bundle", type=Path, help="a results bundle directory (a run's output)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="do not print the tables and file list"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from orchestrator.results.store import readable_database

    with readable_database(args.bundle):  # a damaged database: exit 6, not a traceback
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    # Imported here: `astral --help` and the other commands need not load the results code.
    from orchestrator.monitor.report import fault_lines, render_monitor
    from orchestrator.results.report import render_bundle
    from orchestrator.run.replay import workload_report
    from orchestrator.study.bundle import is_study_bundle

    if is_study_bundle(args.bundle):
        return _study(args)
    report = render_bundle(args.bundle, plots=not args.no_plots)
    if not args.no_plots:
        report.files += render_monitor(args.bundle)
    workload, files = workload_report(args.bundle, plots=not args.no_plots)
    report.files += files
    if not args.quiet:
        print("\n".join(report.tables + workload))
        faults = fault_lines(args.bundle)
        if faults:
            print("\n".join(faults))
        print(f"# wrote {len(report.files)} files under {report.bundle}:")
        for path in report.files:
            print(f"#   {path.relative_to(report.bundle)}")
    return 0


def _study(args: argparse.Namespace) -> int:
    from orchestrator.monitor.report import render_monitor
    from orchestrator.results.report import render_bundle
    from orchestrator.study.bundle import StudyBundle
    from orchestrator.study.report import render_study

    study = StudyBundle.open(args.bundle)
    for variant in study.variants:
        where = args.bundle / variant.directory
        if (where / "results.sqlite").is_file():
            render_bundle(where, plots=not args.no_plots)
            if not args.no_plots:
                render_monitor(where)
    _, lines = render_study(args.bundle, plots=not args.no_plots)
    if not args.quiet:
        print("\n".join(lines))
    # a variant that ran but whose bundle is gone: said (stderr, even quiet), and exit 6 as
    # for any missing bundle where study.json says it completed ("ok" cannot be vouched for)
    missing = [v for v in study.variants if v.bundle_missing]
    for variant in missing:
        where = args.bundle / variant.directory
        why = (
            f"its bundle {where} is missing (deleted, or not copied with the study)"
            if variant.status == "ok"
            else f"no bundle at {where} (deleted, or the variant failed before writing one)"
        )
        print(
            f"astral: warning: variant {variant.index + 1} ({variant.label}), "
            f"{variant.status} in study.json: {why}; its figures are left out of the report",
            file=sys.stderr,
            flush=True,
        )
    return 6 if any(v.status == "ok" for v in missing) else 0
