"""Full-size fabrics (65,536 GPUs per pod, 524,288 in all): flows aggregated by link class.

Flow by flow does not fit there: a ring all-reduce over a pod has 65,536 flows per step and
131,070 steps, an all-to-all 4.3 billion flows, and the fabric itself 3 million links. The
forecast instead uses the fabric's symmetry twice:

- **the schedule by symmetry** (orchestrator/forecast/schedule.py): every step of a ring is
  the same ring, shifted; an all-to-all sends the same block to every peer;
- **links by class**: every flow is classified by where its two GPUs sit (same server,
  same ToR group, same rail plane of a pod, elsewhere), which fixes the link classes it
  crosses, ``NIC``, ``ToR-agg``, ``agg-core`` up and down and ``NVLink``, exactly as a
  shortest path does on the generated fabric (the tests check the classes against
  ``topologies.properties`` routes on fabrics where both run). Each class has the number
  of links and the per-link capacity the planner's closed form gives
  (``topologies.planner``: no graph is built). The flows of one class are one
  :class:`~orchestrator.forecast.sharing.FlowClass` of ``count`` flows that load every link
  of a class they cross with ``count x crossings / links`` flows: the even spread that
  path pinning reaches on these symmetric fabrics.

ECMP does not spread evenly: hashing puts Poisson-like heaps on some links. For ``ecmp``
the load each class puts on a link class is multiplied by that class's *hot-link factor*,
the most-loaded link over the mean when the flows crossing it are thrown into its links at
random (sampled, one draw per salt): a step lasts as long as its most loaded link takes.

Max-min fair sharing and the step's completion time are then the same progressive filling
as flow by flow, on a handful of classes, and the latencies the same figures
(topologies/latency.py) by pair class. Figures are at real speed (no emulation scale):
this is what the model says the real fabric would do; the calibration's overheads, which
are the emulator's, are not applied.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from orchestrator.collectives.nccl import algbw_gbps, bus_factor
from orchestrator.collectives.plans import ELEMENT_BYTES, element_count
from orchestrator.forecast.sharing import FlowClass, completion_time
from topologies.fabricspec import FabricSpec
from topologies.latency import NICS_PER_MESSAGE
from topologies.model import LinkKind
from topologies.planner import plan
from topologies.units import TCP_PAYLOAD_SHARE

#: pair classes: the switches a shortest path crosses, and whether it adds an NVLink hop
NVLINK, ONE, THREE, FIVE = "nvlink", "1 switch", "3 switches", "5 switches"
CROSSES = {
    NVLINK: (LinkKind.NVLINK,),
    ONE: (LinkKind.NIC,),
    THREE: (LinkKind.NIC, LinkKind.TOR_AGG),
    FIVE: (LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE),
}
SWITCHES = {NVLINK: 0, ONE: 1, THREE: 3, FIVE: 5}
KINDS = ("astral", "fat-tree", "rail-optimized", "rail-only")
ALGORITHMS = (
    ("all-reduce", "ring"),
    ("all-reduce", "hierarchical"),
    ("all-to-all", "direct"),
    ("all-gather", "ring"),
    ("reduce-scatter", "ring"),
)


class Unsupported(ValueError):
    """A fabric kind or algorithm the aggregated model does not cover."""


@dataclass(frozen=True)
class Geometry:
    """Where rank r sits on a full fabric (ranks fill pods, servers, GPUs in order)."""

    spec: FabricSpec
    servers_per_pod: int

    @property
    def gpus(self) -> int:
        return self.spec.pods * self.servers_per_pod * self.spec.gpus_per_server

    def coordinates(self, ranks: np.ndarray) -> tuple[np.ndarray, ...]:
        g = self.spec.gpus_per_server
        server = ranks // g  # global server index
        pod = server // self.servers_per_pod
        return pod, server, ranks % g, server % self.servers_per_pod

    def classify(
        self, src: np.ndarray, dst: np.ndarray
    ) -> tuple[dict[tuple[str, bool], np.ndarray], np.ndarray]:
        """Per (pair class, crosses NVLink first: rail-only's cross-rail forward), the mask
        of the (src, dst) pairs in it; and per pair the GPU whose NIC it leaves by."""
        spec = self.spec
        kind = spec.kind
        D = spec.switch.down_ports
        g = spec.gpus_per_server
        p1, s1, l1, i1 = self.coordinates(src)
        p2, s2, l2, i2 = self.coordinates(dst)
        same_server = s1 == s2
        forward = np.zeros_like(same_server)
        wire = src
        if kind == "fat-tree":
            one = (p1 == p2) & ((i1 * g + l1) // D == (i2 * g + l2) // D)  # same edge switch
            three = (p1 == p2) & ~one
        elif kind in ("astral", "rail-optimized", "rail-only"):
            same_rail = l1 == l2
            if kind == "rail-only":  # over NVLink to the server-mate on dst's rail first
                forward = ~same_server & ~same_rail
                wire = np.where(forward, s1 * g + l2, src)
                same_rail = np.ones_like(same_rail)
            one = same_rail & (p1 == p2) & (i1 // D == i2 // D)  # a ToR group: D servers
            three = same_rail & (p1 == p2) & ~one if kind == "astral" else ~one
        else:
            raise Unsupported(
                f"fabric kind {kind!r}: the aggregated model knows {', '.join(KINDS)}"
            )
        masks = {
            NVLINK: same_server,
            ONE: ~same_server & one,
            THREE: ~same_server & ~one & three,
            FIVE: ~same_server & ~one & ~three,
        }
        classes = {}
        for name, mask in masks.items():
            for fwd in (False, True):
                chosen = mask & (forward if fwd else ~forward)
                if chosen.any():
                    classes[(name, fwd)] = chosen
        return classes, wire

    def unit(self, ranks: np.ndarray, tier: LinkKind) -> np.ndarray:
        """Which group of ``tier``'s links a GPU's traffic enters that tier by: the GPU
        itself (NIC, NVLink), its ToR group (ToR-agg), its aggregation block (agg-core:
        a rail plane of a pod on astral, a pod on a fat-tree)."""
        spec = self.spec
        pod, _, rail, index = self.coordinates(ranks)
        if tier in (LinkKind.NIC, LinkKind.NVLINK):
            return ranks
        g, D = spec.gpus_per_server, spec.switch.down_ports
        rails = spec.gpus_per_server
        if spec.kind == "fat-tree":
            edge = (index * g + rail) // D
            edges = -(-self.servers_per_pod * g // D)
            return pod * edges + edge if tier is LinkKind.TOR_AGG else pod
        groups = -(-self.servers_per_pod // D)
        if tier is LinkKind.TOR_AGG:
            return (pod * rails + rail) * groups + index // D
        return pod * rails + rail


@dataclass(frozen=True)
class Step:
    """``repeat`` steps, each with ``transfers`` pairs per class moving ``nbytes`` each over
    ``channels`` connections; ``units[(tier, way)]``: how many groups of that tier's links
    the step's traffic can use (the links of the sending GPUs' ToR groups, say), which the
    flows crossing it share evenly."""

    repeat: int
    transfers: dict[tuple[str, bool], int]
    nbytes: float
    channels: int
    units: dict[tuple[LinkKind, str], int]


@dataclass(frozen=True)
class ScalePrediction:
    """A full-size forecast at real speed; time in us (mean over salts) and its band."""

    kind: str
    gpus: int
    collective: str
    algorithm: str
    policy: str
    size: int
    time_us: float
    p10_us: float
    p90_us: float
    steps: int
    seconds: float  # how long the forecast took

    @property
    def busbw(self) -> float:
        return algbw_gbps(self.size, self.time_us) * bus_factor(self.collective, self.gpus)


class ScaleModel:
    """The aggregated model of one full-size fabric (a FabricSpec the planner dimensions)."""

    def __init__(self, spec: FabricSpec) -> None:
        if spec.kind not in KINDS:
            raise Unsupported(
                f"fabric kind {spec.kind!r}: the aggregated model knows {', '.join(KINDS)}"
            )
        dimensions = plan(spec)
        self.spec = spec
        self.geometry = Geometry(spec, dimensions.servers_per_pod)
        speeds, over = spec.speeds, spec.oversubscription
        per_link_bps = {
            LinkKind.NIC: speeds.nic,
            LinkKind.TOR_AGG: speeds.tor_agg / over.tor,
            LinkKind.AGG_CORE: speeds.agg_core / over.agg,
            LinkKind.NVLINK: speeds.nvlink,
        }
        self.links = {k: v for k, v in dimensions.links.items() if v}
        self.capacity = {
            (kind, way): per_link_bps[kind] / 8 * TCP_PAYLOAD_SHARE
            for kind in self.links
            for way in ("up", "down")
        }
        latency = spec.latency
        self.one_way = {
            name: (
                0.0
                if not latency.enabled
                else (
                    latency.nvlink
                    if name == NVLINK
                    else latency.library
                    + NICS_PER_MESSAGE * latency.nic
                    + SWITCHES[name] * latency.switch_hop
                )
            )
            for name in CROSSES
        }
        self.forward_latency = latency.nvlink if latency.enabled else 0.0
        every = np.arange(self.geometry.gpus, dtype=np.int64)
        self._units_total = {
            kind: int(np.unique(self.geometry.unit(every, kind)).size) for kind in self.links
        }
        self._seen: dict[tuple[LinkKind, str], set[int]] = {}
        self.operation_latency = latency.operation if latency.enabled else 0.0

    @property
    def gpus(self) -> int:
        return self.geometry.gpus

    def channels(self, fabric_peers: int) -> int:
        ports = self.spec.nic_ports
        return ports // math.gcd(fabric_peers, ports) if fabric_peers else 1

    def steps(self, collective: str, algorithm: str, size: int) -> list[Step]:
        """The schedule by symmetry, each step's pairs by class (see :class:`Step`)."""
        n = self.gpus
        g = self.spec.gpus_per_server
        count = element_count(collective, size, n)
        ranks = np.arange(n, dtype=np.int64)
        key = (collective, algorithm)
        if key in (("all-reduce", "ring"), ("reduce-scatter", "ring"), ("all-gather", "ring")):
            chunk = count * ELEMENT_BYTES / n
            phases = 2 if collective == "all-reduce" else 1
            step = self._step(n - 1, ranks, (ranks + 1) % n, chunk, 1 if n > g else 0)
            return [step] * phases
        if key == ("all-reduce", "hierarchical"):
            servers = n // g
            out = []
            if g > 1:
                intra = self._step(
                    g - 1, ranks, (ranks // g) * g + (ranks % g + 1) % g, count * 4 / g, 0
                )
            if g > 1:
                out.append(intra)
            if servers > 1:
                rail = self._step(servers - 1, ranks, (ranks + g) % n, count * 4 / n, 1)
                out += [rail, rail]
            if g > 1:
                out.append(intra)
            return out
        if key == ("all-to-all", "direct"):
            # every source sees the same peers (the fabric is symmetric): rank 0's, x n
            zero = np.zeros(n - 1, dtype=np.int64)
            block = count // n * ELEMENT_BYTES
            step = self._step(1, zero, np.arange(1, n, dtype=np.int64), float(block), n - g)
            return [
                Step(
                    1,
                    {c: k * n for c, k in step.transfers.items()},
                    step.nbytes,
                    step.channels,
                    self._all_units(step.transfers),
                )
            ]
        raise Unsupported(
            f"{collective}/{algorithm}: the aggregated model knows "
            + ", ".join(f"{c}/{a}" for c, a in ALGORITHMS)
        )

    def _step(
        self, repeat: int, src: np.ndarray, dst: np.ndarray, nbytes: float, fabric_peers: int
    ) -> Step:
        classes, wire = self.geometry.classify(src, dst)
        transfers = {c: int(np.count_nonzero(mask)) for c, mask in classes.items()}
        units: dict[tuple[LinkKind, str], int] = {}
        for (name, forward), mask in classes.items():
            crossed = [*CROSSES[name], *([LinkKind.NVLINK] if forward else [])]
            for kind in crossed:
                if kind is LinkKind.NVLINK and name != NVLINK:
                    ends = {"up": src[mask], "down": wire[mask]}
                else:
                    ends = {"up": (wire if name != NVLINK else src)[mask], "down": dst[mask]}
                for way, ranks in ends.items():
                    key = (kind, way)
                    found = set(np.unique(self.geometry.unit(ranks, kind)).tolist())
                    units[key] = len(found | self._seen.get(key, set()))
                    self._seen[key] = found | self._seen.get(key, set())
        self._seen = {}
        return Step(repeat, transfers, nbytes, self.channels(fabric_peers), units)

    def _all_units(self, transfers: dict[tuple[str, bool], int]) -> dict[tuple[LinkKind, str], int]:
        """Every unit of every tier a class crosses (all ranks send: all-to-all)."""
        ranks = np.arange(self.gpus, dtype=np.int64)
        out = {}
        for name, forward in transfers:
            for kind in [*CROSSES[name], *([LinkKind.NVLINK] if forward else [])]:
                total = int(np.unique(self.geometry.unit(ranks, kind)).size)
                out[(kind, "up")] = out[(kind, "down")] = total
        return out

    def links_used(self, step: Step, key: tuple[LinkKind, str]) -> int:
        """Links of a (tier, way) the step's traffic spreads over: its units' links."""
        kind = key[0]
        units_total = self._units_total[kind]
        return max(1, round(self.links[kind] * step.units.get(key, units_total) / units_total))

    def hot_factor(self, flows: float, units: int, links: int, rng: np.random.Generator) -> float:
        """The most loaded link over the mean when each of ``units`` groups hashes its
        share of ``flows`` into its own ``links / units`` links at random (a ToR's flows
        can only take that ToR's uplinks): 1 for a hash-free spread."""
        per_unit = max(1, round(links / max(units, 1)))
        units = max(1, min(units, links))
        share = flows / units
        if per_unit <= 1 or share <= 0:
            return 1.0
        sampled = min(units, 4096)  # the maximum over this many groups (the rest alike)
        loads = rng.multinomial(
            max(1, round(share)), np.full(per_unit, 1.0 / per_unit), size=sampled
        )
        return max(1.0, float(loads.max()) / (share / per_unit))

    def step_time(self, step: Step, rng: np.random.Generator | None) -> float:
        """The step's completion time; ``rng``: draw ECMP's hot links (None: even spread)."""
        per_flow = step.nbytes / step.channels
        crossing: dict[tuple[LinkKind, str], float] = {}
        for (name, forward), transfers in step.transfers.items():
            for kind in [*CROSSES[name], *([LinkKind.NVLINK] if forward else [])]:
                for way in ("up", "down"):
                    key = (kind, way)
                    crossing[key] = crossing.get(key, 0.0) + transfers * step.channels
        # flows per loaded link of each (tier, way): the mean where path pinning spreads
        # them evenly, at least 1 (a flow never splits over links), and the most loaded
        # link's share where a hash throws them at random
        load = {}
        for key, total in crossing.items():
            links = self.links_used(step, key)
            hashed = rng is not None and key[0] not in (LinkKind.NIC, LinkKind.NVLINK)
            mean = total / links
            if hashed and rng is not None:
                units = step.units.get(key, self._units_total[key[0]])
                load[key] = max(1.0, mean * self.hot_factor(total, units, links, rng))
            else:
                load[key] = max(1.0, mean)
        flows = []
        for (name, forward), transfers in step.transfers.items():
            count = transfers * step.channels
            per_link: dict[tuple[LinkKind, str], float] = {}
            for kind in [*CROSSES[name], *([LinkKind.NVLINK] if forward else [])]:
                for way in ("up", "down"):
                    key = (kind, way)
                    share = count / crossing[key] * load[key]
                    per_link[key] = per_link.get(key, 0.0) + share
            flows.append(FlowClass(count, per_flow, per_link))
        return completion_time(flows, self.capacity)

    def wait(self, step: Step) -> float:
        return max(
            (
                self.one_way[name] + (self.forward_latency if fwd else 0.0)
                for name, fwd in step.transfers
            ),
            default=0.0,
        )

    def group_steps(
        self, collective: str, algorithm: str, group: np.ndarray, size: int, channels: int
    ) -> list[Step]:
        """The schedule of one group's collective (``group``: its members' GPU indices, in
        its rank order), each transfer over ``channels`` connections: a training
        iteration's ops run on groups (a server, a rail's replicas, a pipeline pair), not
        on the whole fabric. Every pair is classified, so a group need not be symmetric;
        its links are those of its own members' ToR groups and aggregation blocks."""
        k = int(group.size)
        key = (collective, algorithm)
        if k < 2:
            return []
        count = element_count(collective, size, k)
        if key in (("all-reduce", "ring"), ("reduce-scatter", "ring"), ("all-gather", "ring")):
            phases = 2 if collective == "all-reduce" else 1
            ring = self._step(k - 1, group, np.roll(group, -1), count * ELEMENT_BYTES / k, 0)
            return [replace(ring, channels=channels)] * phases
        if key == ("all-to-all", "direct"):
            block = count // k * ELEMENT_BYTES
            src, dst = np.repeat(group, k), np.tile(group, k)
            other = src != dst
            step = self._step(1, src[other], dst[other], float(block), 0)
            return [replace(step, channels=channels)] if block else []
        if key == ("p2p", "direct"):  # rank 0 sends the whole buffer to rank 1
            step = self._step(1, group[:1], group[1:2], float(count * ELEMENT_BYTES), 0)
            return [replace(step, channels=channels)]
        raise Unsupported(
            f"{collective}/{algorithm} on a group: the aggregated model knows "
            "all-reduce/ring, all-gather/ring, reduce-scatter/ring, all-to-all/direct, "
            "p2p/direct"
        )

    def group_seconds(
        self,
        policy: str,
        collective: str,
        algorithm: str,
        group: np.ndarray,
        size: int,
        channels: int,
        salts: int = 8,
    ) -> float:
        """One group's collective alone, at real speed, without the per-operation latency
        (a program pays that once): the mean over ``salts`` hash draws for ECMP."""
        steps = self.group_steps(collective, algorithm, group, size, channels)
        hashed = policy.split(":")[0] in ("ecmp", "ecmp-polarized")
        draws = []
        for salt in range(salts if hashed else 1):
            rng = np.random.default_rng(salt) if hashed else None
            draws.append(
                sum(step.repeat * (self.wait(step) + self.step_time(step, rng)) for step in steps)
            )
        return float(np.mean(draws))

    def forecast(
        self, policy: str, collective: str, algorithm: str, size: int, salts: int = 8
    ) -> ScalePrediction:
        import time as clock

        began = clock.monotonic()
        steps = self.steps(collective, algorithm, size)
        hashed = policy.split(":")[0] in ("ecmp", "ecmp-polarized")
        draws = []
        for salt in range(salts if hashed else 1):
            rng = np.random.default_rng(salt) if hashed else None
            total = self.operation_latency
            for step in steps:
                total += step.repeat * (self.wait(step) + self.step_time(step, rng))
            draws.append(total)
        ordered = sorted(draws)
        return ScalePrediction(
            kind=self.spec.kind,
            gpus=self.gpus,
            collective=collective,
            algorithm=algorithm,
            policy=policy,
            size=size,
            time_us=float(np.mean(draws)) * 1e6,
            p10_us=float(np.percentile(ordered, 10)) * 1e6,
            p90_us=float(np.percentile(ordered, 90)) * 1e6,
            steps=sum(step.repeat for step in steps),
            seconds=clock.monotonic() - began,
        )


def scale_table(predictions: Sequence[ScalePrediction]) -> list[str]:
    lines = [
        f"#{'kind':>15} {'GPUs':>9} {'collective':>26} {'policy':>12} {'size':>10}"
        f" {'time (us)':>14} {'busbw real GB/s':>16} {'p10-p90 busbw':>16} {'took':>7}"
    ]
    for p in predictions:
        low = algbw_gbps(p.size, p.p90_us) * bus_factor(p.collective, p.gpus)
        high = algbw_gbps(p.size, p.p10_us) * bus_factor(p.collective, p.gpus)
        band = f"{low:.2f}-{high:.2f}" if p.p10_us != p.p90_us else "-"
        lines.append(
            f" {p.kind:>15} {p.gpus:>9,} {p.collective + ' (' + p.algorithm + ')':>26}"
            f" {p.policy:>12} {p.size:>10} {p.time_us:>14.1f} {p.busbw:>16.2f} {band:>16}"
            f" {p.seconds:>6.1f}s"
        )
    return lines
