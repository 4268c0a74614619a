"""A real OpenSSH server on loopback for the remote tests, owned by the test that starts it.

:class:`LoopbackSshd` makes, in a directory of its own: a host key, a client key pair with
its public half as the only authorized key, and an ``sshd_config`` that listens on
127.0.0.1 only, on a free port, lets root in by key only (no password, no keyboard-
interactive, no PAM) and serves SFTP in-process. It runs ``/usr/sbin/sshd -D -e`` (in the
foreground, logging to its stderr, which it keeps in ``sshd.log``) and, on exit, stops it and
every per-connection sshd process it forked, exactly those (found through /proc by parent
pid), so that no process is left. The key and process helpers are
orchestrator.cluster.nsmachine's, whose second machine starts its sshd the same way.

``inventory()`` writes the inventory file naming it as machine ``loopback`` with its own
known_hosts file (empty at first: the host key is unknown until accepted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from orchestrator.cluster.nsmachine import PRIVSEP_DIR, SSHD, descendants, keygen, sshd_config


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class LoopbackSshd:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host_key = self.dir / "host_ed25519"
        self.client_key = self.dir / "client_ed25519"
        self.known_hosts = self.dir / "known_hosts"
        self.config = self.dir / "sshd_config"
        self.log = self.dir / "sshd.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._made_privsep = False

    def __enter__(self) -> LoopbackSshd:
        keygen(self.host_key, "astral-test-host")
        keygen(self.client_key, "astral-test-client")
        (self.dir / "authorized_keys").write_text(
            Path(f"{self.client_key}.pub").read_text(), encoding="ascii"
        )
        if not PRIVSEP_DIR.exists():
            PRIVSEP_DIR.mkdir(mode=0o755)
            self._made_privsep = True
        for _ in range(5):  # a free port may be taken between probe and bind
            self.port = free_port()
            self._write_config()
            if self._start():
                return self
        raise RuntimeError(f"sshd did not start; see {self.log}:\n{self.log.read_text()}")

    def _write_config(self) -> None:
        self.config.write_text(
            sshd_config(
                self.port,
                "127.0.0.1",
                self.host_key,
                self.dir / "sshd.pid",
                self.dir / "authorized_keys",
            ),
            encoding="ascii",
        )

    def _start(self) -> bool:
        log = self.log.open("ab")
        self.process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return True
            time.sleep(0.05)
        self._stop()
        return False

    def sessions(self) -> list[int]:
        """The per-connection sshd processes (and what they run) serving us now."""
        return descendants(self.process.pid) if self.process else []

    def drop_connections(self) -> None:
        """What a network outage does to the far side: every session's sshd dies at once."""
        for pid in self.sessions():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _stop(self) -> None:
        if self.process is None:
            return
        leftover = self.sessions()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A session blocked in the kernel (a netlink dump waiting for RTNL on a busy
        # machine) dies only when it returns from the call: wait for that, within reason.
        deadline = time.monotonic() + 60
        while any(Path(f"/proc/{pid}").exists() for pid in leftover):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.process = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        if self._made_privsep:
            with contextlib.suppress(OSError):
                PRIVSEP_DIR.rmdir()

    def inventory(self, path: Path, project: Path, **extra: object) -> Path:
        """An inventory naming this server as machine ``loopback``."""
        lines = [
            "machines:",
            "  loopback:",
            "    host: 127.0.0.1",
            f"    port: {self.port}",
            "    user: root",
            f"    key: {self.client_key}",
            f"    project: {project}",
            f"    known_hosts: {self.known_hosts}",
        ]
        lines += [f"    {key}: {value}" for key, value in extra.items()]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
