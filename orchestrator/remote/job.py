"""The far side of a remote command: runs it detached from the SSH connection, into files.

    python3 orchestrator/remote/job.py DIR CWD TIMEOUT COMMAND...

Started over SSH by ``jobs.py``, it forks into a new session (so that a lost connection,
which ends the SSH session and its process group, does not end the command), prints the
pid of that detached process and returns at once. The detached process runs COMMAND in CWD
with stdout and stderr into ``DIR/stdout`` and ``DIR/stderr`` (unbuffered Python, so that
tables arrive as they are printed), and when it ends writes ``DIR/status`` (JSON: its exit
status, 128 + the signal when a signal ended it, and whether the TIMEOUT in seconds ran out)
by rename, so that whoever sees the file sees all of it. SIGINT and SIGTERM sent to the pid
are passed to COMMAND (Ctrl-C on this side becomes a SIGINT there: ``astral run`` tears down
as it does at a terminal); past TIMEOUT it gets SIGTERM, then SIGKILL 60 s later.

Standard library only, run by file path under the far side's system ``python3``: it must
work before ``setup.sh`` has made a ``.venv`` there (``astral remote setup`` is itself a job).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

GRACE = 60.0  # seconds between the timeout's SIGTERM and SIGKILL


def write_atomically(path: str, text: str) -> None:
    partial = path + ".partial"
    with open(partial, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.replace(partial, path)


def supervise(directory: str, cwd: str, timeout: float, command: list[str]) -> None:
    """The detached process: run ``command``, forward signals, record how it ended."""
    pending: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: object) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        else:
            pending.append(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    write_atomically(os.path.join(directory, "pid"), f"{os.getpid()}\n")  # now signals work
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with (
        open(os.path.join(directory, "stdout"), "ab") as out,
        open(os.path.join(directory, "stderr"), "ab") as err,
    ):
        try:
            child = subprocess.Popen(
                command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env
            )
        except OSError as error:
            err.write(f"job: cannot start {command[0]}: {error}\n".encode())
            err.flush()
            write_atomically(
                os.path.join(directory, "status"),
                json.dumps({"exit_status": 127, "timed_out": False, "finished": time.time()}),
            )
            return
    write_atomically(os.path.join(directory, "child"), f"{child.pid}\n")
    for signum in pending:
        child.send_signal(signum)
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        try:
            status = child.wait(timeout=max(0.1, deadline - time.monotonic()))
            break
        except subprocess.TimeoutExpired:
            if not timed_out:
                timed_out = True
                child.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + GRACE
            else:
                child.kill()
    exit_status = status if status >= 0 else 128 - status
    write_atomically(
        os.path.join(directory, "status"),
        json.dumps({"exit_status": exit_status, "timed_out": timed_out, "finished": time.time()}),
    )


def main(argv: list[str]) -> int:
    if len(argv) < 4:
        print("usage: job.py DIR CWD TIMEOUT COMMAND...", file=sys.stderr)
        return 2
    directory, cwd, timeout, command = argv[0], argv[1], float(argv[2]), argv[3:]
    os.makedirs(directory, exist_ok=True)
    pid_file = os.path.join(directory, "pid")
    pid = os.fork()
    if pid:
        # Return once the detached process is ready for signals (its pid file written
        # after its handlers are set), so that an immediate Ctrl-C is not lost.
        for _ in range(200):
            if os.path.exists(pid_file):
                print(pid, flush=True)
                return 0
            time.sleep(0.05)
        print(f"job: the detached process {pid} did not start", file=sys.stderr)
        return 1
    os.setsid()  # a session of its own: the SSH session's end does not reach it
    null = os.open(os.devnull, os.O_RDWR)
    log = os.open(os.path.join(directory, "job.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        supervise(directory, cwd, timeout, command)
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
