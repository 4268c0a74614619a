"""This side of a command running there as a job (``job.py`` is the far side).

A job lives in a directory of the far side's checkout, ``.astral-remote/jobs/<id>/``:
``command.json`` (what was started, by whom, and the bundle it writes, written from here
before it starts), ``pid`` (the detached supervisor), ``stdout``, ``stderr`` and, once it
ended, ``status``. Everything about it is in those files, so that following it is reading
them over SFTP: the same whether this side started it a second ago or lost its connection
an hour ago and came back (``astral remote fetch``). Each poll is a few SFTP requests, each
bounded by the idle timeout, which is how a silent network is noticed.

Ctrl-C (or SIGTERM) here while following is not a KeyboardInterrupt in the middle of an
SFTP request: a handler notes it, the loop sends the same signal to the job there (which
passes it to the command), and keeps following until the command has ended, so that its
teardown output arrives and its bundle can still be fetched. A second Ctrl-C stops waiting
and leaves the job to finish there.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, BinaryIO, TypeVar

import paramiko

from orchestrator.remote.connection import Connection
from orchestrator.remote.inventory import NAME
from orchestrator.remote.sync import make_dirs, remote_stat
from topologies.errors import RemoteError

JOBS_DIR = ".astral-remote/jobs"
JOB_SCRIPT = "orchestrator/remote/job.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # setup.sh's: the job must run before any .venv exists
POLL_SECONDS = 0.25
READ_CHUNK = 1 << 20

T = TypeVar("T")


@dataclass(frozen=True)
class Ended:
    """How a job ended there."""

    exit_status: int
    timed_out: bool


def new_job_id(what: str) -> str:
    """``20261201T223000-default``: the time, then what runs (an experiment's name)."""
    return f"{datetime.now().strftime('%Y%m%dT%H%M%S')}-{what}"


def check_job_id(job_id: str) -> str:
    if not NAME.match(job_id):
        raise RemoteError(
            f"{job_id!r} is not a run name (letters, digits, '.', '_', '-'), "
            "such as 20261201T223000-default"
        )
    return job_id


@dataclass
class Signals:
    """SIGINT and SIGTERM received while following (the handler only counts them)."""

    received: list[int] = field(default_factory=list)
    sent: int = 0  # how many of them were passed on to the job

    def handler(self, signum: int, frame: object) -> None:
        self.received.append(signum)


@contextmanager
def caught_signals() -> Iterator[Signals]:
    signals = Signals()
    previous = {s: signal.signal(s, signals.handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield signals
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class RemoteJob:
    """One job there, by its id."""

    def __init__(self, ssh: Connection, job_id: str) -> None:
        self.ssh = ssh
        self.id = check_job_id(job_id)
        self.project = ssh.machine.project
        self.dir = str(PurePosixPath(self.project) / JOBS_DIR / job_id)
        self.offsets = {"stdout": 0, "stderr": 0}

    def path(self, name: str) -> str:
        return f"{self.dir}/{name}"

    @property
    def sftp(self) -> paramiko.SFTPClient:
        return self.ssh.sftp()

    def exists(self) -> bool:
        return (
            self._sftp_call(lambda: remote_stat(self.sftp, self.path("command.json"))) is not None
        )

    def start(self, argv: Sequence[str], meta: dict[str, Any]) -> int:
        """Start ``argv`` there (cwd: the checkout), detached; the supervisor's pid."""

        def prepare() -> None:
            if remote_stat(self.sftp, self.dir) is not None:
                raise RemoteError(f"{self.ssh.name}: a job {self.id} exists there already")
            make_dirs(self.sftp, PurePosixPath(self.dir), set())
            document = {**meta, "argv": list(argv), "started": time.time()}
            with self.sftp.open(self.path("command.json"), "w") as stream:
                stream.write(json.dumps(document, indent=2) + "\n")

        self._sftp_call(prepare)
        timeout = self.ssh.machine.timeouts.command
        script = str(PurePosixPath(self.project) / JOB_SCRIPT)
        out = self.ssh.check([SYSTEM_PYTHON, script, self.dir, self.project, f"{timeout:g}", *argv])
        return int(out.strip().splitlines()[-1])

    def meta(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            with self.sftp.open(self.path("command.json"), "r") as stream:
                document: dict[str, Any] = json.loads(stream.read())
            return document

        return self._sftp_call(read)

    def ended(self) -> Ended | None:
        def read() -> Ended | None:
            try:
                with self.sftp.open(self.path("status"), "r") as stream:
                    document = json.loads(stream.read())
            except FileNotFoundError:
                return None
            return Ended(int(document["exit_status"]), bool(document.get("timed_out")))

        return self._sftp_call(read)

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the supervisor there, which passes it to the command."""
        pid = self._sftp_call(lambda: self._read_text("pid")).strip()
        if not pid.isdigit():
            raise RemoteError(f"{self.ssh.name}: job {self.id} has no pid file")
        self.ssh.run(["kill", f"-{signal.Signals(signum).name.removeprefix('SIG')}", pid])

    def drain(self, streams: dict[str, BinaryIO]) -> bool:
        """Copy what the job wrote since the last call to ``streams``; whether anything
        was new."""

        def read() -> bool:
            new = False
            for name, stream in streams.items():
                attributes = remote_stat(self.sftp, self.path(name))
                size = attributes.st_size if attributes is not None else 0
                if not size or size <= self.offsets[name]:
                    continue
                with self.sftp.open(self.path(name), "rb") as remote:
                    remote.seek(self.offsets[name])
                    while self.offsets[name] < size:
                        data = remote.read(min(READ_CHUNK, size - self.offsets[name]))
                        if not data:
                            break
                        stream.write(data)
                        self.offsets[name] += len(data)
                stream.flush()
                new = True
            return new

        return self._sftp_call(read)

    def follow(self, streams: dict[str, BinaryIO], say: Callable[[str], None]) -> Ended:
        """Copy the job's output here as it comes until it ends; how it ended. Ctrl-C or
        SIGTERM here is passed on to it (see the module docstring); a second one stops
        following and raises RemoteError saying the job goes on there."""
        with caught_signals() as signals:
            while True:
                ended = self.ended()
                self.drain(streams)
                if ended is not None:
                    return ended
                while len(signals.received) > signals.sent:
                    signum = signals.received[signals.sent]
                    signals.sent += 1
                    if signals.sent > 1:
                        raise RemoteError(
                            f"stopped following job {self.id} on {self.ssh.machine.name}; it "
                            "goes on there (astral remote fetch "
                            f"{self.ssh.machine.name} {self.id} follows it again)"
                        )
                    say(
                        f"{signal.Signals(signum).name} here: passing it to the run on "
                        f"{self.ssh.machine.name}, waiting for it to end (again: stop waiting)"
                    )
                    self.signal(signum)
                time.sleep(POLL_SECONDS)

    def _read_text(self, name: str) -> str:
        try:
            with self.sftp.open(self.path(name), "r") as stream:
                text: str = stream.read().decode()
        except FileNotFoundError:
            return ""
        return text

    def _sftp_call(self, call: Callable[[], T]) -> T:
        """``call()``, with a broken or silent connection turned into its sentence."""
        try:
            return call()
        except (RemoteError, FileNotFoundError, PermissionError):
            raise
        except (paramiko.SSHException, OSError, EOFError) as error:
            raise self.ssh.lost(error) from None
