"""A run's faults on their schedule: when each is applied and undone, and what is logged.

:class:`FaultScheduler` is the thread a run uses: it waits for the origin (the common start
of the run's first timed batch, which the launcher announces through ``on_batch``), applies
each fault at ``origin + at`` and undoes it at ``origin + at + duration`` (flaps go down and
up in between), each fault in a thread of its own, and undoes whatever is still active when
the run ends. Every applied, undone and failed action is one JSON line of ``faults.jsonl``
in the emulation's run directory::

    {"id": 1, "kind": "link-down", "target": "p1s0g0-p1r0t1", "event": "applied",
     "t": 1764633600.12, "scheduled": 1764633600.10, "detail": "..."}

``t`` is when the action had taken effect (its commands done), ``scheduled`` when it was
due, both epoch seconds; a flap's every down is an ``applied`` line and every up an
``undone`` one. :meth:`FaultScheduler.outcomes` is what the bundle's ``faults`` table keeps.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.testbed.faults import FaultInjector
from orchestrator.testbed.faultspec import (
    APPLY,
    FLAP_UP,
    UNDO,
    Action,
    FaultSpec,
    next_flap,
    timeline,
)
from topologies.errors import AstralError

FAULT_LOG = "faults.jsonl"  # in the emulation's run directory (the monitor reads it)
APPLIED, UNDONE, FAILED = "applied", "undone", "failed"


@dataclass
class FaultOutcome:
    """What became of one scheduled fault (the bundle's ``faults`` row); epoch seconds."""

    fault: FaultSpec
    scheduled: float | None = None
    applied: float | None = None
    undone: float | None = None
    error: str | None = None


class FaultLog:
    """``faults.jsonl``: one line per action, appended and flushed as it happens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(
        self, fault: FaultSpec, event: str, t: float, scheduled: float | None, detail: str
    ) -> None:
        line = {
            "id": fault.id,
            "kind": fault.kind,
            "target": fault.target_text,
            "event": event,
            "t": t,
            "scheduled": scheduled if scheduled is not None else t,
            "detail": detail,
        }
        with self._lock, open(self.path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")


class FaultScheduler:
    """A thread applying a run's faults on time (see the module docstring)."""

    def __init__(
        self,
        injector: FaultInjector,
        faults: Sequence[FaultSpec],
        log: FaultLog,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.injector = injector
        self.faults = {f.id: f for f in faults}
        self.log = log
        self.say = say or (lambda message: None)
        self.outcomes_by_id = {f.id: FaultOutcome(f) for f in faults}
        self._origin: float | None = None
        self._origin_set = threading.Event()
        self._stop = threading.Event()
        self._active: list[int] = []  # applied, not undone, in the order applied
        # one fault's actions (its thread's and stop()'s) never overlap
        self._locks = {f.id: threading.Lock() for f in faults}
        self._thread: threading.Thread | None = None

    @property
    def origin(self) -> float | None:
        return self._origin

    def batch_started(self, at: float, warmup: bool) -> None:
        """The launcher's ``on_batch``: the first timed batch's start is the origin."""
        if not warmup and self._origin is None:
            self._origin = at
            self._origin_set.set()

    def start(self) -> FaultScheduler:
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        """Prepare every fault, wait for the origin, then give every fault a thread of its
        own: one fault's slow action (a controller that takes a second to listen) never
        delays another's."""
        for fault in self.faults.values():
            try:
                self.injector.prepare(fault)
            except (AstralError, OSError) as error:  # applying it will try again, and say
                self.say(f"fault {fault.id} ({fault.kind}): not prepared ahead: {error}")
        while not self._origin_set.wait(0.5):
            if self._stop.is_set():
                return
        assert self._origin is not None
        for fault in self.faults.values():
            self.outcomes_by_id[fault.id].scheduled = self._origin + fault.at
        threads = [
            threading.Thread(target=self._run_fault, args=(f,), name=f"fault-{f.id}", daemon=True)
            for f in self.faults.values()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _run_fault(self, fault: FaultSpec) -> None:
        """One fault's actions in order, each at ``origin + offset`` (a flap's ups and
        downs one after the other, :func:`next_flap`)."""
        assert self._origin is not None
        pending = [a for a in timeline(fault) if a.offset is not None]
        while pending and not self._stop.is_set():
            pending.sort(key=lambda a: (a.offset or 0.0, a.what != UNDO))
            action = pending.pop(0)
            assert action.offset is not None
            due = self._origin + action.offset
            if self._stop.wait(max(0.0, due - time.time())):
                return
            following = self._act(action, due)
            if following is not None:
                pending.append(following)

    def _act(self, action: Action, due: float) -> Action | None:
        """Carry out ``action``; returns the flap's next one, if any."""
        fault = self.faults[action.fault]
        outcome = self.outcomes_by_id[fault.id]
        with self._locks[fault.id]:
            if self._stop.is_set():
                return None
            if action.what == APPLY:
                self._apply(fault, due)  # a flap's first up is in its timeline already
            elif action.what == UNDO:
                self._undo(fault, due)
            elif fault.id in self._active:  # a flap's up or down
                up = action.what == FLAP_UP
                try:
                    detail = self.injector.flap(fault, up)
                except (AstralError, OSError) as error:
                    self._failed(outcome, due, f"flap {action.n}: {error}")
                    return None
                event = UNDONE if up else APPLIED
                self.log.write(fault, event, time.time(), due, f"flap {action.n}: {detail}")
                return next_flap(fault, action)
        return None

    def _apply(self, fault: FaultSpec, due: float) -> None:
        outcome = self.outcomes_by_id[fault.id]
        try:
            detail = self.injector.apply(fault)
        except (AstralError, OSError, ValueError) as error:
            self._failed(outcome, due, f"apply: {error}")
            return
        outcome.applied = time.time()
        self._active.append(fault.id)
        self.log.write(fault, APPLIED, outcome.applied, due, detail)
        self.say(f"fault {fault.id} applied: {fault.describe()} ({detail})")

    def _undo(self, fault: FaultSpec, due: float) -> None:
        if fault.id not in self._active:
            return
        outcome = self.outcomes_by_id[fault.id]
        self._active.remove(fault.id)
        try:
            detail = self.injector.undo(fault)
        except (AstralError, OSError, ValueError) as error:
            self._failed(outcome, due, f"undo: {error}")
            return
        outcome.undone = time.time()
        self.log.write(fault, UNDONE, outcome.undone, due, detail)
        self.say(f"fault {fault.id} undone: {fault.kind} {fault.target_text} ({detail})")

    def _failed(self, outcome: FaultOutcome, due: float, error: str) -> None:
        outcome.error = error if outcome.error is None else f"{outcome.error}; {error}"
        self.log.write(outcome.fault, FAILED, time.time(), due, error)
        self.say(f"fault {outcome.fault.id} ({outcome.fault.kind}) failed: {error}")

    def stop(self) -> list[FaultOutcome]:
        """End of the run: stop the thread, undo what is still active (last applied first)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        now = time.time()
        for fault_id in reversed(list(self._active)):
            with self._locks[fault_id]:
                self._undo(self.faults[fault_id], now)
        self.injector.close()
        return self.outcomes()

    def outcomes(self) -> list[FaultOutcome]:
        return [self.outcomes_by_id[i] for i in sorted(self.outcomes_by_id)]
