"""A sampler that takes samples in a daemon thread while a run goes.

:class:`PeriodicSampler` is the thread's life (a sample on start, one every ``interval``
seconds, a last one on stop, so that whatever window the run asks about is spanned);
subclasses say what one sample is (:mod:`.cpuload`'s CPU counters, :mod:`.queues`' egress
queues) and keep their samples under ``self._lock``.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self


class PeriodicSampler:
    """Calls :meth:`sample` every ``interval`` seconds in a daemon thread named ``name``
    between :meth:`start` and :meth:`stop` (or in a ``with`` block)."""

    name = "sampler"

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> object:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> Self:
        """Take a sample and start the thread (what entering the ``with`` block does)."""
        self.sample()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and take a last sample; idempotent."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self.sample()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
