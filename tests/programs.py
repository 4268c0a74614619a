"""Programs the tests share (orchestrator/collectives/program.py)."""

from __future__ import annotations

from orchestrator.collectives.program import (
    Compute,
    GroupCollective,
    PointToPoint,
    Program,
    Slot,
)

SERVERS = [(0, 1), (2, 3), (4, 5), (6, 7)]
RAILS = [(0, 2, 4, 6), (1, 3, 5, 7)]


def iteration(count: int = 1000, forward: float = 0.2, backward: float = 0.3) -> Program:
    """The shape of a training iteration on 8 ranks: tensor-parallel all-reduces inside the
    servers while computing, data-parallel all-reduces on each rail while computing, then
    an all-to-all among four ranks beside a pipeline send. For 8 ranks, 2 per server (as
    Layout.regular(8, 2) and astral-small place them); ``count`` elements per all-reduce
    and point-to-point transfer, 4 x ``count`` for the all-to-all."""
    return Program(
        "iteration",
        (
            Slot(
                (
                    *(GroupCollective("all-reduce", "ring", s, count, "tp") for s in SERVERS),
                    Compute.on(range(8), forward, "forward"),
                ),
                "tp",
            ),
            Slot(
                (
                    *(GroupCollective("all-reduce", "ring", r, count, "dp") for r in RAILS),
                    Compute.on(range(8), backward, "backward"),
                ),
                "dp",
            ),
            Slot(
                (
                    GroupCollective("all-to-all", "direct", (0, 2, 4, 6), 4 * count, "ep"),
                    PointToPoint(1, 7, count, "pp"),
                ),
                "ep",
            ),
        ),
    )
