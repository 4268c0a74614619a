"""A training iteration's timeline: per rank, when each of the program's slots began and
ended, how much of it was compute, and which kind of communication the rest was.

Both the replay (the workers' per-step phase records, grouped by slot) and the forecast
(orchestrator/forecast/program.py) describe an iteration this way, so that the two are
drawn (the workload Gantt) and compared (exposed communication per kind) on one footing.

A slot's time beyond its compute is communication the compute did not hide: *exposed*,
counted for one kind, ``tp``, ``ep``, ``pp`` or ``dp`` (the op's label says which). A slot
holding ops of several kinds for a rank (a data-parallel bucket beside a tensor-parallel
all-reduce) counts it for the forecast's op that ends last and, in a replay, where the
workers do not say which transfer ended last, for the op that moves the most bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.collectives.plans import Layout
from orchestrator.collectives.program import Compute, GroupCollective, PointToPoint, Program
from orchestrator.collectives.program import step_slots as program_step_slots

KINDS = ("tp", "ep", "pp", "dp")
COMPUTE = "compute"


def kind_of(label: str) -> str:
    """An op's kind from its label's first word (``tp``, ``dp``, ...; ``expert dp`` -> dp)."""
    words = label.split()
    for word in words[:2]:
        if word in KINDS:
            return word
    return words[0] if words else "other"


@dataclass(frozen=True)
class SlotSpan:
    """One rank's time in one slot (seconds, on the timeline's own clock)."""

    slot: int
    start: float
    end: float
    compute: float  # seconds of it the rank computed
    kind: str  # of the communication not hidden ("" when the slot moved nothing)

    @property
    def exposed(self) -> float:
        return max(0.0, self.end - self.start - self.compute) if self.kind else 0.0


Timeline = dict[int, list[SlotSpan]]  # rank -> its slots in order


def exposure(spans: Iterable[SlotSpan]) -> dict[str, float]:
    """Seconds of exposed communication per kind (every kind listed, zeros included)."""
    out = dict.fromkeys(KINDS, 0.0)
    for span in spans:
        if span.kind:
            out[span.kind] = out.get(span.kind, 0.0) + span.exposed
    return out


def slot_compute(program: Program, rank: int) -> list[float]:
    """Rank ``rank``'s compute seconds in each slot."""
    return [
        sum(op.of(rank) for op in slot.ops if isinstance(op, Compute)) for slot in program.slots
    ]


def slot_kinds(program: Program, rank: int) -> list[str]:
    """Per slot, the kind of the op of ``rank`` that moves the most bytes ("" if none)."""
    kinds = []
    for slot in program.slots:
        best, kind = -1, ""
        for op in slot.ops:
            group_op = op.collective() if isinstance(op, PointToPoint) else op
            if not isinstance(group_op, GroupCollective) or rank not in group_op.group:
                continue
            if group_op.count > best:
                best, kind = group_op.count, kind_of(group_op.name)
        kinds.append(kind)
    return kinds


PhaseTuple = tuple[str, int, float, float]  # (phase, step, start, end), a worker's record


def measured_timeline(
    program: Program,
    layout: Layout,
    phases: Mapping[int, Sequence[PhaseTuple]],
    *,
    origin: float | None = None,
) -> Timeline:
    """The replayed iteration of ``program``: each rank's step records (``phases``, epoch
    seconds; the final ``delivery`` record is not a slot's) grouped by the slot their
    step belongs to; times from ``origin`` (default: the earliest record). A rank's
    timeline lists the slots it computes or communicates in (it passes the others'
    at once, in a step with nothing to do), as the forecast's does."""
    owners = program_step_slots(program, layout)
    records = {rank: [p for p in rows if p[1] < len(owners[rank])] for rank, rows in phases.items()}
    if origin is None:
        origin = min((p[2] for rows in records.values() for p in rows), default=0.0)
    timeline: Timeline = {}
    for rank, rows in sorted(records.items()):
        compute, kinds = slot_compute(program, rank), slot_kinds(program, rank)
        bounds: dict[int, list[float]] = {}
        for _, step, start, end in rows:
            span = bounds.setdefault(owners[rank][step], [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
        timeline[rank] = [
            SlotSpan(slot, start - origin, end - origin, compute[slot], kinds[slot])
            for slot, (start, end) in sorted(bounds.items())
            if compute[slot] > 0 or kinds[slot]  # a slot of others': passed at once
        ]
    return timeline


def last_rank(timeline: Timeline) -> int:
    """The rank whose last slot ends last (the one that sets the iteration's time)."""
    return max(timeline, key=lambda r: max((s.end for s in timeline[r]), default=0.0))
