"""One configuration's forecast: its schedule, its flows' paths, their fair shares, its time.

For a policy, a collective (and algorithm) and a size on a placement of a fabric::

    time = operation latency + operation overhead
           + sum over steps of repeat x (latency wait + step overhead + transfer / efficiency)

- the steps are the plans' (orchestrator/forecast/schedule.py), each transfer cut over the
  connections a run opens per peer (orchestrator.collectives.ceilings.default_channels);
- a step's transfer time is the fluid completion time of its connections under max-min
  fair sharing (orchestrator/forecast/sharing.py) of the links on their paths
  (orchestrator/forecast/paths.py: the policy's own choice), each link's capacity its
  emulated rate (the fabric's real rate x the emulation scale) x TCP's payload share
  (topologies.units.tcp_payload_share of the emulator recipe's frames);
- the latency wait of a step is the largest one-way latency of its send pairs and the
  operation latency the fabric's per-operation figure, both as the workers apply them
  (orchestrator/collectives/latency.py, topologies/latency.py);
- the overheads and the efficiency are what this machine measured
  (orchestrator/forecast/calibration.py): what a step costs the workers beyond its bytes,
  and the share of the fluid rate TCP reaches on the emulated links. Without a
  calibration they are 0, 0 and 1: the model alone.

A policy whose paths depend on what only a run knows (under ECMP, the source ports a GPU
with two NIC ports or more gets from its kernel; ``host_ports: hash``) has no single
forecast: :func:`forecast` routes it under ``salts`` draws and reports the mean and the
10th and 90th percentiles of the time; a deterministic one is routed once (ECMP too on a
fabric of one NIC port per GPU: Open vSwitch's hash is computed, orchestrator/forecast/
paths.py).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist, fmean

from orchestrator.collectives.ceilings import default_channels, layout_of
from orchestrator.collectives.nccl import algbw_gbps, bus_factor
from orchestrator.collectives.plans import element_count
from orchestrator.emulation.recipe import current_recipe, payload_share_of
from orchestrator.forecast.calibration import ForecastCalibration, Parts
from orchestrator.forecast.paths import PolicyRouter, Routed
from orchestrator.forecast.playout import Fabric, Figures, converging_links, play_out
from orchestrator.forecast.schedule import Step, schedule, split_channels
from orchestrator.forecast.sharing import FlowClass, completion_time
from orchestrator.testbed.hostports import HASH
from orchestrator.testbed.pinning import Flow, fabric_flows
from orchestrator.worker.spec import WorkerSpec
from topologies.description import FabricDescription
from topologies.latency import applied_latency
from topologies.model import Link, LinkKind

DEFAULT_SALTS = 16
#: the largest configuration played out rank by rank (ranks x steps per operation); beyond,
#: the step model's formula (about a second of play-out per draw at this size)
PLAY_LIMIT = 4096
PLAY_CONNECTIONS = 512
DirectedLink = Hashable  # (from node, to node)


@dataclass(frozen=True)
class Prediction:
    """A configuration's forecast, emulated: time per operation (us, the mean over salts),
    its 10th and 90th percentiles, and what it is made of (one salt's, the median)."""

    time_us: float
    p10_us: float
    p90_us: float
    size: int
    ranks: int
    collective: str
    salts: int
    latency_us: float = 0.0
    transfer_us: float = 0.0
    steps: int = 0
    # the prediction interval of a measurement: the hash draws' spread widened by the
    # model's expected error (the calibration's held-out error), :func:`prediction_band`;
    # None: the draws' own percentiles
    band_p10_us: float | None = None
    band_p90_us: float | None = None

    @property
    def band_us(self) -> tuple[float, float]:
        """The (10th, 90th) percentile of the time a run will measure."""
        low = self.p10_us if self.band_p10_us is None else self.band_p10_us
        high = self.p90_us if self.band_p90_us is None else self.band_p90_us
        return low, high

    @property
    def algbw(self) -> float:
        return algbw_gbps(self.size, self.time_us)

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.collective, self.ranks)

    def busbw_at(self, time_us: float) -> float:
        return algbw_gbps(self.size, time_us) * bus_factor(self.collective, self.ranks)

    @property
    def busbw_p10(self) -> float:
        """busbw of the slow end (the 90th percentile of the time)."""
        return self.busbw_at(self.p90_us)

    @property
    def busbw_p90(self) -> float:
        return self.busbw_at(self.p10_us)


@dataclass
class FabricModel:
    """A fabric description's links as the model sees them: directed, bytes/s emulated."""

    description: FabricDescription
    capacity: dict[DirectedLink, float] = field(default_factory=dict)
    #: the directed links from a ToR into a GPU's NIC port (where incast happens)
    into_gpu: set[DirectedLink] = field(default_factory=set)
    #: the emulated links' token buckets as time at their rate (the play-out spends what
    #: they saved while idle: orchestrator/forecast/playout.py _Buckets)
    bucket_s: float = 0.0

    @classmethod
    def of(cls, description: FabricDescription, *, buckets: bool = True) -> FabricModel:
        """The fabric as the emulation shapes it; ``buckets=False`` leaves out the shapers'
        token buckets (what a comparison with the full-size model, which has none, needs)."""
        emulation = description.fabric.spec.emulation
        bucket_s = current_recipe().shaping.burst_s if buckets else 0.0
        model = cls(description, bucket_s=bucket_s)
        # TCP's payload per frame: the run's, or under the recipe a run would use.
        payload_share = payload_share_of(description)
        # Parallel links between two switches (a generated fabric can have them) are one
        # link of their summed rate: ECMP's hash and path-pinned's assignment spread the
        # connections over them; what that leaves out is in docs/forecast.md
        # ... and each of them on its own too, as ``(from, to, port)``, for the connections
        # whose path says which one they take (a select group's choice: paths.Routed.lanes)
        links = description.fabric.links
        pairs = Counter(frozenset((x.a, x.b)) for x in links)
        for link in links:
            rate = emulation.emulated(link.capacity) / 8 * payload_share
            for a, b in ((link.a, link.b), (link.b, link.a)):
                model.capacity[(a, b)] = model.capacity.get((a, b), 0.0) + rate
                if pairs[frozenset((a, b))] > 1:
                    model.capacity[(a, b, link.port_of(a))] = rate
            if link.kind is LinkKind.NIC:
                gpu = link.a if link.a in description.fabric.gpus else link.b
                model.into_gpu.add((link.other(gpu), gpu))
        return model


def prediction_band(times: Sequence[float], error: float) -> tuple[float, float]:
    """The 10th and 90th percentiles of the time a run will measure, in the units of
    ``times``: one of the equally likely hash draws' times, off by the model's relative
    error, taken as normal with standard deviation ``error`` (the calibration's error on
    cells its fit left out). A run measures t x (1 + e): below x with probability
    mean over draws of P(e <= x / t - 1). ``error`` 0: the draws' own percentiles.

    Why: the draws alone say how the paths may fall; a path-independent configuration has
    one draw and a band of zero width, which any measurement misses by the model's error.
    """
    if error <= 0 or not times:
        return percentile(times, 0.1), percentile(times, 0.9)
    noise = NormalDist(0.0, error)

    def below(x: float) -> float:
        return fmean(noise.cdf(x / t - 1.0) for t in times)

    def quantile(q: float) -> float:
        low, high = min(times) * (1 - 6 * error), max(times) * (1 + 6 * error)
        for _ in range(60):  # bisection: 2^-60 of the bracket
            middle = (low + high) / 2
            low, high = (middle, high) if below(middle) < q else (low, middle)
        return (low + high) / 2

    return quantile(0.1), quantile(0.9)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between order statistics."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    at = q * (len(ordered) - 1)
    low = math.floor(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


class ConfigurationModel:
    """Forecasts for one placement of one fabric (routes cached per policy and collective)."""

    def __init__(
        self,
        description: FabricDescription,
        workers: Sequence[WorkerSpec],
        calibration: ForecastCalibration | None = None,
        *,
        host_ports: str = "balanced",
        failed: frozenset[Link] = frozenset(),
        salts: int = DEFAULT_SALTS,
        channels: int | None = None,
        recorded: Mapping[tuple[str, str, str], Routed] | None = None,
        routers: dict[str, PolicyRouter] | None = None,
        fabric: FabricModel | None = None,
    ) -> None:
        self.description = description
        self.fabric = fabric or FabricModel.of(description)
        self.workers = list(workers)
        self.layout = layout_of(self.workers)
        self.calibration = calibration or ForecastCalibration()
        self.host_ports = host_ports
        self.failed = failed
        self.salts = salts
        self.channels = channels
        #: per (policy, collective, algorithm), paths a run recorded (orchestrator/forecast/
        #: recorded.py): they replace the policy's for the connections they cover
        self.recorded = dict(recorded or {})
        # ``routers`` and ``fabric`` may be shared by the models of one fabric with the same
        # links down (a program's groups): a router renders its policy for the whole fabric
        # (path pinning publishes every pair's paths), which is the same for every group
        self._routers: dict[str, PolicyRouter] = {} if routers is None else routers
        self._routes: dict[tuple[str, str, str, int], Routed] = {}
        self._playable: dict[tuple[str, str], bool] = {}
        applied = applied_latency(description.fabric, [w.host for w in self.workers])
        self.one_way = applied.one_way
        self.operation_latency = applied.operation

    def router(self, policy: str) -> PolicyRouter:
        if policy not in self._routers:
            self._routers[policy] = PolicyRouter(self.description, policy, self.failed)
        return self._routers[policy]

    def channels_for(self, collective: str, algorithm: str) -> int:
        if self.channels:
            return self.channels
        nic_ports = self.description.fabric.spec.nic_ports
        return default_channels(self.workers, collective, algorithm, nic_ports)

    def routed(self, policy: str, collective: str, algorithm: str, salt: int) -> Routed:
        key = (policy, collective, algorithm, salt)
        if key not in self._routes:
            channels = self.channels_for(collective, algorithm)
            groups = fabric_flows(self.workers, [(collective, algorithm)], channels)
            routed = self.router(policy).route(self.workers, groups, self.host_ports, salt)
            recorded = self.recorded.get((policy, collective, algorithm))
            if recorded is not None:
                # a recorded path replaces the computed one, the link it names among
                # parallel ones too
                lanes = {f: x for f, x in routed.lanes.items() if f not in recorded.paths}
                routed = Routed(
                    {**routed.paths, **recorded.paths},
                    {**routed.source_ports, **recorded.source_ports},
                    {**lanes, **recorded.lanes},
                )
            self._routes[key] = routed
        return self._routes[key]

    def forget(self, policy: str, collective: str, algorithm: str) -> None:
        """Drop the routes computed for a collective (its recorded paths changed)."""
        for key in [k for k in self._routes if k[:3] == (policy, collective, algorithm)]:
            del self._routes[key]

    def is_recorded(self, policy: str, collective: str, algorithm: str) -> bool:
        """Whether recorded paths cover every fabric connection of the collective: then
        no hash is left to draw. Where some are missing, their paths are still drawn."""
        recorded = self.recorded.get((policy, collective, algorithm))
        if recorded is None:
            return False
        channels = self.channels_for(collective, algorithm)
        flows = fabric_flows(self.workers, [(collective, algorithm)], channels)[0]
        return all(f in recorded.paths for f in flows)

    def draws_for(self, policy: str, collective: str, algorithm: str) -> int:
        """How many routings to forecast a collective under: one where recorded paths
        cover it, else :meth:`salts_for`."""
        if self.is_recorded(policy, collective, algorithm):
            return 1
        return self.salts_for(policy)

    def salts_for(self, policy: str) -> int:
        """How many hash outcomes to draw: 1 where nothing is left to a hash."""
        hashed = self.router(policy).hashed or self.host_ports == HASH
        return self.salts if hashed else 1

    def step_flows(self, step: Step, routed: Routed, channels: int) -> list[FlowClass]:
        """The step's connections as flow classes (identical paths and bytes merged)."""
        same: Counter[tuple[tuple[Hashable, ...], int]] = Counter()
        for src, dst, nbytes in step.transfers:
            for channel, part in enumerate(split_channels(nbytes, channels)):
                links = self._links(routed, (src, dst, channel))
                same[(links, part)] += 1
        classes = []
        for (links, part), count in same.items():
            per_link: dict[DirectedLink, float] = {}
            for link in links:
                per_link[link] = per_link.get(link, 0.0) + count
            classes.append(FlowClass(count, part, per_link))
        return classes

    def _links(self, routed: Routed, flow: Flow) -> tuple[Hashable, ...]:
        """The directed links of a flow's path, each of parallel links the flow's path
        names (``Routed.lanes``) as that one alone; the others as their node pair."""
        path = self._path(routed, flow)
        lanes = routed.lanes.get(flow) or routed.lanes.get((flow[0], flow[1], 0), ())
        by_pair = {(a, b): (a, b, port) for a, b, port in lanes}
        return tuple(by_pair.get(pair, pair) for pair in itertools.pairwise(path))

    def _path(self, routed: Routed, flow: Flow) -> tuple[str, ...]:
        if flow in routed.paths:
            return routed.paths[flow]
        src, dst = self.workers[flow[0]].host, self.workers[flow[1]].host
        fabric = self.description.fabric
        if fabric.gpus[src].server == fabric.gpus[dst].server:
            return (src, fabric.servers[fabric.gpus[src].server].nvswitch, dst)
        return routed.paths[(flow[0], flow[1], 0)]

    def _incast_links(self, flows: Sequence[FlowClass]) -> list[DirectedLink]:
        """NIC downlinks that this step's connections reach over more than one upstream
        link (:func:`orchestrator.forecast.playout.converging_links`)."""
        return converging_links([f.per_link for f in flows if f.count > 0], self.fabric.into_gpu)

    def converging(self, policy: str, collective: str, algorithm: str, salt: int = 0) -> bool:
        """Whether the incast share can change a play-out of this configuration: whether
        its connections, all together, reach a GPU's NIC downlink over more than one
        upstream link (the connections holding bytes at any moment are a subset of
        them). The calibration's fit plays a configuration that cannot once for every
        incast share. Why one size and salt 0 are enough: the plans cut a step's bytes
        into the same peers and channels at every size (a part of zero bytes is still a
        flow here), and the fit plays only configurations no hash decides, with salt 0."""
        steps = self._steps_with_flows(policy, collective, algorithm, 1 << 20, salt)
        return bool(self._incast_links([f for _, flows in steps for f in flows]))

    def _steps_with_flows(
        self, policy: str, collective: str, algorithm: str, size: int, salt: int
    ) -> list[tuple[Step, list[FlowClass]]]:
        """The schedule's steps at ``size`` bytes, each with its connections as flow
        classes on the policy's paths under ``salt``."""
        count = element_count(collective, size, self.layout.size)
        routed = self.routed(policy, collective, algorithm, salt)
        channels = self.channels_for(collective, algorithm)
        return [
            (step, self.step_flows(step, routed, channels))
            for step in schedule(self.layout, collective, algorithm, count)
        ]

    def wait(self, step: Step) -> float:
        return max((self.one_way[s][d] for s, d, _ in step.transfers), default=0.0)

    def parts(
        self,
        policy: str,
        collective: str,
        algorithm: str,
        size: int,
        salt: int,
        incast: float | None = None,
    ) -> Parts:
        """The bare model's parts of one operation under one salt (emulated seconds), with
        NIC downlinks that several senders converge on kept to ``incast`` of their rate
        (default: the calibration's)."""
        incast = self.calibration.incast if incast is None else incast
        out = []
        for step, flows in self._steps_with_flows(policy, collective, algorithm, size, salt):
            capacity = _capacity(self.fabric.capacity, flows)
            if incast < 1.0:
                for link in self._incast_links(flows):
                    capacity[link] *= incast
            seconds = completion_time(flows, capacity)
            out.append((step.repeat, self.wait(step), seconds))
        return Parts(self.operation_latency, tuple(out))

    def playable(self, collective: str, algorithm: str) -> bool:
        """Whether the play-out forecasts this collective here, rather than the step model:
        its events grow with ranks x steps and each shares the links among the connections
        that hold bytes, so up to :data:`PLAY_LIMIT` rank-steps and
        :data:`PLAY_CONNECTIONS` connections."""
        key = (collective, algorithm)
        if key not in self._playable:
            n = self.layout.size
            count = element_count(collective, 1 << 20, n)
            steps = schedule(self.layout, collective, algorithm, count)
            pairs = {(src, dst) for step in steps for src, dst, _ in step.transfers}
            connections = len(pairs) * self.channels_for(collective, algorithm)
            rank_steps = n * sum(s.repeat for s in steps)
            self._playable[key] = rank_steps <= PLAY_LIMIT and connections <= PLAY_CONNECTIONS
        return self._playable[key]

    def playout_fabric(self, policy: str, collective: str, algorithm: str, salt: int) -> Fabric:
        """What the play-out needs of this placement under one routing."""
        routed = self.routed(policy, collective, algorithm, salt)
        return Fabric(
            layout=self.layout,
            capacity=self.fabric.capacity,
            into_gpu=frozenset(self.fabric.into_gpu),
            one_way=self.one_way,
            operation_latency=self.operation_latency,
            path_of=lambda flow: self._path(routed, flow),
            links_of=lambda flow: self._links(routed, flow),
            bucket_s=self.fabric.bucket_s,
        )

    def play(
        self,
        policy: str,
        collective: str,
        algorithm: str,
        size: int,
        salt: int,
        figures: Figures,
        iterations: int = 1,
    ) -> float:
        """Emulated seconds per operation, every rank's plan played out under one routing
        (orchestrator/forecast/playout.py)."""
        fabric = self.playout_fabric(policy, collective, algorithm, salt)
        channels = self.channels_for(collective, algorithm)
        played = play_out(fabric, collective, algorithm, size, channels, figures, iterations)
        return played.time_s

    def forecast(
        self,
        policy: str,
        collective: str,
        algorithm: str,
        size: int,
        iterations: int = 1,
        *,
        played: bool | None = None,
    ) -> Prediction:
        """The forecast of one configuration: every rank played out where the play-out
        runs (:meth:`playable`), the step model's formula beyond; the mean over hash draws
        and their 10th and 90th percentiles where paths hash. ``iterations``: how many
        operations run back to back in a timed batch (they pipeline into each other).
        ``played``: force the play-out (True) or the step model (False; what the
        aggregated full-size model is checked against)."""
        cal = self.calibration
        salts = range(self.draws_for(policy, collective, algorithm))
        if played is None:
            played = self.playable(collective, algorithm)
        if played:
            figures = cal.figures()
            times = [
                self.play(policy, collective, algorithm, size, salt, figures, iterations)
                for salt in salts
            ]
            median = _median_index(times)
            # the step model's parts only to say what the median draw is made of
            chosen = self.parts(policy, collective, algorithm, size, median)
        else:
            draws = [self.parts(policy, collective, algorithm, size, salt) for salt in salts]
            times = [cal.time(d) for d in draws]
            median = _median_index(times)
            chosen = draws[median]
        band = prediction_band(times, cal.expected_error)
        return Prediction(
            time_us=fmean(times) * 1e6,
            p10_us=percentile(times, 0.1) * 1e6,
            p90_us=percentile(times, 0.9) * 1e6,
            band_p10_us=band[0] * 1e6,
            band_p90_us=band[1] * 1e6,
            size=size,
            ranks=self.layout.size,
            collective=collective,
            salts=len(salts),
            latency_us=chosen.latency * 1e6,
            transfer_us=chosen.transfer * 1e6,
            steps=chosen.step_count,
        )


def _median_index(times: Sequence[float]) -> int:
    """The draw whose time is the median (the upper one of an even count)."""
    return sorted(zip(times, range(len(times)), strict=True))[len(times) // 2][1]


def _capacity(
    capacity: Mapping[DirectedLink, float], flows: Sequence[FlowClass]
) -> dict[DirectedLink, float]:
    used = {link for f in flows for link in f.per_link}
    missing = [link for link in used if link not in capacity]
    if missing:
        raise ValueError(f"a path crosses {missing[0]}, which is not a link of the fabric")
    return {link: capacity[link] for link in used}
