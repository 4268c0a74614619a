"""A training iteration on a full-size fabric (a 65,536-GPU Astral pod): representative
ranks played, each communication op timed by link class (docs/workloads.md, "Full size").

Flow by flow (orchestrator/forecast/program.py) does not fit there twice over: the program
of 65,536 ranks has about 10^4 slots of up to 10^4 ops each, and every group's forecast
routes its flows on the fabric's 3-million-link graph. The layout's symmetry avoids both:

- **representative replicas**: with the placement ``(stage * dp + d) * tp + t`` every
  data-parallel replica ``d`` runs the same passes, compute and ops, on groups of the same
  shape where the fabric's pods, ToR groups and rails are alike. The program is compiled
  for ``dp' = min(dp, 2 ep)`` replicas with the same micro-batches each: two
  expert-parallel blocks, so that every kind of group the full layout has (a server's
  tensor-parallel group, a stage's data-parallel group on one rail, an expert-parallel
  block, the expert data-parallel group across blocks, a pipeline pair) has one to stand
  for it; 2 replicas for a dense model. That is ``pp x tp x dp'`` ranks (128 for tp 8,
  pp 8, ep 1) instead of 65,536;
- **each op timed on the full layout's groups**: an op of the reduced program stands for
  the groups of the full layout it represents (full replica ``d`` is represented by
  ``d' = ((d // ep) mod (dp' / ep)) x ep + d mod ep``): the tensor-parallel groups of
  every replica d' stands for, the one data-parallel group of all ``dp`` replicas on its
  rail, every other expert-parallel block, ... Its time is the slowest of theirs, each
  group's by the aggregated model (orchestrator/forecast/aggregate.py: the group's pairs
  classified by where their GPUs sit, the link classes' capacities from the planner's
  closed form; no fabric graph is built). Groups of one shape (their GPUs' servers, rails,
  ToR groups and pods alike up to relabelling: all the model looks at) are timed once.

Times are at real speed: the aggregated model has no emulation scale and applies no
calibration (the overheads it would apply are the emulator's). What it leaves out, beyond
what flow by flow leaves out (the ops of one slot do not slow each other): where the
groups one representative stands for differ in shape, every op takes the slowest of them,
an upper bound (on the planned pod and a layout aligned with it every kind has one shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from orchestrator.collectives.plans import ELEMENT_BYTES
from orchestrator.collectives.program import GroupCollective
from orchestrator.forecast.aggregate import Geometry, ScaleModel
from orchestrator.forecast.program import ProgramForecast, kind_of, play
from orchestrator.workload.iteration import Placement, iteration_program
from orchestrator.workload.spec import WorkloadSpec


def kept_replicas(spec: WorkloadSpec) -> int:
    """How many data-parallel replicas the reduced program keeps (module docstring)."""
    return min(spec.parallel.dp, 2 * spec.parallel.ep)


def reduced(spec: WorkloadSpec) -> WorkloadSpec:
    """``spec`` with only :func:`kept_replicas` replicas, each running the same
    micro-batches (the global batch shrinks with them)."""
    keep = kept_replicas(spec)
    batch = replace(spec.batch, global_batch=spec.micro_batches * spec.batch.micro_batch * keep)
    return replace(spec, parallel=replace(spec.parallel, dp=keep), batch=batch)


@dataclass(frozen=True)
class Reduction:
    """The full layout and the kept one: which full groups a kept group stands for."""

    full: Placement
    kept: Placement

    @classmethod
    def of(cls, spec: WorkloadSpec) -> Reduction:
        return cls(Placement.of(spec), Placement.of(reduced(spec)))

    def where(self, rank: int) -> tuple[int, int, int]:
        """(stage, d, t) of a kept rank."""
        tp, dp = self.kept.tp, self.kept.dp
        return rank // tp // dp, rank // tp % dp, rank % tp

    def replicas(self, d: int) -> np.ndarray:
        """The full replicas kept replica ``d`` stands for."""
        ep, blocks = self.kept.ep, self.kept.dp // self.kept.ep
        every = np.arange(self.full.dp, dtype=np.int64)
        return every[(every // ep % blocks) * ep + every % ep == d]

    def full_rank(self, stage: int, d: np.ndarray | int, t: np.ndarray | int) -> np.ndarray:
        return np.asarray((stage * self.full.dp + d) * self.full.tp + t, dtype=np.int64)

    def represented(self, op: GroupCollective) -> np.ndarray:
        """The full layout's groups ``op`` (on kept ranks) stands for: one row of GPU
        indices each, in the group's rank order."""
        at = [self.where(r) for r in op.group]
        stages = {s for s, _, _ in at}
        (s, d, t) = at[0]
        if op.op == "p2p":  # a pipeline pair: the same (d, t) on two stages
            reps = self.replicas(d)
            return np.stack([self.full_rank(stage, reps, t) for stage, _, _ in at], axis=1)
        if len(stages) == 1 and all(x[1] == d for x in at):  # tensor parallel: one server
            ts = np.array([x[2] for x in at], dtype=np.int64)
            return self.full_rank(s, self.replicas(d)[:, None], ts[None, :])
        ds = np.array([x[1] for x in at], dtype=np.int64)
        ep = self.kept.ep
        if len(stages) == 1 and all(x[2] == t for x in at):
            if ds.size == self.kept.dp:  # the stage's data-parallel group on rail t
                return self.full_rank(s, np.arange(self.full.dp), t)[None, :]
            if np.array_equal(ds, ds[0] + np.arange(ep)) and ds[0] % ep == 0:  # an ep block
                blocks = np.arange(self.full.dp // ep, dtype=np.int64)
                chosen = blocks[blocks % (self.kept.dp // ep) == ds[0] // ep]
                return self.full_rank(s, chosen[:, None] * ep + np.arange(ep)[None, :], t)
            if np.array_equal(ds, ds[0] + ep * np.arange(ds.size)):  # expert data parallel
                return self.full_rank(s, np.arange(ds[0], self.full.dp, ep), t)[None, :]
        raise ValueError(f"op {op.label!r}: its group {op.group} is none of the layout's")


def shapes(geometry: Geometry, rows: np.ndarray) -> list[tuple[bytes, np.ndarray]]:
    """The distinct shapes among ``rows`` (groups of GPU indices), one row each: per member
    its pod, server, rail, ToR group and fat-tree edge, relabelled by first appearance in
    the row (what the aggregated model's classes and link counts depend on)."""
    spec = geometry.spec
    pod, server, rail, index = geometry.coordinates(rows)
    down, g = spec.switch.down_ports, spec.gpus_per_server
    columns = (pod, server, rail, index // down, (index * g + rail) // down)
    labels = np.concatenate(
        [(c[:, :, None] == c[:, None, :]).argmax(axis=2) for c in columns], axis=1
    )
    _, first = np.unique(labels, axis=0, return_index=True)
    return [(labels[i].tobytes(), rows[i]) for i in sorted(first)]


@dataclass
class FullSizeForecast:
    """The played iteration of the representative ranks, at real speed."""

    played: ProgramForecast
    ranks: int  # representative ranks played
    gpus: int  # the fabric's (and the layout's) GPUs
    shapes: dict[str, int] = field(default_factory=dict)  # kind -> distinct group shapes


class FullSizeForecaster:
    """A workload's iteration on one full-size fabric, by representative ranks."""

    def __init__(self, model: ScaleModel, spec: WorkloadSpec, *, policy: str, salts: int = 8):
        self.model = model
        self.spec = spec
        self.policy = policy
        self.salts = salts
        self.reduction = Reduction.of(spec)
        # every op over the NIC's ports, as the flow-by-flow program forecast opens them
        self.channels = model.spec.nic_ports
        self._times: dict[tuple[tuple[int, ...], str, str, int], float] = {}
        self._by_shape: dict[tuple[bytes, str, str, int], float] = {}
        self._shapes: dict[str, set[bytes]] = {}

    def op_seconds(self, op: GroupCollective) -> float:
        """The slowest of the full groups ``op`` stands for, each alone (real s)."""
        key = (op.group, op.op, op.algorithm, op.count)
        if key not in self._times:
            size = op.count * ELEMENT_BYTES
            slowest = 0.0
            for shape, row in shapes(self.model.geometry, self.reduction.represented(op)):
                self._shapes.setdefault(kind_of(op.label), set()).add(shape)
                cached = (shape, op.op, op.algorithm, size)
                if cached not in self._by_shape:
                    self._by_shape[cached] = self.model.group_seconds(
                        self.policy, op.op, op.algorithm, row, size, self.channels, self.salts
                    )
                slowest = max(slowest, self._by_shape[cached])
            self._times[key] = slowest
        return self._times[key]

    def forecast(self) -> FullSizeForecast:
        program = iteration_program(reduced(self.spec), 1.0)  # compute at real speed
        kept = self.reduction.kept
        ranks = kept.tp * kept.pp * kept.dp
        played = play(program, ranks, self.op_seconds, self.model.operation_latency)
        return FullSizeForecast(
            played,
            ranks,
            self.spec.gpus,
            {kind: len(found) for kind, found in sorted(self._shapes.items())},
        )
