"""``astral remote setup|fetch``, and the ``--on MACHINE`` of run, up, doctor and clean.

    astral remote setup lab1              copy this checkout's tracked files to lab1 and run
                                          its setup.sh there (idempotent)
    astral run EXP --on lab1              run there; progress and tables here as they come;
                                          the bundle copied into results/ here
    astral remote fetch lab1 RUN          follow RUN there to its end and copy its bundle
                                          (after a lost connection, or to fetch it again)
    astral up --on lab1 --hold 60         astral up, doctor and clean run there the same way

Machines are named in the inventory (machines.yaml here, $ASTRAL_INVENTORY or
--inventory FILE): docs/remote.md has its format and the security model. A host key the
inventory's known_hosts file does not hold is refused; --accept-new-host-key records it
(trust on first use). Ctrl-C here is passed on there (the run tears down and its bundle is
still fetched); a second Ctrl-C stops waiting and leaves the command running there.

Exit status: the command's own there (setup.sh's, astral's); 8 when the machine cannot be
reached, refuses the connection or the host key, or the connection is lost (what runs there
goes on); 2 for a bad inventory or experiment (nothing is started).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.remote.inventory import Machine, inventory_path, load_inventory
from topologies.catalog import is_preset_name, resolve_fabric

if TYPE_CHECKING:
    from orchestrator.remote.operations import Upload
    from orchestrator.run.experiment import ExperimentSpec

# orchestrator.remote.operations (paramiko) is imported where it is used, so that every
# other astral command starts without loading an SSH library it does not need.


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "remote",
        help="set a remote machine up, fetch a remote run's bundle (see also --on)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    setup = actions.add_parser(
        "setup", help="copy this checkout there and run its setup.sh there (idempotent)"
    )
    setup.add_argument("machine", metavar="MACHINE", help="a machine of the inventory")
    add_connection_arguments(setup)
    setup.set_defaults(func=setup_command)
    fetch = actions.add_parser(
        "fetch", help="follow a run there to its end and copy its bundle into results/"
    )
    fetch.add_argument("machine", metavar="MACHINE", help="a machine of the inventory")
    fetch.add_argument("run", metavar="RUN", help="the run's name, as --on printed it")
    fetch.add_argument("--out", type=Path, metavar="DIR", help="here (default results/RUN)")
    add_connection_arguments(fetch)
    fetch.set_defaults(func=fetch_command)


def add_connection_arguments(parser: Any, when: str = "") -> None:
    """``--inventory`` and ``--accept-new-host-key`` (``when``: a prefix for their help)."""
    parser.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help=f"{when}the machines file (default $ASTRAL_INVENTORY, else machines.yaml)",
    )
    parser.add_argument(
        "--accept-new-host-key",
        action="store_true",
        help=f"{when}trust a host key seen for the first time, recording it in known_hosts",
    )


def add_on_arguments(parser: argparse.ArgumentParser) -> None:
    """``--on MACHINE`` and its connection options, for commands that can run there."""
    group = parser.add_argument_group("running on a remote machine (docs/remote.md)")
    group.add_argument(
        "--on", metavar="MACHINE", help="run there (a machine of the inventory) instead of here"
    )
    add_connection_arguments(group, "with --on: ")


def machine(args: argparse.Namespace, name: str) -> Machine:
    return load_inventory(inventory_path(args.inventory)).machine(name)


def setup_command(args: argparse.Namespace) -> int:
    from orchestrator.remote.operations import setup_machine

    return setup_machine(machine(args, args.machine), accept_new_host_key=args.accept_new_host_key)


def fetch_command(args: argparse.Namespace) -> int:
    from orchestrator.remote.jobs import check_job_id
    from orchestrator.remote.operations import fetch_run

    run = check_job_id(args.run)
    return fetch_run(
        machine(args, args.machine),
        run,
        args.out or Path("results") / run,
        accept_new_host_key=args.accept_new_host_key,
    )


def refuse(message: str) -> int:
    """A command-line combination that cannot run remotely (exit 2, nothing started)."""
    print(f"astral: error: {message}", file=sys.stderr)
    return 2


def run_on(args: argparse.Namespace, argv: list[str], fabric: str | None = None) -> int:
    """``astral ARGV`` on ``args.on``, without a bundle (up, doctor, clean). ``fabric``: a
    FABRIC argument, inserted after the command: a preset's name as it is, a file uploaded
    first and named by its place there."""
    from orchestrator.remote.jobs import new_job_id
    from orchestrator.remote.operations import files_dir, place, run_astral

    target = machine(args, args.on)
    job = new_job_id(argv[0])
    uploads = []
    if fabric is not None:
        path = resolve_fabric(fabric)  # an unknown preset fails here, before connecting
        if not is_preset_name(fabric) and path.is_file():
            upload = place(path, files_dir(job))
            uploads.append(upload)
            fabric = upload.there
        argv = [argv[0], fabric, *argv[1:]]
    return run_astral(
        target, argv, job_id=job, uploads=uploads, accept_new_host_key=args.accept_new_host_key
    )


def run_experiment_on(args: argparse.Namespace) -> int:
    """``astral run EXP --on MACHINE``: checked here, run there, its bundle brought here."""
    from orchestrator.remote.jobs import new_job_id
    from orchestrator.remote.operations import files_dir, run_astral
    from orchestrator.run.experiment import load_experiment
    from orchestrator.run.runner import DEFAULT_EXPERIMENT
    from orchestrator.study.spec import is_study, load_study
    from topologies.errors import ExperimentError
    from topologies.yamlfile import read_yaml

    target = machine(args, args.on)  # a bad inventory fails before anything else
    path = Path(args.experiment or DEFAULT_EXPERIMENT)
    # ExperimentError (exit 2) before anything starts there; a study: every variant's
    if is_study(read_yaml(path, ExperimentError, "experiment")):
        specs = [variant.spec for variant in load_study(path).variants]
    else:
        specs = [load_experiment(path)]
    run = new_job_id(specs[0].name)
    uploads = experiment_uploads(path, specs, files_dir(run))
    experiment = uploads[0]
    bundle = f"results/{run}"
    argv = ["run", experiment.there, "--out", bundle, "--timeout", f"{args.timeout:g}"]
    for flag, given in (
        ("--force", args.force),
        ("--no-calibrate", args.no_calibrate),
        ("--quiet", args.quiet),
        ("--no-plots", args.no_plots),
    ):
        if given:
            argv.append(flag)
    argv += [f"--worker-arg={value}" for value in args.worker_arg]
    return run_astral(
        target,
        argv,
        job_id=run,
        uploads=uploads,
        bundle=bundle,
        fetch_to=args.out or Path("results") / run,
        accept_new_host_key=args.accept_new_host_key,
    )


def experiment_uploads(path: Path, specs: Sequence[ExperimentSpec], directory: str) -> list[Upload]:
    """The experiment file first, then the files it names (each variant's fabric and
    workload), each placed where the experiment expects it there."""
    from orchestrator.remote.operations import place

    uploads = [place(path, directory)]
    named = [s.fabric_source for s in specs] + [s.workload_source for s in specs]
    for source in dict.fromkeys(n for n in named if n and n != "inline"):
        uploads.append(place(Path(source), directory, base=path.parent))
    return uploads
