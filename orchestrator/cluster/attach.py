"""Run a command inside a GPU's namespace on this machine for a run on another one.

``python -m orchestrator.cluster.attach --pid PID --starttime T -- ARGV...`` is what the
machine holding a cluster run starts over SSH to put a worker (or any command) into a GPU
of this machine's part of the fabric: it enters the namespace of the GPU's shell (``PID``,
checked against its recorded start time so that a recycled pid is never entered), runs
ARGV there and exits with its status.

It also ties the command's life to the SSH session's: when its stdin reaches end of file
(the session closed: the run's side stopped it, lost the connection or was killed) it
stops the command, SIGTERM then SIGKILL. Without this a remote command whose session is
gone would run on unseen, as ``sshd`` signals nothing to a command without a terminal.
SIGTERM, SIGINT and SIGHUP sent to it are passed on. With ``--stdin`` the command reads
the session's stdin itself (a command run to completion with input, such as ``ip -batch
-``) and ends with it. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType

GRACE_S = 2.0


def starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator.cluster.attach")
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--starttime", type=int, required=True)
    parser.add_argument("--stdin", action="store_true", help="the command reads stdin")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    if starttime(args.pid) != args.starttime:
        print(f"attach: the namespace's shell {args.pid} is gone", file=sys.stderr)
        return 125
    child = subprocess.Popen(
        ["nsenter", "-t", str(args.pid), "-n", "--", *command],
        stdin=None if args.stdin else subprocess.DEVNULL,
        start_new_session=True,
    )

    def stop(signum: int = signal.SIGTERM) -> None:
        try:
            os.killpg(child.pid, signum)
            child.wait(GRACE_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def pass_on(signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)

    def watch_session() -> None:
        while sys.stdin.buffer.read(65536):
            pass
        if child.poll() is None:
            stop()

    if not args.stdin:
        threading.Thread(target=watch_session, daemon=True).start()
    return child.wait()


if __name__ == "__main__":
    sys.exit(main())
