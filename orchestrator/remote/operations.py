"""What ``astral remote ...`` and ``--on MACHINE`` do, from connection to exit status.

- :func:`setup_machine`: copy the checkout's tracked files there (``sync.py``), then run its
  ``setup.sh`` there as a job, its output streamed here; the job's exit status is returned.
- :func:`run_astral`: run ``astral ARGS`` in the checkout there as a job (files it reads
  uploaded first), stream its stdout and stderr here as they come, and, for ``astral run``,
  copy its bundle into a directory here when it ends, whether it ended well, failed or was
  interrupted from here. A lost connection leaves it running there: the error says how
  :func:`fetch_run` gets it later.
- :func:`fetch_run`: follow a job there from its start (whatever it has printed, then what
  it prints until it ends) and copy its bundle here.

The exit status returned is always the far side's command's own; this side's own failures
(unreachable, refused, lost) are RemoteError (exit 8).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from orchestrator import REPO
from orchestrator.remote.connection import Connection, ConnectionLost
from orchestrator.remote.inventory import REMOTE_PATH, Machine
from orchestrator.remote.jobs import JOBS_DIR, Ended, RemoteJob, new_job_id
from orchestrator.remote.sync import fetch_tree, push_tree, remote_stat, tracked_files
from topologies.errors import RemoteError

Say = Callable[[str], None]
UPLOADS_DIR = ".astral-remote/files"
ASTRAL = ".venv/bin/astral"  # relative to the checkout there, where jobs start
# job.py sets it too, but `sudo` resets the environment: tables must arrive as printed
UNBUFFERED = ["env", "PYTHONUNBUFFERED=1"]


@dataclass
class Console:
    """Where a job's output goes here, and this side's own status lines."""

    stdout: BinaryIO = field(default_factory=lambda: sys.stdout.buffer)
    stderr: BinaryIO = field(default_factory=lambda: sys.stderr.buffer)
    say: Say = field(default=lambda message: print(f"astral: {message}", file=sys.stderr))

    def streams(self) -> dict[str, BinaryIO]:
        return {"stdout": self.stdout, "stderr": self.stderr}


@dataclass(frozen=True)
class Upload:
    """A file this side has that the command there reads: ``local`` goes to ``there``
    (relative to the checkout there), which is what the command line names."""

    local: Path
    there: str


def place(path: Path, files_dir: str, base: Path | None = None) -> Upload:
    """Where a file named on the command line goes there. Inside this checkout: the same
    relative path in the checkout there (a fabric file an experiment names relatively is
    then where it expects it). Elsewhere: under ``files_dir`` (one directory per job),
    at its path relative to ``base`` (the experiment's directory, for its fabric file)
    or by its name. The path there must be plain characters: it reaches a command line."""
    resolved = path.resolve()
    try:
        there = str(PurePosixPath(resolved.relative_to(REPO).as_posix()))
    except ValueError:
        relative = resolved.name
        if base is not None:
            try:
                relative = resolved.relative_to(base.resolve()).as_posix()
            except ValueError:
                raise RemoteError(
                    f"{path} is neither in this checkout nor under {base}: copy it next to "
                    "the file that names it, or into the checkout, to run it remotely"
                ) from None
        there = f"{files_dir}/{relative}"
    if not REMOTE_PATH.match(there):
        raise RemoteError(
            f"{path}: its path there, {there!r}, has characters other than letters, digits "
            "and . _ / + -; rename it to run it remotely"
        )
    return Upload(path, there)


def files_dir(job_id: str) -> str:
    return f"{UPLOADS_DIR}/{job_id}"


def setup_machine(
    machine: Machine, *, accept_new_host_key: bool = False, console: Console | None = None
) -> int:
    """``astral remote setup MACHINE``; the exit status of setup.sh there."""
    console = console or Console()
    with Connection(machine, accept_new_host_key=accept_new_host_key) as ssh:
        _greet(ssh, console)
        files = tracked_files(REPO)
        try:
            copied = push_tree(ssh.sftp(), REPO, machine.project, files)
        except (OSError, EOFError) as error:
            raise ssh.lost(error) from None
        console.say(
            f"{ssh.name}: {copied.sent} of {copied.files} tracked files sent to "
            f"{machine.project} ({copied.sent_bytes} bytes; the others were up to date)"
        )
        job = RemoteJob(ssh, _unique(ssh, "setup"))
        job.start([*ssh.sudo, "./setup.sh"], {"what": "setup"})
        _announce(job, "setup.sh", console)
        return _follow(job, console).exit_status


def run_astral(
    machine: Machine,
    argv: Sequence[str],
    *,
    job_id: str,
    uploads: Sequence[Upload] = (),
    bundle: str | None = None,
    fetch_to: Path | None = None,
    accept_new_host_key: bool = False,
    console: Console | None = None,
) -> int:
    """``astral ARGV`` in the checkout there; its exit status. ``bundle``: the directory
    (relative to the checkout there) the command writes, copied to ``fetch_to`` when it
    ends."""
    console = console or Console()
    with Connection(machine, accept_new_host_key=accept_new_host_key) as ssh:
        _greet(ssh, console)
        _require_setup(ssh)
        try:
            for upload in uploads:
                _upload(ssh, upload)
        except (OSError, EOFError) as error:
            raise ssh.lost(error) from None
        job = RemoteJob(ssh, job_id)
        job.start([*ssh.sudo, *UNBUFFERED, ASTRAL, *argv], {"what": argv[0], "bundle": bundle})
        _announce(job, f"astral {argv[0]}", console)
        ended = _follow(job, console)
        if bundle is not None and fetch_to is not None:
            _fetch_bundle(job, bundle, fetch_to, console)
        return _reported(ended, console)


def fetch_run(
    machine: Machine,
    job_id: str,
    fetch_to: Path,
    *,
    accept_new_host_key: bool = False,
    console: Console | None = None,
) -> int:
    """``astral remote fetch MACHINE RUN``: follow the job from its start, then copy its
    bundle; the job's exit status."""
    console = console or Console()
    with Connection(machine, accept_new_host_key=accept_new_host_key) as ssh:
        _greet(ssh, console)
        job = RemoteJob(ssh, job_id)
        if not job.exists():
            raise RemoteError(
                f"{ssh.name}: no job {job_id} in {machine.project}/{JOBS_DIR}; there: "
                + (", ".join(_jobs(ssh)[-5:]) or "none")
            )
        meta = job.meta()
        if job.ended() is None:
            console.say(f"job {job_id} is still running on {ssh.name}: following it")
        ended = _follow(job, console)
        bundle = meta.get("bundle")
        if isinstance(bundle, str):
            _fetch_bundle(job, bundle, fetch_to, console)
        else:
            console.say(f"job {job_id} ({meta.get('what', '?')}) writes no bundle")
        return _reported(ended, console)


# -- the pieces ---------------------------------------------------------------------------


def _greet(ssh: Connection, console: Console) -> None:
    if ssh.accepted_key:
        console.say(
            f"{ssh.name}: host key {ssh.accepted_key} accepted and recorded in "
            f"{ssh.machine.known_hosts}"
        )


def _announce(job: RemoteJob, what: str, console: Console) -> None:
    name = job.ssh.machine.name
    console.say(
        f"{what} on {job.ssh.name} as job {job.id} (should the connection drop: "
        f"astral remote fetch {name} {job.id})"
    )


def _require_setup(ssh: Connection) -> None:
    project = ssh.machine.project
    try:
        found = remote_stat(ssh.sftp(), f"{project}/{ASTRAL}")
    except (OSError, EOFError) as error:
        raise ssh.lost(error) from None
    if found is None:
        raise RemoteError(
            f"{ssh.name}: no astral set up in {project} there; run "
            f"'astral remote setup {ssh.machine.name}' first"
        )


def _upload(ssh: Connection, upload: Upload) -> None:
    local = upload.local.resolve()
    target = PurePosixPath(ssh.machine.project) / PurePosixPath(upload.there).parent
    push_tree(ssh.sftp(), local.parent, str(target), [local.name])


def _unique(ssh: Connection, what: str) -> str:
    """A new job id; ``-2``, ``-3``... when one started in the same second."""
    base = new_job_id(what)
    job_id, n = base, 1
    while RemoteJob(ssh, job_id).exists():
        n += 1
        job_id = f"{base}-{n}"
    return job_id


def _jobs(ssh: Connection) -> list[str]:
    try:
        return sorted(ssh.sftp().listdir(f"{ssh.machine.project}/{JOBS_DIR}"))
    except FileNotFoundError:
        return []
    except (OSError, EOFError) as error:
        raise ssh.lost(error) from None


def _follow(job: RemoteJob, console: Console) -> Ended:
    try:
        return job.follow(console.streams(), console.say)
    except ConnectionLost as lost:
        raise ConnectionLost(
            f"{lost}. The job goes on there; 'astral remote fetch {job.ssh.machine.name} "
            f"{job.id}' follows it to its end and brings its results home"
        ) from None


def _fetch_bundle(job: RemoteJob, bundle: str, fetch_to: Path, console: Console) -> None:
    ssh = job.ssh
    source = f"{ssh.machine.project}/{bundle}"
    try:
        if remote_stat(ssh.sftp(), source) is None:
            console.say(f"{ssh.name}: the command left no bundle ({source})")
            return
        count = fetch_tree(ssh.sftp(), source, fetch_to)
    except (OSError, EOFError) as error:
        raise ssh.lost(error) from None
    console.say(f"bundle fetched from {ssh.machine.name}: {fetch_to} ({count} files copied)")


def _reported(ended: Ended, console: Console) -> int:
    if ended.timed_out:
        console.say(
            f"the command there ran out of its time (timeouts.command) and was stopped "
            f"(exit status {ended.exit_status})"
        )
    return ended.exit_status
