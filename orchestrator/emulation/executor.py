"""Running commands where the fabric lives: the seam a remote or multi-machine backend fills.

Everything the layers above do to a running fabric outside OpenFlow is a command in a
namespace: ``ip route get`` in a GPU (pinning), ``ip link set`` on a switch port (faults),
``tc`` on either end (shaping), a worker process in a GPU. On one machine those are
``mnexec`` into the GPU's namespace and plain ``subprocess`` in the root namespace, where the
switches' ports live; :class:`orchestrator.emulation.network.Emulation` implements this
protocol that way. An SSH backend (one machine in the lab) or a cluster backend (a fabric
spread over several) implements the same two methods, and the callers do not change.

A *node* is a name of the fabric model: a GPU runs the command in its namespace, any other
node (a switch, whose ports are root-namespace interfaces) or ``None`` in the root namespace
of the machine that holds it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.emulation.state import proc_starttime


@dataclass(frozen=True)
class Completed:
    """What a finished command left: its argv, exit status and output (decoded)."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class CommandExecutor(Protocol):
    """Runs or starts commands on a node of a running fabric (see the module docstring)."""

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        """Run ``argv`` on ``node`` to completion (no shell), ``input`` on its stdin."""
        ...

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``gpu``'s namespace, owned by the run (teardown stops it)."""
        ...


def run_local(argv: Sequence[str], *, input: str | None = None, timeout: float = 30.0) -> Completed:
    """``argv`` in this process's namespace, as a :class:`Completed`; a program that is not
    installed completes with status 127 and says so (as a shell would), so that the caller's
    error names the command instead of a traceback reaching the user."""
    try:
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
        )
    except FileNotFoundError:
        return Completed(
            tuple(argv), 127, "", f"{argv[0]}: not installed (sudo ./setup.sh installs it)"
        )
    return Completed(tuple(argv), result.returncode, result.stdout, result.stderr)


class NamespaceExecutor:
    """A :class:`CommandExecutor` for a fabric another process holds (``astral up``), from
    its run record: a GPU's commands enter its namespace through its shell's pid
    (``nsenter -t PID -n``; the pid is checked against the shell's recorded start time
    first, so a recycled pid is never entered), every other node's run in the root
    namespace. It starts no processes: those belong to the fabric's owner."""

    def __init__(self, shells: dict[str, tuple[int, int | None]]) -> None:
        self.shells = shells  # GPU -> (shell pid, its start time)

    def run(
        self,
        node: str | None,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
    ) -> Completed:
        if node is None or node not in self.shells:
            return run_local(argv, input=input, timeout=timeout)
        pid, starttime = self.shells[node]
        if starttime is None or proc_starttime(pid) != starttime:
            return Completed(tuple(argv), 1, "", f"the namespace of {node} is gone (pid {pid})")
        entered = ["nsenter", "-t", str(pid), "-n", "--", *argv]
        return run_local(entered, input=input, timeout=timeout)

    def popen(self, gpu: str, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError("a held fabric's processes belong to its owner")
