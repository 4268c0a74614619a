"""One training iteration of a workload as the workers' program: every GPU's compute, its
tensor-, expert-, pipeline- and data-parallel communication, in the order a 1F1B pipeline
runs them (orchestrator/collectives/program.py runs and verifies the result).

**Placement** (Astral's practice, Megatron-LM's order): global rank
``r = (stage * dp + d) * tp + t``. On a fabric whose ranks fill servers in order, the ``tp``
ranks of one (stage, d) are the GPUs of one server (tensor parallelism on NVLink), the ranks
of one (stage, t) differ by whole servers and share local rank ``t``: **a data-parallel
group sits on one rail**; a stage's servers are consecutive (a pod, where they fit).
Expert parallelism spreads the experts over ``ep`` consecutive data-parallel replicas of
one (stage, t), so its all-to-alls stay on the rail too.

**The schedule**: 1F1B (PipeDream-Flush, as Megatron-LM runs it): stage ``s`` first runs
``min(pp - 1 - s, m)`` forwards, then alternates one forward and one backward, then the
remaining backwards. Each forward or backward of one micro-batch on one stage is, per
layer of the stage: half the layer's compute, the tensor-parallel all-reduce (Megatron's
first, after attention), [for an MoE layer: the expert-parallel dispatch all-to-all, the
experts' compute, the combine all-to-all,] the other half (or the rest), the second
all-reduce. The split of a layer's compute into halves stands for attention and MLP (their
FLOPs differ by the layer's shape; the total is exact). The activations (forward) or their
gradients (backward) then go to the next (previous) stage's rank of the same (d, t).

**Data parallelism**: each stage's gradients are all-reduced over its data-parallel group
in buckets (``bucket_bytes``), overlapped with the last micro-batch's backward: bucket k
shares a slot with the backward's k-th layer from the end (a step lasts the longer of its
compute and its transfers, so the overlap is real in the emulation); the buckets left when
the backward is done follow it.

The program's slots are global, in the order of a timetable that plays the schedule with
every forward taking one unit and every backward two: the order any rank meets its slots
is its own schedule, and a slot waits only for the transfers of its own ops.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orchestrator.collectives.plans import ELEMENT_BYTES
from orchestrator.collectives.program import (
    Compute,
    GroupCollective,
    Op,
    PointToPoint,
    Program,
    ProgramError,
    Slot,
)
from orchestrator.workload import costs
from orchestrator.workload.spec import WorkloadSpec

FORWARD, BACKWARD = "forward", "backward"


@dataclass(frozen=True)
class Pass:
    """One forward or backward of micro-batch ``micro_batch`` on stage ``stage``."""

    kind: str
    stage: int
    micro_batch: int


@dataclass(frozen=True)
class Placement:
    """Which global rank plays (stage, d, t)."""

    tp: int
    pp: int
    dp: int
    ep: int

    @classmethod
    def of(cls, spec: WorkloadSpec) -> Placement:
        p = spec.parallel
        return cls(p.tp, p.pp, p.dp, p.ep)

    def rank(self, stage: int, d: int, t: int) -> int:
        return (stage * self.dp + d) * self.tp + t

    def stage_ranks(self, stage: int) -> list[int]:
        return [self.rank(stage, d, t) for d in range(self.dp) for t in range(self.tp)]

    def tp_groups(self, stage: int) -> list[tuple[int, ...]]:
        return [tuple(self.rank(stage, d, t) for t in range(self.tp)) for d in range(self.dp)]

    def dp_groups(self, stage: int) -> list[tuple[int, ...]]:
        return [tuple(self.rank(stage, d, t) for d in range(self.dp)) for t in range(self.tp)]

    def ep_groups(self, stage: int) -> list[tuple[int, ...]]:
        """``ep`` consecutive replicas of one (stage, t): the experts' all-to-all group."""
        return [
            tuple(self.rank(stage, first + i, t) for i in range(self.ep))
            for t in range(self.tp)
            for first in range(0, self.dp, self.ep)
        ]

    def expert_dp_groups(self, stage: int) -> list[tuple[int, ...]]:
        """The replicas that hold the same experts: one of every ep group (dp / ep ranks)."""
        return [
            tuple(self.rank(stage, first + i, t) for first in range(0, self.dp, self.ep))
            for t in range(self.tp)
            for i in range(self.ep)
        ]


def schedule(pp: int, micro_batches: int) -> list[Pass]:
    """Every pass of the iteration in timetable order (1F1B; a forward one unit of time,
    a backward two); ties go to the lower stage."""
    per_stage: list[list[Pass]] = []
    for s in range(pp):
        warmup = min(pp - 1 - s, micro_batches)
        order = [Pass(FORWARD, s, j) for j in range(warmup)]
        for j in range(micro_batches - warmup):
            order += [Pass(FORWARD, s, warmup + j), Pass(BACKWARD, s, j)]
        order += [Pass(BACKWARD, s, j) for j in range(micro_batches - warmup, micro_batches)]
        per_stage.append(order)
    end: dict[Pass, float] = {}
    start: dict[Pass, float] = {}
    free = [0.0] * pp
    pending = [list(order) for order in per_stage]
    while any(pending):
        progressed = False
        for s in range(pp):
            while pending[s]:
                p = pending[s][0]
                before = _producer(p, pp)
                if before is not None and before not in end:
                    break
                begin = max(free[s], end[before] if before is not None else 0.0)
                start[p], end[p] = begin, begin + (1.0 if p.kind == FORWARD else 2.0)
                free[s] = end[p]
                pending[s].pop(0)
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B always progresses
            raise RuntimeError("the 1F1B schedule deadlocked")
    return sorted(start, key=lambda p: (start[p], p.stage))


def _producer(p: Pass, pp: int) -> Pass | None:
    """The pass whose output ``p`` needs: the previous stage's forward, the next stage's
    backward, or (the last stage's backward) its own forward."""
    if p.kind == FORWARD:
        return Pass(FORWARD, p.stage - 1, p.micro_batch) if p.stage > 0 else None
    if p.stage < pp - 1:
        return Pass(BACKWARD, p.stage + 1, p.micro_batch)
    return Pass(FORWARD, p.stage, p.micro_batch)


def _elements(nbytes: float, group: int) -> int:
    """Elements (4 bytes) for ``nbytes``, at least one per group member."""
    return max(group, math.ceil(nbytes / ELEMENT_BYTES))


class _Builder:
    """Slots for one iteration (see the module docstring)."""

    def __init__(self, spec: WorkloadSpec, scale: float) -> None:
        self.spec = spec
        self.scale = scale
        self.at = Placement.of(spec)
        self.slots: list[Slot] = []

    def seconds(self, flops: float) -> float:
        """Emulated seconds of ``flops`` on one GPU: real compute time / scale."""
        return costs.compute_seconds(self.spec, flops) / self.scale

    def add(self, ops: Sequence[Op], label: str) -> None:
        if ops:
            self.slots.append(Slot(tuple(ops), label))

    def tp(self, stage: int, label: str) -> None:
        if self.at.tp > 1:
            count = _elements(costs.tp_allreduce_bytes(self.spec), self.at.tp)
            ops: list[Op] = [
                GroupCollective("all-reduce", "ring", g, count, f"tp {label}")
                for g in self.at.tp_groups(stage)
            ]
            self.add(ops, f"tp all-reduce {label}")

    def ep(self, stage: int, label: str) -> None:
        if self.at.ep > 1:
            # all-to-all's count is a rank's whole send buffer, ep equal blocks of it
            blocks = _elements(costs.ep_alltoall_bytes(self.spec) / self.at.ep, 1)
            count = blocks * self.at.ep
            ops: list[Op] = [
                GroupCollective("all-to-all", "direct", g, count, f"ep {label}")
                for g in self.at.ep_groups(stage)
            ]
            self.add(ops, f"ep all-to-all {label}")

    def compute(self, stage: int, flops: float, label: str, extra: Sequence[Op] = ()) -> None:
        ops: list[Op] = [Compute.on(self.at.stage_ranks(stage), self.seconds(flops), label)]
        self.add([*ops, *extra], label)

    def layer_pass(
        self, p: Pass, layer: int, overlapped: Sequence[Op] = (), last: bool = False
    ) -> None:
        """One layer of a forward or backward pass (order reversed for a backward)."""
        spec, s, j = self.spec, p.stage, p.micro_batch
        flops = (
            costs.forward_flops(spec, layer)
            if p.kind == FORWARD
            else costs.backward_flops(spec, layer)
        )
        if last:
            flops += costs.logits_flops(spec) * (1.0 if p.kind == FORWARD else 2.0)
        tag = f"{p.kind} mb{j} layer {layer}"
        self.compute(s, flops / 2, f"{tag} (first half)", overlapped)
        self.tp(s, tag)
        if spec.model.is_moe_layer(layer):
            self.ep(s, f"dispatch {tag}")
        self.compute(s, flops / 2, f"{tag} (second half)")
        if spec.model.is_moe_layer(layer):
            self.ep(s, f"combine {tag}")
        self.tp(s, tag)

    def handoff(self, p: Pass) -> None:
        """The pass's output to the next stage (forward) or the previous one (backward)."""
        to = p.stage + 1 if p.kind == FORWARD else p.stage - 1
        if not 0 <= to < self.at.pp:
            return
        count = _elements(costs.pp_bytes(self.spec), 1)
        ops: list[Op] = [
            PointToPoint(
                self.at.rank(p.stage, d, t),
                self.at.rank(to, d, t),
                count,
                f"pp {p.kind} mb{p.micro_batch}",
            )
            for d in range(self.at.dp)
            for t in range(self.at.tp)
        ]
        self.add(ops, f"pp {p.kind} mb{p.micro_batch} stage {p.stage} -> {to}")

    def buckets(self, stage: int) -> list[Op]:
        """The stage's gradient all-reduces, bucket by bucket, every group at once."""
        dense, expert = costs.dp_gradient_bytes(self.spec, stage)
        ops: list[Op] = []
        for nbytes, groups, what in (
            (dense, self.at.dp_groups(stage), "dp"),
            (expert, self.at.expert_dp_groups(stage), "expert dp"),
        ):
            if nbytes <= 0 or len(groups[0]) < 2:
                continue
            for k, size in enumerate(costs.bucket_sizes(nbytes, self.spec.bucket_bytes)):
                count = _elements(size, len(groups[0]))
                ops += [
                    GroupCollective("all-reduce", "ring", g, count, f"{what} bucket {k}")
                    for g in groups
                ]
        return ops

    def build(self) -> Program:
        spec = self.spec
        last_mb = spec.micro_batches - 1
        for p in schedule(self.at.pp, spec.micro_batches):
            layers = list(spec.layers_of(p.stage))
            final = layers[-1] if p.stage == self.at.pp - 1 else None
            if p.kind == FORWARD:
                for layer in layers:
                    self.layer_pass(p, layer, last=layer == final)
            else:
                pending = self.buckets(p.stage) if p.micro_batch == last_mb else []
                per_layer = _spread(pending, len(layers))
                for layer, overlapped in zip(reversed(layers), per_layer, strict=True):
                    self.layer_pass(p, layer, overlapped, last=layer == final)
            self.handoff(p)
        return Program(f"{spec.name}-iteration", tuple(self.slots))


def _spread(ops: list[Op], layers: int) -> Iterator[list[Op]]:
    """The bucket ops over the backward's layers: the k-th group of buckets with the k-th
    layer from the end (gradients are ready in that order), the last layer's share taking
    what is left."""
    groups = _group_by_label(ops)
    per_layer = max(1, math.ceil(len(groups) / layers))
    for i in range(layers):
        end = (i + 1) * per_layer if i < layers - 1 else len(groups)
        yield [op for group in groups[i * per_layer : end] for op in group]


def _group_by_label(ops: list[Op]) -> list[list[Op]]:
    """Ops of one bucket (every group's all-reduce of it) stay together."""
    groups: dict[str, list[Op]] = {}
    for op in ops:
        key = op.label if isinstance(op, GroupCollective) else ""
        groups.setdefault(key, []).append(op)
    return list(groups.values())


def iteration_program(spec: WorkloadSpec, scale: float) -> Program:
    """The program of one training iteration of ``spec`` (module docstring); compute times
    are emulated seconds at emulation ``scale`` (real seconds / scale), as the links'.

    A ProgramError, before anything is built, for an iteration whose program would be
    absurd: a compute step longer than ``costs.MAX_STEP_SECONDS`` emulated, or a gradient
    exchange of more than ``costs.MAX_BUCKETS`` buckets (a spec that did not come through
    ``parse_workload``, which refuses those, naming the key)."""
    problem = costs.compute_problem(spec, scale)
    if problem:
        raise ProgramError(f"workload {spec.name}: {problem}")
    for stage in range(spec.parallel.pp):
        dense, expert = costs.dp_gradient_bytes(spec, stage)
        count = sum(costs.bucket_count(n, spec.bucket_bytes) for n in (dense, expert))
        if count > costs.MAX_BUCKETS:
            raise ProgramError(
                f"workload {spec.name}: stage {stage}'s gradients make {count} buckets of "
                f"{spec.bucket_bytes} B, above the {costs.MAX_BUCKETS} an exchange allows"
            )
    return _Builder(spec, scale).build()
