"""Ctrl-C that is never lost.

Python turns SIGINT into a KeyboardInterrupt raised wherever the main thread happens to be.
When that is a finalizer (a ``__del__``, a weakref callback: a garbage-collected
``subprocess.Popen`` polls its child in one), the exception is "ignored" and the Ctrl-C is
gone: a run of a million iterations then goes on as if nothing was pressed (seen in the
test suite, where it hung CI for an hour). :func:`noted_interrupts` installs a SIGINT
handler that also records the signal; the launcher asks the record between its waits
(:attr:`orchestrator.worker.launcher.Launcher.interrupted`) and raises KeyboardInterrupt
itself when the first one was lost.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from orchestrator.emulation import signals


@contextmanager
def noted_interrupts() -> Iterator[Callable[[], bool]]:
    """While inside: SIGINT raises KeyboardInterrupt as usual and is also noted; yields
    whether one arrived. A process that ignores SIGINT (started in the background) keeps
    ignoring it; outside the main thread nothing is installed."""
    noted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield noted.is_set
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield noted.is_set
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        noted.set()
        signals.note(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    try:
        yield noted.is_set
    finally:
        signal.signal(signal.SIGINT, previous)
