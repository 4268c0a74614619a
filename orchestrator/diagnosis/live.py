"""The diagnosis while a run goes: the same detectors on what the layers hold so far.

:class:`LiveDiagnosis` is a thread that, every :data:`INTERVAL_S`, asks its ``build``
callable for the observations so far (the run layer assembles them from the running
launch, the controller's counter file and its events file: orchestrator.run.alerts),
diagnoses them exactly as ``astral diagnose`` does a bundle, and raises an alert the first
time a suspect scores above the threshold. The alerts (each with the instant it was
raised) go into the bundle's run.json, so a fault's detection delay is measured from the
recorded injection instant to its alert.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.diagnosis.diagnose import _canonical, diagnose
from orchestrator.diagnosis.evidence import Observations
from orchestrator.diagnosis.model import Suspect

INTERVAL_S = 1.0


@dataclass(frozen=True)
class Alert:
    t: float  # epoch s it was raised
    suspect: Suspect

    def line(self) -> str:
        s = self.suspect
        first = s.evidence[0] if s.evidence else ""
        return f"ALERT {s.component} {s.target}: {s.fault} (score {s.score:.2f}): {first}"

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, **self.suspect.to_dict()}


class LiveDiagnosis:
    def __init__(
        self,
        build: Callable[[], Observations | None],
        say: Callable[[str], None],
        interval: float = INTERVAL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.build = build
        self.say = say
        self.interval = interval
        self.clock = clock  # what stamps an alert (a replay's cut: its own instant)
        self.alerts: list[Alert] = []
        self.errors: list[str] = []
        self.checks = 0
        self.cpu_seconds = 0.0  # the thread's own CPU time: what the live diagnosis costs
        self._seen: set[tuple[str, str, str]] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LiveDiagnosis:
        self._thread = threading.Thread(target=self._loop, name="live-diagnosis", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Alert]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.alerts

    def check(self) -> list[Alert]:
        """One look (the thread's loop calls it): the alerts it raised."""
        obs = self.build()
        if obs is None:
            return []
        raised = []
        for suspect in diagnose(obs).ranked:
            key = (suspect.component, _canonical(suspect.target), suspect.fault)
            if key in self._seen:
                continue
            self._seen.add(key)
            alert = Alert(self.clock(), suspect)
            self.alerts.append(alert)
            raised.append(alert)
            self.say(alert.line())
        return raised

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            began = time.thread_time()
            try:
                self.check()
            except Exception as error:  # a half-written file: the next look reads it whole
                if str(error) not in self.errors:
                    self.errors.append(str(error))
            self.checks += 1
            self.cpu_seconds += time.thread_time() - began

    def cost(self) -> dict[str, float]:
        """What run.json keeps: how many looks, and the CPU they took."""
        return {"checks": self.checks, "cpu_seconds": round(self.cpu_seconds, 3)}
