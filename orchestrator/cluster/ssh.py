"""OpenSSH command lines to a cluster's machines, from the inventory (docs/cluster.md).

The cluster edition of Mininet (``mininet.examples.cluster``) reaches its servers with the
``ssh`` client, not a library: its remote nodes are processes whose stdin, stdout and
exit status travel over one SSH session each, which is what a worker or a machine's part
of the fabric needs (a ``subprocess.Popen`` the launcher can poll, kill and read). This
module builds those command lines the way the project's own SSH layer connects
(orchestrator.remote): the inventory's address, port, user and key, the host key checked
against the inventory's ``known_hosts`` (``StrictHostKeyChecking=yes``: an unknown or
changed key is refused; ``astral remote setup MACHINE --accept-new-host-key`` records it
first), never a password (``BatchMode=yes``), and ``sudo -n`` where the user is not root.
Every remote command is an argument list joined with ``shlex.join``.

A session's end is how a machine learns that the run that started something is gone: the
part of the fabric there (orchestrator.cluster.part) and every process started through
:func:`orchestrator.cluster.attach` end when their session's stdin closes, which happens
when the process holding it here exits, however it exits (kill -9 included).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from orchestrator.emulation.executor import Completed
from orchestrator.remote.inventory import Endpoint, Machine

LOCAL = "localhost"  # the machine a cluster run starts on, as Mininet's cluster edition names it

# Seconds between keep-alives, and how many may go unanswered: a silent machine is a lost
# one after about half a minute, not after TCP's quarter of an hour.
ALIVE_INTERVAL = 5
ALIVE_COUNT = 6


@dataclass(frozen=True)
class SshMachine:
    """A machine of the inventory as the ``ssh`` client reaches it."""

    machine: Machine
    endpoint: Endpoint
    # A master connection's socket (``ssh -M``, :meth:`master_argv`): commands run to
    # completion (:meth:`run`) share its login instead of making their own.
    control: Path | None = None

    @classmethod
    def of(cls, machine: Machine) -> SshMachine:
        return cls(machine, machine.endpoint())

    @property
    def name(self) -> str:
        return self.machine.name

    @property
    def host(self) -> str:
        return self.endpoint.host

    @property
    def project(self) -> PurePosixPath:
        """The checkout there; relative paths are under the login's home, where an SSH
        command starts."""
        return PurePosixPath(self.machine.project)

    @property
    def python(self) -> str:
        """The checkout's own interpreter there (``setup.sh`` makes its ``.venv``)."""
        return str(self.project / ".venv" / "bin" / "python")

    def options(self) -> list[str]:
        endpoint = self.endpoint
        argv = [
            "-p", str(endpoint.port),
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.machine.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={max(1, round(self.machine.timeouts.connect))}",
            "-o", f"ServerAliveInterval={ALIVE_INTERVAL}",
            "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
            "-o", "LogLevel=ERROR",
        ]  # fmt: skip
        if endpoint.key_file is not None:
            argv += ["-i", str(endpoint.key_file), "-o", "IdentitiesOnly=yes"]
        return argv

    def argv(
        self,
        remote: Sequence[str],
        *,
        forwards: Sequence[tuple[str, str]] = (),
        connected: Path | None = None,
        multiplexed: bool = False,
    ) -> list[str]:
        """The local command line that runs ``remote`` there as root; ``forwards``:
        (path there, path here) Unix sockets forwarded from there to here (``-R``);
        ``connected``: a file ssh creates here once it is logged in (``LocalCommand``)."""
        command = ["ssh", *self.options(), "-T"]
        if multiplexed and self.control is not None:
            # without the socket (the master gone) ssh logs in by itself
            command += ["-o", f"ControlPath={self.control}", "-o", "ControlMaster=no"]
        if connected is not None:
            command += ["-o", "PermitLocalCommand=yes"]
            command += ["-o", f"LocalCommand=touch {shlex.quote(str(connected))}"]
        for there, here in forwards:
            command += ["-o", "StreamLocalBindUnlink=yes", "-R", f"{there}:{here}"]
            command += ["-o", "ExitOnForwardFailure=yes"]
        sudo = ["sudo", "-n", "--"] if self.machine.uses_sudo(self.endpoint) else []
        user_host = f"{self.endpoint.user}@{self.endpoint.host}"
        return [*command, user_host, "--", shlex.join([*sudo, *remote])]

    def master_argv(self, control: Path) -> list[str]:
        """A master connection holding ``control`` for :meth:`run`'s commands: a login
        costs 0.1-0.4 s, a session over an open connection a few milliseconds, which is
        what a fault on another machine's link needs to start on time. Only short
        commands share it (``sshd``'s ``MaxSessions``, 10 by default, bounds a
        connection's sessions); workers log in on their own."""
        return [
            "ssh", *self.options(), "-M", "-N", "-o", f"ControlPath={control}",
            "-o", "ControlPersist=no", f"{self.endpoint.user}@{self.endpoint.host}",
        ]  # fmt: skip

    def run_in(
        self,
        shell: tuple[int, int] | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        """``argv`` to completion there: in the namespace of the GPU whose shell is
        ``shell`` (pid, start time), or in the root namespace (a switch's ports) for None.
        The command has the session's stdin (empty without ``input``)."""
        if shell is None:
            return self.run(argv, input=input, timeout=timeout)
        pid, starttime = shell
        return self.run(self.attach(pid, starttime, argv, stdin=True), input=input, timeout=timeout)

    def forward_argv(self, here: str, there: str) -> list[str]:
        """A session that only forwards the Unix socket ``there`` to ``here`` (``-L``)."""
        return [
            "ssh", *self.options(), "-N",
            "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
            "-L", f"{here}:{there}", f"{self.endpoint.user}@{self.endpoint.host}",
        ]  # fmt: skip

    def run(
        self, remote: Sequence[str], *, input: str | None = None, timeout: float = 30.0
    ) -> Completed:
        """Run ``remote`` there to completion; an SSH failure is status 255, as ssh's."""
        try:
            result = subprocess.run(
                self.argv(remote, multiplexed=True),
                input=input,
                stdin=subprocess.DEVNULL if input is None else None,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return Completed(tuple(remote), 124, "", f"no answer from {self.name} in {timeout:g} s")
        return Completed(tuple(remote), result.returncode, result.stdout, result.stderr)

    def popen(
        self,
        remote: Sequence[str],
        *,
        forwards: Sequence[tuple[str, str]] = (),
        logged_in: Path | None = None,
        **kwargs: Any,
    ) -> subprocess.Popen[bytes]:
        """Start ``remote`` there; it lives as long as this process's session (see the
        module docstring): pass ``stdin=subprocess.PIPE`` to keep that in hand.

        ``logged_in``: a scratch file; return only once the login is done (ssh creates it)
        or the session ended. ``sshd`` drops connections beyond ``MaxStartups`` (10 by
        default) that have not logged in yet, so a burst of workers logs in one by one."""
        argv = self.argv(remote, forwards=forwards, connected=logged_in)
        process = subprocess.Popen(argv, **kwargs)
        if logged_in is not None:
            deadline = time.monotonic() + self.machine.timeouts.connect + 5
            while not logged_in.exists() and process.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            with contextlib.suppress(FileNotFoundError):
                logged_in.unlink()
        return process

    def attach(
        self, pid: int, starttime: int, argv: Sequence[str], *, stdin: bool = False
    ) -> list[str]:
        """``argv`` in the namespace of GPU shell ``pid`` there (orchestrator.cluster.attach);
        ``stdin``: the command reads the session's input (it then ends with it)."""
        return [
            "env", "-C", str(self.project), f"PYTHONPATH={self.project}", "PYTHONUNBUFFERED=1",
            self.python, "-m", "orchestrator.cluster.attach",
            "--pid", str(pid), "--starttime", str(starttime),
            *(["--stdin"] if stdin else []), "--", *argv,
        ]  # fmt: skip

    def astral(self, args: Sequence[str]) -> list[str]:
        """``astral ARGS`` there, in its checkout (the command line for :meth:`run`)."""
        return ["env", "-C", str(self.project), self.python, "-m", "orchestrator.cli", *args]
