"""The controller restarts a run makes itself, which the diagnosis must not blame.

Switching policy between configurations restarts the controller on its port
(orchestrator.testbed.testbed: ``Testbed.use_policy``; so does a monitor level that changes
the counter polling). Seen from the controller's events and counters that is a crash and
its recovery: the old process stops, its apps load again, every switch connects and is
programmed again, and the counter polling pauses for the 2-3 s that takes. The difference
is who did it, and only the run knows: it keeps every restart it made with its instants
(the bundle's ``controller_restarts``, schema version 4), and the live diagnosis takes them
from the testbed as they happen.

A bundle from before that record does not say. Its policy switches are inferred from its
configurations instead: policies vary slowest, so the run switched between the last
configuration of one policy and the first of the next, when no traffic was being
measured, and a restart there is taken for the run's own. (A crash in that window would
be taken for one too; it cost no measurement.)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.results.store import ControllerRestart


@dataclass(frozen=True)
class OwnRestart:
    """A controller restart the run made: from ``began`` (the old process stopped) to
    ``ended`` (every switch programmed again; None: not, or not yet), to ``policy``, for
    ``reason`` (``policy``: a policy switch; ``monitor``: the counter polling changed).
    ``recorded``: the run's own record, else inferred from the configurations (then the
    whole time between them)."""

    began: float
    ended: float | None
    policy: str
    reason: str = "policy"
    recorded: bool = True

    @property
    def until(self) -> float:
        return self.ended if self.ended is not None else math.inf

    def holds(self, t: float) -> bool:
        """Whether ``t`` falls within the restart."""
        return self.began <= t <= self.until

    def explains_pause(self, start: float, end: float, slack: float) -> bool:
        """Whether a pause of the counter polling from ``start`` to ``end`` is this
        restart's: it overlaps the restart, and what is left of it on either side (the
        old process's last poll came before it stopped, the new one's first after the
        switches connected) is shorter than ``slack``, a pause of its own otherwise."""
        return (
            start <= self.until
            and end >= self.began
            and self.began - start < slack
            and end - self.until < slack
        )


def recorded(restarts: Sequence[ControllerRestart]) -> list[OwnRestart]:
    """The restarts the run recorded (the bundle's, or the testbed's while it runs)."""
    return [OwnRestart(r.began, r.ended, r.policy, r.reason) for r in restarts]


def inferred(windows: Sequence[tuple[float, float, str]]) -> list[OwnRestart]:
    """The policy switches of a run that did not record them, from its configurations'
    windows (first start, last end with the warm-up, policy): the time between two
    consecutive configurations of different policies."""
    ordered = sorted(windows)
    return [
        OwnRestart(before[1], after[0], after[2], recorded=False)
        for before, after in itertools.pairwise(ordered)
        if before[2] != after[2]
    ]
