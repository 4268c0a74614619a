"""A program's forecast (orchestrator/collectives/program.py): every rank's slots played in
order with the model's time for each operation, as the workers would run them.

A training iteration replayed by the workers is a program; so is its forecast's input:
the same slots, so a forecast and a replay of one workload are two timings of one thing.
Per slot and rank:

- a ``Compute`` takes its seconds from when the rank entered the slot;
- a collective or point-to-point op starts when the last of its group has entered the
  slot (a collective waits for its peers) and takes the collectives forecast's time for
  that group, size and algorithm on the fabric (orchestrator/forecast/model.py: the same
  routes, sharing, latency and calibration as ``astral forecast``), the group forecast on
  its own, less the per-operation latency and overhead: the workers run the whole program
  as one operation and pay those once, before the first slot (as the forecast does);
- the rank leaves the slot when the last of its ops ends (compute and transfers of a slot
  overlap: a step lasts the longer of the two, orchestrator/worker/executor.py).

The iteration ends when the last rank leaves its last slot. Where a rank's slot outlasts its
compute, the excess is communication the compute did not hide: counted as *exposed* time of
the kind of op that ended last (``tp``, ``ep``, ``pp``, ``dp``, from the op's label).

What it leaves out: ops of one slot that share links do not slow each other (each group's
time is forecast alone; on Astral's rail-aligned placement the concurrent groups of one
kind sit on different rails or servers, and where they do share a link the forecast is
optimistic).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.collectives.plans import ELEMENT_BYTES
from orchestrator.collectives.program import Compute, GroupCollective, PointToPoint, Program
from orchestrator.forecast.calibration import ForecastCalibration
from orchestrator.forecast.model import ConfigurationModel, FabricModel
from orchestrator.forecast.paths import PolicyRouter
from orchestrator.worker.spec import workers_from_description
from orchestrator.workload.timeline import KINDS, SlotSpan, Timeline, kind_of
from topologies.description import FabricDescription
from topologies.latency import applied_latency
from topologies.model import Link


@dataclass
class ProgramForecast:
    """When every rank leaves its last slot, and the time each spent exposed per kind."""

    ends: list[float]  # per rank, seconds (emulated) from the program's start
    compute: list[float]  # per rank, seconds of compute
    exposed: list[dict[str, float]]  # per rank: kind -> seconds not hidden by compute
    spans: list[list[tuple[str, float, float]]] = field(default_factory=list)  # per rank
    timeline: Timeline = field(default_factory=dict)  # per rank, its slots

    @property
    def seconds(self) -> float:
        return max(self.ends)

    @property
    def last_rank(self) -> int:
        return max(range(len(self.ends)), key=lambda r: self.ends[r])


class ProgramForecaster:
    """Forecasts programs on one fabric and placement (rank i plays ``gpus[i]``)."""

    def __init__(
        self,
        description: FabricDescription,
        gpus: Sequence[str],
        *,
        policy: str,
        calibration: ForecastCalibration | None = None,
        host_ports: str = "balanced",
        channels: int | None = None,
        failed: frozenset[Link] = frozenset(),
        fabric: FabricModel | None = None,
    ) -> None:
        self.description = description
        self.gpus = list(gpus)
        self.policy = policy
        self.calibration = calibration
        self.host_ports = host_ports
        self.channels = channels or description.fabric.spec.nic_ports
        self.failed = failed  # links down (what-if: astral forecast WORKLOAD --fail)
        self._models: dict[tuple[str, ...], ConfigurationModel] = {}
        self._routers: dict[str, PolicyRouter] = {}  # shared by every group's model
        self._fabric: FabricModel | None = fabric  # shared by every group's model
        self._times: dict[tuple[tuple[str, ...], str, str, int], float] = {}

    def op_seconds(self, op: GroupCollective) -> float:
        """The collectives forecast's time for ``op`` on its group, alone (emulated s)."""
        names = tuple(self.gpus[r] for r in op.group)
        size = op.count * ELEMENT_BYTES
        key = (names, op.op, op.algorithm, size)
        if key not in self._times:
            model = self._models.get(names)
            if model is None:
                workers = workers_from_description(self.description, names)
                model = ConfigurationModel(
                    self.description,
                    workers,
                    self.calibration,
                    host_ports=self.host_ports,
                    channels=self.channels,
                    failed=self.failed,
                    routers=self._routers,
                    fabric=self._fabric,
                )
                self._fabric = model.fabric
                self._models[names] = model
            prediction = model.forecast(self.policy, op.op, op.algorithm, size)
            # the program is one operation: its ops pay no operation latency or overhead
            # of their own (the workers wait them once, before the first slot)
            once = model.operation_latency + self._overhead()
            self._times[key] = max(0.0, prediction.time_us / 1e6 - once)
        return self._times[key]

    def _overhead(self) -> float:
        return self.calibration.operation_overhead_s if self.calibration else 0.0

    def entry(self) -> float:
        """When every rank enters the first slot: the operation's latency (every rank's
        is the fabric's per-operation figure) and the calibration's overhead, once."""
        latency = applied_latency(self.description.fabric, self.gpus).operation
        return latency + self._overhead()

    def forecast(self, program: Program) -> ProgramForecast:
        return play(program, len(self.gpus), self.op_seconds, self.entry())


def play(
    program: Program,
    ranks: int,
    op_seconds: Callable[[GroupCollective], float],
    entry: float,
) -> ProgramForecast:
    """``program``'s slots played in order on ``ranks`` ranks (module docstring), each
    communication op taking ``op_seconds(op)`` and every rank entering the first slot at
    ``entry``: the flow-by-flow forecaster's play and the full-size one's
    (orchestrator/forecast/fullsize.py), which differ only in where an op's time comes from."""
    n = ranks
    ready = [entry] * n
    compute = [0.0] * n
    exposed: list[dict[str, float]] = [dict.fromkeys(KINDS, 0.0) for _ in range(n)]
    spans: list[list[tuple[str, float, float]]] = [[] for _ in range(n)]
    timeline: Timeline = {rank: [] for rank in range(n)}
    for index, slot in enumerate(program.slots):
        enter = list(ready)
        busy: dict[int, float] = {}  # rank -> end of its compute in the slot
        last: dict[int, tuple[float, str]] = {}  # rank -> (end of its last op, kind)
        for op in slot.ops:
            if isinstance(op, Compute):
                for rank, seconds in op.seconds:
                    end = enter[rank] + seconds
                    busy[rank] = max(busy.get(rank, enter[rank]), end)
                    compute[rank] += seconds
                    spans[rank].append((op.label, enter[rank], end))
                continue
            group_op = op.collective() if isinstance(op, PointToPoint) else op
            start = max(enter[r] for r in group_op.group)
            end = start + op_seconds(group_op)
            for rank in group_op.group:
                spans[rank].append((group_op.name, start, end))
                if end > last.get(rank, (0.0, ""))[0]:
                    last[rank] = (end, kind_of(group_op.name))
        for rank in sorted(set(busy) | set(last)):
            done = busy.get(rank, enter[rank])
            comm_end, kind = last.get(rank, (0.0, ""))
            if comm_end > done:
                exposed[rank][kind] = exposed[rank].get(kind, 0.0) + comm_end - done
            ready[rank] = max(done, comm_end)
            span = SlotSpan(index, enter[rank], ready[rank], done - enter[rank], kind)
            timeline[rank].append(span)
    return ProgramForecast(ready, compute, exposed, spans, timeline)
