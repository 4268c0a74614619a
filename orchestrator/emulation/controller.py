"""The controller process: started, watched and stopped by the orchestrator.

The SDN controller runs as its own process (``python -m controllers``, docs/architecture.md):
:class:`ControllerProcess` owns it. It picks a free TCP port on 127.0.0.1, starts the
process in its own process group with stdout and stderr appended to ``controller.log`` in
the run directory, and learns everything else from the status file the controller keeps
(``controller-status.json``, format in :mod:`controllers.status`)::

    with ControllerProcess("runs/x/fabric.json", "runs/x") as controller:
        # switches: ovs-vsctl set-controller BR tcp:127.0.0.1:<controller.port>
        controller.wait_programmed(timeout=60)      # every switch connected + programmed
        ...
        controller.restart()                        # same port: switches reconnect
    # stopped: SIGTERM to its process group, SIGKILL after a grace period

Crash cleanup: the process is not our child any more after the orchestrator died, and its
pid may have been reused. Record ``(pid, starttime)`` (``ControllerProcess.on_start`` is
called after every start, before waiting, so a record can be written at once) and stop it
with :func:`stop_recorded`, which checks ``/proc/<pid>/stat``'s start time first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import IO

from controllers.status import EXIT_LISTEN_FAILED, ControllerStatus, read_status
from orchestrator import REPO
from topologies.errors import EmulationError

LOG_NAME = "controller.log"
STATUS_NAME = "controller-status.json"
TELEMETRY_NAME = (
    "telemetry.jsonl"  # format: docs/telemetry.md; reader: orchestrator.testbed.telemetry
)
START_TIMEOUT = 30.0  # import os-ken, read the description, bind: about 1 s here
STOP_TIMEOUT = 5.0
PORT_ATTEMPTS = 3
POLL = 0.05


def proc_starttime(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), None if gone.

    A zombie (exited, not yet reaped by its parent) counts as gone.
    """
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as src:
            stat = src.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain anything; split after it.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return None if fields[0] == "Z" else int(fields[19])
    except (IndexError, ValueError):
        return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the controller retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def stop_recorded(pid: int, starttime: int, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop a controller recorded by an earlier run, if ``pid`` is still that process.

    SIGTERM to its process group (the controller leads its own), SIGKILL after ``timeout``.
    Returns True if it was running.
    """
    if proc_starttime(pid) != starttime:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc_starttime(pid) != starttime:
            return True
        time.sleep(POLL)
    if proc_starttime(pid) == starttime:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return True


def controller_env() -> dict[str, str]:
    """The controller process's environment: ours, with ``-m controllers`` resolving to
    this tree even without an installed package, and its output unbuffered (its log)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ControllerProcess:
    """One controller process for one run; a context manager (start on enter, stop on exit).

    ``port`` is fixed by the first successful start (given, or a free one) and kept by
    :meth:`restart`, so switches find the new process where the old one was.
    """

    def __init__(
        self,
        description: str | Path,
        run_dir: str | Path,
        *,
        policy: str = "shortest",
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "INFO",
        python: str = sys.executable,
        start_timeout: float = START_TIMEOUT,
        on_start: Callable[[ControllerProcess], None] | None = None,
        telemetry_interval: float | None = None,
    ) -> None:
        self.description = Path(description)
        self.run_dir = Path(run_dir)
        self.policy = policy
        self.host = host
        self._port = port
        self._port_fixed = port is not None  # given, or kept from the first start
        self.log_level = log_level
        self.python = python
        self.start_timeout = start_timeout
        self.on_start = on_start
        self.log_path = self.run_dir / LOG_NAME
        self.status_path = self.run_dir / STATUS_NAME
        # Poll the switches' counters this often into telemetry_path (None: no file).
        self.telemetry_interval = telemetry_interval
        self.telemetry_path = self.run_dir / TELEMETRY_NAME
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.starttime: int | None = None

    # --- identity ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmulationError("the controller has no port yet: start it first")
        return self._port

    @property
    def pid(self) -> int | None:
        """The running process's pid (None before start and after stop)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def target(self) -> str:
        """What to give ``ovs-vsctl set-controller``."""
        return f"tcp:{self.host}:{self.port}"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> ControllerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> ControllerProcess:
        """Start the process and wait until it listens; raise EmulationError if it cannot."""
        if self.running():
            raise EmulationError(f"the controller is already running (pid {self.pid})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        code: int | None = None
        for attempt in range(PORT_ATTEMPTS):
            if self._port is None or (attempt and not self._port_fixed):
                self._port = free_port(self.host)
            self._spawn()
            code = self._wait_listening()
            if code is None:
                # The port is now the controller's: keep it across restarts.
                self._port_fixed = True
                return self
            self._reap()
            if code != EXIT_LISTEN_FAILED or self._port_fixed:
                break
        raise EmulationError(
            f"the controller did not start (exit status {code}, port {self._port}); "
            f"{self.log_path} ends with:\n{self.log_tail()}"
        )

    def _argv(self) -> list[str]:
        return [
            self.python,
            "-m",
            "controllers",
            "--fabric",
            str(self.description),
            "--policy",
            self.policy,
            "--listen-host",
            self.host,
            "--port",
            str(self.port),
            "--status",
            str(self.status_path),
            "--log-level",
            self.log_level,
            *(
                ()
                if self.telemetry_interval is None
                else (
                    "--telemetry",
                    str(self.telemetry_path),
                    "--telemetry-interval",
                    str(self.telemetry_interval),
                )
            ),
        ]

    def _spawn(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.status_path.unlink()  # never read an earlier process's status
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in _reap
        argv = self._argv()
        self._log.write(f"--- {time.strftime('%F %T')} starting: {' '.join(argv)}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=controller_env(),
            start_new_session=True,  # its own process group: stop() signals exactly it
        )
        self.starttime = proc_starttime(self._proc.pid)
        if self.on_start is not None:
            self.on_start(self)

    def _wait_listening(self) -> int | None:
        """None once the controller listens, else its exit status (or -1 on timeout)."""
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                return code
            status = self.status()
            if status is not None and status.listening:
                return None
            time.sleep(POLL)
        self._terminate()
        return -1

    def status(self) -> ControllerStatus | None:
        """The running process's status file, None until it wrote one (or if stale)."""
        try:
            status = read_status(self.status_path)
        except (ValueError, KeyError, TypeError):
            return None
        if status is None or self._proc is None or status.pid != self._proc.pid:
            return None
        return status

    def wait_programmed(
        self, dpids: Iterable[int] | None = None, timeout: float = 60.0
    ) -> ControllerStatus:
        """Wait until every switch of ``dpids`` (default: all the fabric's) is programmed.

        Raises EmulationError with the log's tail if the process dies or time runs out.
        """
        wanted = None if dpids is None else sorted(set(dpids))
        deadline = time.monotonic() + timeout
        status: ControllerStatus | None = None
        while True:
            if self._proc is None:
                raise EmulationError("the controller is not running")
            code = self._proc.poll()
            if code is not None:
                raise EmulationError(
                    f"the controller exited with status {code} while switches were being "
                    f"programmed; {self.log_path} ends with:\n{self.log_tail()}"
                )
            status = self.status()
            if status is not None and status.programmed(wanted):
                return status
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL)
        missing = status.missing(wanted) if status is not None else wanted or "all"
        raise EmulationError(
            f"switches not programmed after {timeout:g} s (dpids {missing}); "
            f"{self.log_path} ends with:\n{self.log_tail()}"
        )

    def restart(self) -> ControllerProcess:
        """Stop and start again on the same port (switches reconnect on their own)."""
        self.stop()
        return self.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM, wait, SIGKILL; idempotent. Returns the exit status (None if not started)."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is None:
            code = self._terminate(timeout)
        self._reap()
        return code

    def _terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        assert self._proc is not None
        # Our child, not reaped yet: its pid (= process group id) cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGTERM)
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            return self._proc.wait()

    def _reap(self) -> None:
        if self._proc is not None:
            self._proc.wait()
            self._proc = None
        self.starttime = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 25) -> str:
        try:
            with open(self.log_path, "rb") as src:
                src.seek(0, os.SEEK_END)
                src.seek(max(0, src.tell() - 16384))
                text = src.read().decode("utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
