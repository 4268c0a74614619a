"""The per-step latency a worker waits: NCCL's alpha-beta model applied to a plan.

A step of a plan costs its latency plus its bytes over the bandwidth (NCCL's tuner models
every collective this way, docs/latency.md). The emulated links already give the bytes
their time; this module gives the step its latency: before posting a step's sends, a rank
waits the largest one-way latency among the step's send peers (the messages of one step
travel in parallel, so the slowest path counts once), and before the first step of an
operation also the per-operation latency. Waiting at the sender delays the arrival at
the receiver by exactly that much, which is what a slower path would do.

The figures come from the fabric model (topologies/latency.py) in emulated seconds; this
module only applies them, and imports nothing but the standard library and the plans so
that the worker stays light. :class:`LatencyTable` is what a launch carries for all ranks,
:class:`StepLatency` one rank's row of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestrator.collectives.plans import Plan, PlanStep


@dataclass(frozen=True)
class StepLatency:
    """One rank's latencies, emulated seconds: to each peer (one way), and per operation."""

    peers: Mapping[int, float] = field(default_factory=lambda: MappingProxyType({}))
    operation: float = 0.0

    def before(self, index: int, step: PlanStep) -> float:
        """Seconds to wait before step ``index``'s sends: the slowest send peer's one-way
        latency (0 for a step that sends nothing), plus the operation's before step 0."""
        wait = max((self.peers.get(t.peer, 0.0) for t in step.sends), default=0.0)
        return wait + (self.operation if index == 0 else 0.0)

    def wait(self, index: int, step: PlanStep) -> None:
        """Sleep :meth:`before` (the executor's hook; nothing at all when it is 0)."""
        seconds = self.before(index, step)
        if seconds > 0:
            time.sleep(seconds)


NO_LATENCY = StepLatency()


@dataclass(frozen=True)
class LatencyTable:
    """Every rank's latencies, emulated seconds: ``one_way[src][dst]`` and per operation.
    Empty (the default): no latency, as with ``latency: off``."""

    one_way: tuple[tuple[float, ...], ...] = ()
    operation: float = 0.0

    def __post_init__(self) -> None:
        ranks = len(self.one_way)
        if any(len(row) != ranks for row in self.one_way):
            raise ValueError("latency table: one row of one figure per rank for every rank")
        if self.operation < 0 or any(x < 0 for row in self.one_way for x in row):
            raise ValueError("latency table: latencies must be >= 0")

    def row(self, rank: int) -> StepLatency:
        """What rank ``rank`` waits (no latency when the table is empty)."""
        if not self.one_way:
            return StepLatency(operation=self.operation)
        peers = {dst: s for dst, s in enumerate(self.one_way[rank]) if dst != rank}
        return StepLatency(MappingProxyType(peers), self.operation)

    def to_message(self) -> dict[str, Any]:
        """The launch options' form (JSON)."""
        return {"one_way": [list(row) for row in self.one_way], "operation": self.operation}

    @classmethod
    def from_message(cls, message: Mapping[str, Any] | None) -> LatencyTable:
        if not message:
            return cls()
        return cls(
            tuple(tuple(float(x) for x in row) for row in message.get("one_way", ())),
            float(message.get("operation", 0.0)),
        )


def operation_latency(plans: Sequence[Plan], table: LatencyTable) -> float:
    """Emulated seconds of latency one operation adds, ``plans[r]`` being rank r's plan:
    the per-operation latency plus, step by step, the largest wait of any rank (a step
    ends for everyone only when its slowest message has arrived, as in a ring). An
    estimate for budgets and progress bars; the measured time is the workers'."""
    rows = [table.row(plan.rank) for plan in plans]
    steps = max((len(plan.steps) for plan in plans), default=0)
    total = 0.0
    for k in range(steps):
        total += max(
            (
                row.before(k, plan.steps[k])
                for row, plan in zip(rows, plans, strict=True)
                if k < len(plan.steps)
            ),
            default=0.0,
        )
    return total if steps else table.operation
