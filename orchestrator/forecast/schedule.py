"""A collective's step schedule: which rank sends how many bytes to which peer, step by step.

The schedule comes from the same pure plans the workers execute
(orchestrator/collectives/plans.py): step k of the schedule is step k of every rank's plan,
its transfers the ranks' sends (the executor runs a step's transfers concurrently and a step
ends when all of them have, so a step is the unit of the model). Consecutive steps that move
the same bytes between the same pairs are one :class:`Step` with a ``repeat`` count: a ring's
n - 1 reduce-scatter steps are one step repeated (chunks differing by one element apart,
which the byte counts keep exact on average).

Plans are per rank, so :func:`plan_schedule` costs ranks x steps: fine up to a few thousand
ranks, impossible for a pod of 65,536 GPUs (a ring plan alone has 131,070 steps). There
:func:`symmetric_schedule` writes the same schedule down by the algorithms' symmetry (every
rank of a ring does the same thing, shifted), for the algorithms it knows; the unit tests
check it against :func:`plan_schedule` on layouts where both run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.collectives.operations import split
from orchestrator.collectives.plans import ELEMENT_BYTES, Layout, Plan, default_registry

#: (src rank, dst rank, bytes)
Transfer = tuple[int, int, int]


@dataclass(frozen=True)
class Step:
    """``repeat`` consecutive steps, each moving ``transfers`` concurrently."""

    phase: str
    transfers: tuple[Transfer, ...]
    repeat: int = 1


def plan_steps(plans: Sequence[Plan]) -> list[Step]:
    """Step k of every rank's plan, as one :class:`Step` each (not yet merged)."""
    steps = max((len(p.steps) for p in plans), default=0)
    out = []
    for k in range(steps):
        transfers: list[Transfer] = []
        phase = ""
        for plan in plans:
            if k >= len(plan.steps):
                continue
            step = plan.steps[k]
            phase = phase or step.phase
            per_peer: dict[int, int] = {}
            for t in step.sends:
                per_peer[t.peer] = per_peer.get(t.peer, 0) + t.region.nbytes
            transfers += [(plan.rank, peer, b) for peer, b in sorted(per_peer.items()) if b]
        out.append(Step(phase, tuple(transfers)))
    return out


def merge(steps: Sequence[Step]) -> list[Step]:
    """Consecutive steps with the same phase and the same (src, dst) pairs, whose byte
    counts differ by at most one element per transfer, become one step repeated, carrying
    the mean bytes (rounded to whole bytes; totals within one element per transfer)."""
    merged: list[tuple[Step, list[Step]]] = []
    for step in steps:
        if merged:
            first, members = merged[-1]
            if (
                first.phase == step.phase
                and [t[:2] for t in first.transfers] == [t[:2] for t in step.transfers]
                and all(
                    abs(a[2] - b[2]) <= ELEMENT_BYTES
                    for a, b in zip(first.transfers, step.transfers, strict=True)
                )
            ):
                members.append(step)
                continue
        merged.append((step, [step]))
    out = []
    for first, members in merged:
        transfers = tuple(
            (src, dst, round(sum(m.transfers[i][2] for m in members) / len(members)))
            for i, (src, dst, _) in enumerate(first.transfers)
        )
        out.append(Step(first.phase, transfers, len(members)))
    return out


def plan_schedule(layout: Layout, collective: str, algorithm: str, count: int) -> list[Step]:
    """The schedule of ``collective``/``algorithm`` on ``layout`` for ``count`` elements,
    from every rank's plan."""
    algo = default_registry().get(collective, algorithm)
    plans = [algo.plan(layout, rank, count) for rank in range(layout.size)]
    return merge(plan_steps(plans))


# --- by symmetry ----------------------------------------------------------------------------


def _ring(ring: Sequence[int], chunk_bytes: int, phase: str, repeat: int) -> Step:
    n = len(ring)
    return Step(phase, tuple((ring[p], ring[(p + 1) % n], chunk_bytes) for p in range(n)), repeat)


def _mean_chunk(count: int, parts: int) -> int:
    return round(count * ELEMENT_BYTES / parts)


def symmetric_schedule(
    layout: Layout, collective: str, algorithm: str, count: int
) -> list[Step] | None:
    """The schedule written down by symmetry (no per-rank plans), or None for an algorithm
    this does not know. Chunk sizes are the mean of the plans' (which differ by at most one
    element); the phases are the plans' own."""
    key = (collective, algorithm)
    n = layout.size
    if n < 2:
        return [] if key in _KNOWN else None
    if key in (("all-reduce", "ring"), ("reduce-scatter", "ring"), ("all-gather", "ring")):
        ring = list(range(n))
        chunk = _mean_chunk(count, n)
        phases = {
            "all-reduce": ["reduce-scatter", "all-gather"],
            "reduce-scatter": ["reduce-scatter"],
            "all-gather": ["all-gather"],
        }[collective]
        return [_ring(ring, chunk, phase, n - 1) for phase in phases]
    if key == ("all-reduce", "hierarchical"):
        grid = layout.grid("all-reduce/hierarchical")
        m, g = len(grid), len(grid[0])
        steps = []
        intra_chunk = _mean_chunk(count, g)
        rail_chunk = _mean_chunk(count, g * m)
        intra = [_ring(s, intra_chunk, "", 1) for s in grid]
        if g > 1:
            steps.append(_parallel(intra, "intra reduce-scatter", g - 1))
        if m > 1:
            rails = [[grid[s][lr] for s in range(m)] for lr in range(g)]
            for phase in ("rail reduce-scatter", "rail all-gather"):
                steps.append(_parallel([_ring(r, rail_chunk, "", 1) for r in rails], phase, m - 1))
        if g > 1:
            steps.append(_parallel(intra, "intra all-gather", g - 1))
        return steps
    if key == ("all-to-all", "direct"):
        block = count // n * ELEMENT_BYTES
        transfers = tuple((src, dst, block) for src in range(n) for dst in range(n) if dst != src)
        return [Step("all-to-all", transfers, 1)] if block else []
    return None


_KNOWN = {
    ("all-reduce", "ring"),
    ("reduce-scatter", "ring"),
    ("all-gather", "ring"),
    ("all-reduce", "hierarchical"),
    ("all-to-all", "direct"),
}


def _parallel(steps: Sequence[Step], phase: str, repeat: int) -> Step:
    return Step(phase, tuple(t for s in steps for t in s.transfers), repeat)


def schedule(
    layout: Layout, collective: str, algorithm: str, count: int, *, plans_up_to: int = 2048
) -> list[Step]:
    """The schedule from the plans up to ``plans_up_to`` ranks, by symmetry beyond (an
    algorithm without a symmetric form is planned whatever the size)."""
    if layout.size > plans_up_to:
        found = symmetric_schedule(layout, collective, algorithm, count)
        if found is not None:
            return found
    return plan_schedule(layout, collective, algorithm, count)


def split_channels(nbytes: int, channels: int) -> list[int]:
    """A transfer's bytes over its ``channels`` connections, as the executor cuts them
    (orchestrator/worker/executor.py: contiguous ranges of elements, sizes differing by at
    most one element)."""
    if channels <= 1:
        return [nbytes]
    elements = nbytes // ELEMENT_BYTES
    return [c * ELEMENT_BYTES for _, c in split(elements, channels)]
