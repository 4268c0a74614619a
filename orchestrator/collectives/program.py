"""Programs: several collectives on groups of ranks, point-to-point transfers and compute
time, composed into one operation that every rank runs and verifies.

A training iteration is not one collective on every rank: tensor-parallel all-reduces
inside a server run while data-parallel all-reduces cross the rails and the backward pass
computes; expert-parallel all-to-alls and pipeline sends follow. A :class:`Program` says
that as data, and :func:`compose` turns it into one rank's :class:`~plans.Plan`, which the
executor runs like any other plan::

    Program     ordered slots; one slot's ops run at the same time, slots one after another
    Slot        ops: Compute | GroupCollective | PointToPoint
    Compute     seconds per rank (emulated time the rank computes in the slot)
    GroupCollective   a registered algorithm on ``group`` (global ranks, in group-rank order)
    PointToPoint      ``src`` sends ``count`` elements to ``dst`` (p2p/direct on (src, dst))

How a rank's plan is composed, and why every rank's agrees with its peers':

- **Each op is planned on its group's sub-layout** (the servers and rails of its members,
  in group order), with ``algorithm.plan(sub_layout, group_rank, count)``; its peers are
  mapped back to global ranks and its buffers renamed ``op<i>.<name>`` (i: the op's index
  in the program, counting every op of every slot), so ops never share memory.
- **A slot has the same number of steps on every rank**: the most steps any member of any
  of its ops has (one for a slot that only computes). Step k of the slot is the union of
  step k of every op the rank takes part in, listed in program order. The executor sends
  the regions one step has for one peer back to back, and cuts them into channels by the
  step's total, so both ends of a pair must list the same regions in the same step in the
  same order: they do, because each op's step k is step k on both ends (checked when the
  op is planned: an algorithm whose ranks skip different steps, as the rings do with fewer
  elements than ranks, is refused) and both ends merge the ops in program order. Slots
  follow each other, so every rank's plan has the same steps, and their timelines line up.
- **Compute is spread evenly over the slot's steps**: a step lasts the longer of its
  transfers and its compute (executor.py), so a rank computing C seconds in a slot of k
  steps spends max(C / k, transfers) per step. Over a ring, whose steps move equal
  chunks, that is max(C, all transfers) for the slot: the overlap of a backward pass with
  the data-parallel all-reduce it feeds. Putting C in the first step instead would add the
  rest of the collective after the compute, as if it could not overlap.

:func:`expected` is what the rank's buffers hold afterwards (operations.py's
:class:`Result` of each op, renamed, its sources mapped to global ranks): the worker checks
every sub-collective's sums and blocks as it checks a single collective. Each op's inputs
begin at their own place in the fill pattern (after the elements of the ops before it),
so data that lands in the wrong op's buffer is counted wrong.

Pure data and pure functions, like plans.py; the worker imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.collectives.operations import (
    Expected,
    Result,
    UnknownOperation,
    operation,
)
from orchestrator.collectives.plans import (
    AlgorithmRegistry,
    Copy,
    Layout,
    Plan,
    PlanError,
    PlanStep,
    Region,
    Transfer,
    default_registry,
)

#: The collective name a program's plans and tests carry (its algorithm: the program's name).
PROGRAM = "program"


class ProgramError(PlanError):
    """A program cannot run on this layout (the message names the slot and op)."""


# --- the program as data ------------------------------------------------------------------


@dataclass(frozen=True)
class Compute:
    """``seconds[rank]``: emulated seconds each listed rank computes during its slot."""

    seconds: tuple[tuple[int, float], ...]
    label: str = "compute"

    @classmethod
    def on(cls, ranks: Iterable[int], seconds: float, label: str = "compute") -> Compute:
        """The same compute time on every rank of ``ranks``."""
        return cls(tuple((rank, seconds) for rank in ranks), label)

    def of(self, rank: int) -> float:
        return sum(s for r, s in self.seconds if r == rank)


@dataclass(frozen=True)
class GroupCollective:
    """Collective ``op`` by ``algorithm`` among ``group`` (global ranks; position in the
    tuple = rank in the group), ``count`` elements as for the whole-layout collective."""

    op: str
    algorithm: str
    group: tuple[int, ...]
    count: int
    label: str = ""

    @property
    def name(self) -> str:
        return self.label or f"{self.op}/{self.algorithm}"


@dataclass(frozen=True)
class PointToPoint:
    """``src`` sends ``count`` elements to ``dst``: dst ends with src's values."""

    src: int
    dst: int
    count: int
    label: str = "p2p"

    def collective(self) -> GroupCollective:
        """The same as p2p/direct, whose rank 0 sends to its rank 1, on (src, dst)."""
        return GroupCollective("p2p", "direct", (self.src, self.dst), self.count, self.label)


Op = Compute | GroupCollective | PointToPoint


@dataclass(frozen=True)
class Slot:
    """Ops that run at the same time."""

    ops: tuple[Op, ...]
    label: str = ""


@dataclass(frozen=True)
class Program:
    name: str
    slots: tuple[Slot, ...]

    def collectives(self) -> list[tuple[int, int, GroupCollective]]:
        """(slot index, op index, op) of every op that moves data, point-to-point ones as
        their p2p collective; op indexes count every op of the program, in order."""
        out = []
        index = 0
        for s, slot in enumerate(self.slots):
            for op in slot.ops:
                if isinstance(op, PointToPoint):
                    out.append((s, index, op.collective()))
                elif isinstance(op, GroupCollective):
                    out.append((s, index, op))
                index += 1
        return out

    def elements(self) -> int:
        """Elements of every op's buffers together (what the program's test is sized by)."""
        return sum(op.count for _, _, op in self.collectives())

    def compute_of(self, rank: int) -> float:
        """Emulated seconds rank ``rank`` computes in one run: the floor no run of the
        program can beat on that rank."""
        return sum(op.of(rank) for slot in self.slots for op in slot.ops if isinstance(op, Compute))

    def to_message(self) -> dict[str, Any]:
        """The schedule message's form (JSON; orchestrator/worker/protocol.py)."""
        return {
            "name": self.name,
            "slots": [
                {"label": slot.label, "ops": [_op_message(op) for op in slot.ops]}
                for slot in self.slots
            ],
        }

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Program:
        try:
            return cls(
                str(message["name"]),
                tuple(
                    Slot(tuple(_op_from(op) for op in slot["ops"]), str(slot.get("label", "")))
                    for slot in message["slots"]
                ),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ProgramError(f"malformed program message: {error!r}") from None


def _op_message(op: Op) -> dict[str, Any]:
    if isinstance(op, Compute):
        return {"kind": "compute", "seconds": [list(p) for p in op.seconds], "label": op.label}
    if isinstance(op, PointToPoint):
        return {"kind": "p2p", "src": op.src, "dst": op.dst, "count": op.count, "label": op.label}
    return {
        "kind": "collective",
        "op": op.op,
        "algorithm": op.algorithm,
        "group": list(op.group),
        "count": op.count,
        "label": op.label,
    }


def _op_from(message: Mapping[str, Any]) -> Op:
    kind = message["kind"]
    if kind == "compute":
        seconds = tuple((int(r), float(s)) for r, s in message["seconds"])
        return Compute(seconds, str(message["label"]))
    if kind == "p2p":
        return PointToPoint(
            int(message["src"]), int(message["dst"]), int(message["count"]), str(message["label"])
        )
    if kind == "collective":
        return GroupCollective(
            str(message["op"]),
            str(message["algorithm"]),
            tuple(int(r) for r in message["group"]),
            int(message["count"]),
            str(message["label"]),
        )
    raise ValueError(f"unknown op kind {kind!r}")


# --- validation and planning ----------------------------------------------------------------


def _where(program: Program, slot: int, index: int | None = None, label: str = "") -> str:
    where = f"program {program.name!r} slot {slot}"
    return where if index is None else f"{where} op {index} ({label})"


def _check_ranks(ranks: Sequence[int], layout: Layout, where: str) -> None:
    outside = [r for r in ranks if not 0 <= r < layout.size]
    if outside:
        raise ProgramError(f"{where}: rank(s) {outside} not in a layout of {layout.size} ranks")
    if len(set(ranks)) != len(ranks):
        raise ProgramError(f"{where}: a rank is listed twice in {list(ranks)}")


def validate(program: Program, layout: Layout) -> None:
    """Refuse, with the slot and op named, what cannot run: empty slots, ranks outside the
    layout or listed twice, counts <= 0, negative compute, a point-to-point transfer to
    itself. (Whether an algorithm suits its group is checked when it is planned.)"""
    if not program.slots:
        raise ProgramError(f"program {program.name!r} has no slots")
    index = 0
    for s, slot in enumerate(program.slots):
        if not slot.ops:
            raise ProgramError(f"{_where(program, s)} has no ops")
        for op in slot.ops:
            if isinstance(op, Compute):
                where = _where(program, s, index, op.label)
                _check_ranks([r for r, _ in op.seconds], layout, where)
                bad = [x for _, x in op.seconds if not (math.isfinite(x) and x >= 0)]
                if bad:
                    raise ProgramError(f"{where}: compute seconds must be >= 0, got {bad}")
            else:
                group = op.collective().group if isinstance(op, PointToPoint) else op.group
                name = op.label if isinstance(op, PointToPoint) else op.name
                where = _where(program, s, index, name)
                if not group:
                    raise ProgramError(f"{where}: an empty group")
                _check_ranks(group, layout, where)
                if op.count <= 0:
                    raise ProgramError(f"{where}: count must be > 0, got {op.count}")
            index += 1


def sub_layout(layout: Layout, group: Sequence[int]) -> Layout:
    """The layout of ``group`` alone: member i's server and rail, as group rank i."""
    return Layout(
        tuple(layout.servers[r] for r in group), tuple(layout.local_ranks[r] for r in group)
    )


def _relabel(plan: Plan, group: Sequence[int], prefix: str) -> Plan:
    """``plan`` (planned on the group's sub-layout) in global ranks and the op's buffers."""

    def region(r: Region) -> Region:
        return Region(prefix + r.buffer, r.offset, r.count)

    def transfer(t: Transfer) -> Transfer:
        return Transfer(group[t.peer], region(t.region), t.reduce)

    steps = tuple(
        PlanStep(
            step.phase,
            tuple(transfer(t) for t in step.sends),
            tuple(transfer(t) for t in step.recvs),
            tuple(Copy(region(c.src), region(c.dst)) for c in step.copies),
        )
        for step in plan.steps
    )
    buffers = tuple((prefix + name, count) for name, count in plan.buffers)
    return Plan(plan.collective, plan.algorithm, group[plan.rank], plan.count, buffers, steps)


def _step_bytes(plan: Plan, k: int, sent: bool) -> dict[int, int]:
    """Bytes of step ``k`` to (``sent``) or from each peer; nothing past the last step."""
    if k >= len(plan.steps):
        return {}
    out: dict[int, int] = {}
    step = plan.steps[k]
    for t in step.sends if sent else step.recvs:
        out[t.peer] = out.get(t.peer, 0) + t.region.nbytes
    return out


@dataclass(frozen=True)
class _PlannedOp:
    """One data-moving op, planned for every member (global rank -> its plan)."""

    index: int
    op: GroupCollective
    plans: Mapping[int, Plan]

    @property
    def steps(self) -> int:
        return max(len(p.steps) for p in self.plans.values())


def _plan_op(
    program: Program,
    slot: int,
    index: int,
    op: GroupCollective,
    layout: Layout,
    registry: AlgorithmRegistry,
) -> _PlannedOp:
    where = _where(program, slot, index, op.name)
    try:
        algorithm = registry.get(op.op, op.algorithm)
        sub = sub_layout(layout, op.group)
        plans = {
            rank: _relabel(algorithm.plan(sub, g, op.count), op.group, f"op{index}.")
            for g, rank in enumerate(op.group)
        }
    except PlanError as error:
        raise ProgramError(f"{where}: {error}") from None
    planned = _PlannedOp(index, op, plans)
    # Step k of the op must be step k on both ends of every pair (see the module docstring).
    for k in range(planned.steps):
        sent = {(a, b): n for a, p in plans.items() for b, n in _step_bytes(p, k, True).items()}
        got = {(a, b): n for b, p in plans.items() for a, n in _step_bytes(p, k, False).items()}
        wrong = [x for x in sorted(sent.keys() | got.keys()) if sent.get(x) != got.get(x)]
        if wrong:
            a, b = wrong[0]
            raise ProgramError(
                f"{where}: in its step {k} rank {a} sends {sent.get((a, b), 0)} B to rank "
                f"{b}, which receives {got.get((a, b), 0)} B from it then (too few elements "
                f"per rank for this algorithm? {op.count} among {len(op.group)})"
            )
    return planned


def _planned(
    program: Program, layout: Layout, registry: AlgorithmRegistry | None
) -> list[list[_PlannedOp]]:
    """Every data-moving op of every slot, planned for all its members."""
    validate(program, layout)
    registry = registry or default_registry()
    slots: list[list[_PlannedOp]] = [[] for _ in program.slots]
    for s, index, op in program.collectives():
        slots[s].append(_plan_op(program, s, index, op, layout, registry))
    return slots


def _merge(slot: Slot, planned: Sequence[_PlannedOp], rank: int) -> list[PlanStep]:
    """Rank ``rank``'s steps of one slot: step k of each of its ops, in program order, and
    its compute spread evenly over the slot's steps."""
    computing = [op for op in slot.ops if isinstance(op, Compute) and op.of(rank) > 0]
    steps = max((p.steps for p in planned), default=0)
    if steps == 0 and any(isinstance(op, Compute) for op in slot.ops):
        steps = 1  # a slot that only computes
    share = sum(op.of(rank) for op in computing) / steps if steps else 0.0
    mine = [p for p in planned if rank in p.plans]
    merged = []
    for k in range(steps):
        parts = [(p, p.plans[rank].steps[k]) for p in mine if k < len(p.plans[rank].steps)]
        phase = " + ".join(
            [f"{p.op.name} {step.phase}" for p, step in parts] + [op.label for op in computing]
        )
        merged.append(
            PlanStep(
                phase or (f"{slot.label} idle" if slot.label else "idle"),
                tuple(t for _, step in parts for t in step.sends),
                tuple(t for _, step in parts for t in step.recvs),
                tuple(c for _, step in parts for c in step.copies),
                share,
            )
        )
    return merged


def _compose(program: Program, rank: int, slots: Sequence[Sequence[_PlannedOp]]) -> Plan:
    buffers = [
        buffer
        for planned in slots
        for p in planned
        if rank in p.plans
        for buffer in p.plans[rank].buffers
    ]
    steps = [
        step
        for slot, planned in zip(program.slots, slots, strict=True)
        for step in _merge(slot, planned, rank)
    ]
    return Plan(PROGRAM, program.name, rank, program.elements(), tuple(buffers), tuple(steps))


def compose(
    program: Program, layout: Layout, rank: int, registry: AlgorithmRegistry | None = None
) -> Plan:
    """Rank ``rank``'s plan of ``program`` (ProgramError if the program cannot run)."""
    if not 0 <= rank < layout.size:
        raise ProgramError(f"rank {rank} is not in a layout of {layout.size} ranks")
    return _compose(program, rank, _planned(program, layout, registry))


def compose_all(
    program: Program, layout: Layout, registry: AlgorithmRegistry | None = None
) -> list[Plan]:
    """Every rank's plan (each op planned once for all)."""
    slots = _planned(program, layout, registry)
    return [_compose(program, rank, slots) for rank in range(layout.size)]


def step_slots(
    program: Program, layout: Layout, registry: AlgorithmRegistry | None = None
) -> list[list[int]]:
    """Per rank, the slot each step of its plan belongs to (what a run's per-step phase
    records are grouped by to time the program's slots)."""
    slots = _planned(program, layout, registry)
    return [
        [
            index
            for index, (slot, planned) in enumerate(zip(program.slots, slots, strict=True))
            for _ in _merge(slot, planned, rank)
        ]
        for rank in range(layout.size)
    ]


def expected(program: Program, layout: Layout, rank: int) -> Result:
    """Rank ``rank``'s buffers around one run of ``program``: each op's operation result,
    in the op's buffers and global ranks, its inputs from the op's place in the pattern."""
    validate(program, layout)
    inputs: list[str] = []
    outputs: list[str] = []
    checks: list[Expected] = []
    starts: list[tuple[str, int]] = []
    origin = 0
    for _, index, op in program.collectives():
        if rank in op.group:
            try:
                result = operation(op.op).result(op.group.index(rank), len(op.group), op.count)
            except UnknownOperation as error:
                raise ProgramError(f"program {program.name!r} op {index}: {error}") from None
            prefix = f"op{index}."
            inputs += [prefix + name for name in result.inputs]
            outputs += [prefix + name for name in result.outputs]
            starts += [(prefix + name, origin + result.start(name)) for name in result.inputs]
            checks += [
                Expected(
                    prefix + e.buffer,
                    e.offset,
                    e.count,
                    origin + e.start,
                    tuple(op.group[s] for s in e.sources),
                )
                for e in result.expected
            ]
        origin += op.count
    return Result(tuple(inputs), tuple(outputs), tuple(checks), tuple(starts))
