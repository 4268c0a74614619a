"""``astral run [EXPERIMENT.yaml]``: run an experiment and write its results bundle.

    astral run                              experiments/default.yaml
    astral run experiments/mine.yaml        any experiment file
    astral run EXP --out /tmp/bundle        the bundle there instead of results/<time>-<name>/
    astral run EXP --force                  run even above the emulator's safe load
    astral run EXP --no-calibrate           no quick calibration on a machine without one
    astral run EXP --quiet                  no progress bar and no status lines
    astral run EXP --live                   the live view while it runs (as astral top)
    astral run EXP --monitor light          the monitor at its lightest (docs/monitoring.md)
    astral run EXP --lock-wait 600          wait for another run's lock instead of exit 5
    astral run EXP --on lab1                on a machine of the inventory, the bundle
                                            copied here (docs/remote.md)

Brings the experiment's fabric up once, runs every policy x collective x size (policies
vary slowest: each is one controller reprogramming), prints an nccl-tests table per policy
and collective with bandwidths also scaled back to real link speeds, tears down, and writes
results/<timestamp>-<name>/ (results.sqlite, summary.json, tables/, plots/, run.json).
A progress bar with the current step and an ETA shows on a terminal.

On a machine without a calibration file (``astral calibrate``) it first runs the quick
calibration (under a minute) and stores it where calibration files live, so it happens
once per machine; ``--no-calibrate`` skips it and the load guard's verdict is "unknown".
While configurations run it samples the CPU and marks, in their tables and the bundle,
every configuration measured while the emulator was saturated (docs/calibration.md).

A study (an experiment file that names several ``fabrics:`` or a ``sweep:``, docs/studies.md)
runs every variant, each fabric brought up once, into one study bundle with the variants'
run bundles under variants/, a report of the variants side by side and the study's
verdicts (orchestrator/study/runner.py).

Exit status: 0; 2 a bad experiment file, an ``--out`` that is a file or a directory that is
not empty, or a load the emulator cannot carry (nothing is created); 3 environment; 4 the
emulation or a worker failed (the failing rank and host are named, the bundle is kept and
marked failed); 5 another run holds the lock; 7 the run
completed but data failed verification, #wrong > 0 (each such configuration is named, the
bundle is kept and marked failed); 130/143 interrupted (the bundle is marked interrupted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.commands.remote import add_on_arguments, run_experiment_on


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run an experiment (default: experiments/default.yaml) and write its results",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "experiment",
        nargs="?",
        type=Path,
        default=None,
        metavar="EXPERIMENT",
        help="experiment YAML file (default: experiments/default.yaml)",
    )
    parser.add_argument(
        "--out", type=Path, metavar="DIR", help="bundle directory (default results/<time>-<name>)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="run even if the offered load exceeds the emulator's calibrated safe share",
    )
    parser.add_argument(
        "--no-calibrate",
        action="store_true",
        help="without a calibration file, run uncalibrated instead of calibrating first",
    )
    parser.add_argument(
        "-q", "--quiet", action="store_true", help="no progress bar and no status messages"
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    parser.add_argument(
        "--live", action="store_true", help="draw the live view (astral top) while it runs"
    )
    parser.add_argument(
        "--lock-wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run's lock instead of exiting 5 at once",
    )
    parser.add_argument(
        "--monitor",
        choices=("full", "light"),
        default=None,
        help="the monitor's detail level (default: the experiment's, else full)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long bring-up and reprogramming may take",
    )
    parser.add_argument(  # fault injection for the integration tests (worker.py's flags)
        "--worker-arg", action="append", default=[], metavar="ARG", help=argparse.SUPPRESS
    )
    add_on_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.on:
        return run_experiment_on(args)
    from orchestrator.run.experiment import load_experiment
    from orchestrator.run.runner import DEFAULT_EXPERIMENT, Runner

    path = args.experiment or DEFAULT_EXPERIMENT
    if _is_study_file(path):
        return _run_study(args, path)
    spec = load_experiment(path)  # ConfigError (exit 2) before anything is created
    check_out(args.out)
    text = Path(path).read_text(encoding="utf-8")
    quiet = args.quiet

    def say(message: str) -> None:
        if not quiet:
            print(f"astral: {message}", file=sys.stderr, flush=True)

    options = run_options(args)
    if args.live:
        from rich.live import Live

        from orchestrator.monitor.live import Updater

        # Live redirects stdout and stderr: the run's tables and messages print above it
        with Live(auto_refresh=False, redirect_stdout=True, redirect_stderr=True) as live:
            runner = Runner(spec, options, text=text, say=say, command=sys.argv)
            with Updater(live, lambda: runner.run_dir):
                outcome = runner.run()
    else:
        runner = Runner(spec, options, text=text, say=say, command=sys.argv)
        outcome = runner.run()
    if outcome.status != "ok" and outcome.error:
        print(f"astral: run {outcome.status}: {outcome.error}", file=sys.stderr, flush=True)
    return outcome.exit_status


def check_out(out: Path | None) -> None:
    """Refuse an ``--out`` the bundle cannot be written to before the lock is taken and the
    fabric brought up: found only when the bundle is opened, it cost a bring-up and
    surfaced as a results error (exit 6)."""
    from topologies.errors import ConfigError

    if out is None or not out.exists():
        return
    if not out.is_dir():
        raise ConfigError("command line", "--out", "a new or empty directory for the bundle",
                          f"{out} (a file)")  # fmt: skip
    if any(out.iterdir()):
        raise ConfigError(
            "command line",
            "--out",
            "a new or empty directory for the bundle (a bundle is never written over)",
            f"{out} (not empty)",
        )


def run_options(args: argparse.Namespace) -> Any:
    """The RunOptions the command line asks for."""
    from orchestrator.run.runner import RunOptions

    quiet = args.quiet
    return RunOptions(
        out=args.out,
        force=args.force,
        calibrate=not args.no_calibrate,
        progress=not quiet and not args.live and sys.stderr.isatty(),
        plots=not args.no_plots,
        ready_timeout=args.timeout,
        worker_args=tuple(args.worker_arg),
        monitor=args.monitor,
        lock_wait=args.lock_wait,
    )


def _is_study_file(path: Path) -> bool:
    from orchestrator.study.spec import is_study
    from topologies.errors import ExperimentError
    from topologies.yamlfile import read_yaml

    return is_study(read_yaml(path, ExperimentError, "experiment"))


def _run_study(args: argparse.Namespace, path: Path) -> int:
    from orchestrator.study.runner import StudyRunner
    from orchestrator.study.spec import load_study
    from topologies.errors import ConfigError

    if args.live:
        raise ConfigError(
            "command line", "--live", "a single experiment (a study runs several fabrics)", path
        )
    study = load_study(path)  # every variant validated: ConfigError (exit 2), nothing made
    quiet = args.quiet

    def say(message: str) -> None:
        if not quiet:
            print(f"astral: {message}", file=sys.stderr, flush=True)

    runner = StudyRunner(
        study,
        run_options(args),
        text=Path(path).read_text(encoding="utf-8"),
        say=say,
        command=sys.argv,
    )
    outcome = runner.run()
    if outcome.status != "ok":
        why = f": {outcome.error}" if outcome.error else ""
        print(f"astral: study {outcome.status}{why}", file=sys.stderr, flush=True)
    return outcome.exit_status
