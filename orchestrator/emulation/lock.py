"""One run at a time: an exclusive lock on ``<state dir>/lock``.

Two runs would fight over Open vSwitch, interface names and the CPU, so ``astral up`` (and
``astral clean``, which must not pull a live run's network from under it) take this lock
first. It is an ``flock`` on a file descriptor that children do not inherit, so the kernel
releases it the moment its holder exits, however it exits (kill -9 included): there is no
stale lock to break. The holder writes its pid and command line into the file so that the
refused run can say who holds it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from orchestrator.emulation.state import state_dir
from topologies.errors import ConcurrentRunError

LOCK_FILE = "lock"
LOCK_POLL_S = 0.5  # how often a waiting run tries the lock again


def _command_line() -> list[str]:
    try:
        raw = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


class RunLock:
    """``with RunLock():`` holds the lock or raises ConcurrentRunError naming the holder."""

    def __init__(self, base: Path | None = None, purpose: str = "run") -> None:
        self.path = (base or state_dir()) / LOCK_FILE
        self.purpose = purpose
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, wait: float = 0.0, on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lock; while another run holds it, keep trying for ``wait`` seconds
        (telling ``on_wait`` once), then raise ConcurrentRunError naming the holder."""
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                self._try_acquire()
                return
            except ConcurrentRunError:
                if time.monotonic() >= deadline:
                    raise
                if on_wait is not None and not told:
                    on_wait(f"another astral run holds the lock; waiting up to {wait:.0f} s")
                    told = True
                time.sleep(LOCK_POLL_S)

    def _try_acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            command = holder.get("command")
            shown = " ".join(map(str, command)) if isinstance(command, list) else "?"
            error = ConcurrentRunError(
                f"another astral {holder.get('purpose', 'run')} is in progress "
                f"(pid {holder.get('pid', '?')}: {shown or '?'}; lock {self.path}): wait for "
                "it to finish or stop it (Ctrl-C, or kill it and run `astral clean`)"
            )
            raise error from None
        info = {
            "pid": os.getpid(),
            "command": _command_line(),
            "purpose": self.purpose,
            "since": time.time(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    @staticmethod
    def _holder(fd: int) -> dict[str, object]:
        try:
            data = os.pread(fd, 65536, 0)
            holder = json.loads(data.decode() or "{}")
        except (OSError, ValueError):
            return {}
        return holder if isinstance(holder, dict) else {}

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
