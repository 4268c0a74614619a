"""What a generated fabric offers: counts, capacities per tier, bisection, paths per GPU pair.

Pure functions of a :class:`~topologies.model.Fabric` (no root, no Mininet): one
breadth-first search per sampled GPU, and one max-flow per candidate cut on the fabric's
quotient by its symmetry (a few nodes, whatever the fabric's size; see below).

Definitions (the report and the tests rely on them):

**Network paths.** Paths run over switches only: a GPU is an endpoint, never a transit
node, and NVLink links and switches are not part of the network. The one exception is a
fabric with ``gpu_forwarding`` (rail-only): there a GPU forwards between its NVLink port and
its NIC ports (never NIC to NIC), so cross-rail paths cross an NVLink switch and a GPU.
Parallel links count separately (ECMP hashes over them too).

**Hops** of a path are the switches it crosses (NVLink switches included where they are on
the path); ``gpu_transits`` counts forwarding GPUs. **ECMP paths** are the distinct
shortest paths, link by link, shortest meaning fewest links.

**GPU-pair classes**, each with one representative pair (source: the GPU of rank 0,
destination: the first GPU in rank order in the class), or absent when no GPU is in it:

- ``same-tor``: same rail, sharing a ToR (with dual-ToR: the same pair);
- ``same-rail``: same rail, same pod, no ToR in common;
- ``same-rail-other-pod``: same rail, other pod;
- ``cross-rail``: other rail, other server, same pod;
- ``cross-rail-other-pod``: other rail, other pod.

A fat-tree has no rails: there "rail" is just the GPU's index in its server.

**Maximum hops**: the largest hop count from the GPUs of rank 0 and n-1 to every other
GPU (the diameter on the symmetric fabrics the generators build).

**Bisection bandwidth**: the least capacity, in bit/s one way, that can cross from one half
of the GPUs to the other, minimised over three balanced cuts aligned with the fabric's
hierarchy (half is floor(n/2) GPUs; the worst cuts of a tree-like fabric are aligned with
it):

- ``pods``: the first half of the GPUs in rank order (pod by pod, then server by server),
  i.e. half of the pods when their number is even;
- ``servers``: the first half of the servers of every pod (in the order (server, pod));
- ``rails``: the GPUs of the first half of the rails (in the order (rail, pod, server)).

Each is a true max-flow (= min-cut) from all GPUs of one side to all GPUs of the other with
unlimited GPU injection, so it is exact for that partition; the minimum over the three is an
upper bound of the textbook bisection (the minimum over *all* balanced partitions, which
is NP-hard in general). Identical partitions are reported once. In a rail-only fabric the
``rails`` cut is crossed over NVLink inside the servers, so it is never the worst one.
``per_gpu`` divides the bisection by the GPUs of the smaller half: it equals a GPU's NIC
bandwidth (``nic_ports x speeds.nic``) on a non-blocking fabric.

**Computing a cut on the quotient.** A cut's flow network is the fabric with its GPUs
contracted into a source S (one side) and a sink T (the other). Call a partition of its
switches *equitable* when every switch of a class has the same capacity into each class,
into S and into T: the ToRs of a rail plane whose GPUs fall alike, that plane's aggregation
switches, the cores of a group. Then some minimum cut keeps every class whole. Average a
minimum cut's 0/1 labels (x) over each class: between two classes the averages cost
``|sum c(u,v) (x_u - x_v)|``, at most the ``sum c(u,v) |x_u - x_v|`` the cut pays (equitable:
the class sums of labels factor out of the first), within a class nothing; and the cuts
``{x < t}`` of the averages, for t uniform in (0, 1), keep classes whole and cost on average
what the averages do, so one of them costs no more than the minimum. The max-flow on the
quotient (a node per class, capacities between classes summed) is therefore the fabric's.
Colour refinement finds the coarsest such partition in a few passes over the links, for
all the cuts at once (14 classes of the 26,624 switches of a 131,072-GPU Astral fabric).
Capacities are counted in a unit that makes every one a whole number (a float is a fraction
whose denominator is a power of two), so classes are told apart and the flow is solved
exactly: the figure is the exact min-cut, rounded to a float once.
tests/unit/test_bisection_scale.py holds it to a max-flow on the whole fabric.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import networkx as nx

from topologies.model import Fabric, Gpu, LinkKind, Tier

NETWORK_TIERS = (Tier.TOR, Tier.AGG, Tier.CORE)
# Links below and above each network tier.
_DOWN = {Tier.TOR: LinkKind.NIC, Tier.AGG: LinkKind.TOR_AGG, Tier.CORE: LinkKind.AGG_CORE}
_UP = {Tier.TOR: LinkKind.TOR_AGG, Tier.AGG: LinkKind.AGG_CORE}

PAIR_CLASSES = (
    "same-tor",
    "same-rail",
    "same-rail-other-pod",
    "cross-rail",
    "cross-rail-other-pod",
)
PAIR_CLASS_TEXT = {
    "same-tor": "same rail, same ToR",
    "same-rail": "same rail, other ToR, same pod",
    "same-rail-other-pod": "same rail, other pod",
    "cross-rail": "other rail, other server, same pod",
    "cross-rail-other-pod": "other rail, other pod",
}


@dataclass(frozen=True)
class TierCapacity:
    """Down and up capacity of one switch tier, summed over its switches (bit/s)."""

    tier: Tier
    switches: int
    down_links: int
    up_links: int
    down_capacity: float
    up_capacity: float
    worst_ratio: float | None  # the largest down:up ratio of a single switch

    @property
    def ratio(self) -> float | None:
        """Aggregate down:up capacity (the oversubscription), None for the top tier."""
        return self.down_capacity / self.up_capacity if self.up_capacity else None


@dataclass(frozen=True)
class Cut:
    name: str
    description: str
    side: int  # GPUs on the smaller side
    capacity: float  # bit/s, one way


@dataclass(frozen=True)
class Bisection:
    cuts: tuple[Cut, ...]
    gpu_bandwidth: float  # one GPU's NIC bandwidth, the per-GPU value of a full bisection

    @property
    def worst(self) -> Cut | None:
        return min(self.cuts, key=lambda cut: cut.capacity) if self.cuts else None

    @property
    def capacity(self) -> float:
        worst = self.worst
        return worst.capacity if worst else 0.0

    @property
    def per_gpu(self) -> float:
        worst = self.worst
        return worst.capacity / worst.side if worst else 0.0

    @property
    def ratio(self) -> float:
        """Per-GPU bisection over a GPU's NIC bandwidth (1.0 = full bisection)."""
        return self.per_gpu / self.gpu_bandwidth if self.gpu_bandwidth else 0.0


@dataclass(frozen=True)
class PairPath:
    """Shortest paths between a representative pair of one class (None = class absent)."""

    cls: str
    src: str | None = None
    dst: str | None = None
    hops: int = 0  # switches crossed, NVLink switches included
    nvlink_hops: int = 0  # of which NVLink switches
    gpu_transits: int = 0
    paths: int = 0
    example: tuple[str, ...] = ()

    @property
    def present(self) -> bool:
        return self.src is not None


@dataclass(frozen=True)
class FabricProperties:
    name: str
    kind: str
    source: str
    pods: int
    rails: int
    nic_ports: int
    gpus: int
    servers: int
    switches: dict[Tier, int]
    links: dict[LinkKind, int]
    link_capacity: dict[LinkKind, float]  # the largest capacity of each kind
    tiers: tuple[TierCapacity, ...]
    bisection: Bisection
    pairs: tuple[PairPath, ...]
    max_hops: int
    gpu_forwarding: bool

    @property
    def network_switches(self) -> int:
        return sum(n for tier, n in self.switches.items() if tier is not Tier.NVLINK)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (rates in bit/s)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "source": self.source,
            "pods": self.pods,
            "rails": self.rails,
            "nic_ports": self.nic_ports,
            "gpus": self.gpus,
            "servers": self.servers,
            "gpu_forwarding": self.gpu_forwarding,
            "switches": {tier.value: n for tier, n in self.switches.items()},
            "links": {kind.value: n for kind, n in self.links.items()},
            "link_capacity": {kind.value: c for kind, c in self.link_capacity.items()},
            "tiers": [
                {
                    "tier": t.tier.value,
                    "switches": t.switches,
                    "down_links": t.down_links,
                    "up_links": t.up_links,
                    "down_capacity": t.down_capacity,
                    "up_capacity": t.up_capacity,
                    "ratio": t.ratio,
                    "worst_ratio": t.worst_ratio,
                }
                for t in self.tiers
            ],
            "bisection": {
                "capacity": self.bisection.capacity,
                "per_gpu": self.bisection.per_gpu,
                "gpu_bandwidth": self.bisection.gpu_bandwidth,
                "ratio": self.bisection.ratio,
                "worst_cut": self.bisection.worst.name if self.bisection.worst else None,
                "cuts": [
                    {
                        "name": c.name,
                        "description": c.description,
                        "side": c.side,
                        "capacity": c.capacity,
                    }
                    for c in self.bisection.cuts
                ],
            },
            "pairs": [
                {
                    "class": p.cls,
                    "description": PAIR_CLASS_TEXT[p.cls],
                    "present": p.present,
                    "src": p.src,
                    "dst": p.dst,
                    "hops": p.hops,
                    "nvlink_hops": p.nvlink_hops,
                    "gpu_transits": p.gpu_transits,
                    "paths": p.paths,
                    "example": list(p.example),
                }
                for p in self.pairs
            ],
            "max_hops": self.max_hops,
        }


def fabric_properties(fabric: Fabric) -> FabricProperties:
    """Compute everything the module docstring defines for ``fabric``."""
    spec = fabric.spec
    switches = Counter(s.tier for s in fabric.switches.values())
    links = Counter(link.kind for link in fabric.links)
    capacity: dict[LinkKind, float] = {}
    for link in fabric.links:
        capacity[link.kind] = max(capacity.get(link.kind, 0.0), link.capacity)
    graph = _PathGraph(fabric)
    pairs = _pair_paths(fabric, graph)
    return FabricProperties(
        name=fabric.name,
        kind=fabric.kind,
        source=spec.source,
        pods=spec.pods,
        rails=spec.rails,
        nic_ports=spec.nic_ports,
        gpus=len(fabric.gpus),
        servers=len(fabric.servers),
        switches={tier: switches[tier] for tier in Tier if switches[tier]},
        links={kind: links[kind] for kind in LinkKind if links[kind]},
        link_capacity=capacity,
        tiers=tier_capacities(fabric),
        bisection=bisection(fabric),
        pairs=pairs,
        max_hops=_max_hops(fabric, graph),
        gpu_forwarding=fabric.gpu_forwarding,
    )


def tier_capacities(fabric: Fabric) -> tuple[TierCapacity, ...]:
    """Per network tier: switches, links and capacity below and above, and the ratio."""
    down: defaultdict[str, float] = defaultdict(float)
    up: defaultdict[str, float] = defaultdict(float)
    down_n: Counter[str] = Counter()
    up_n: Counter[str] = Counter()
    for link in fabric.links:
        for end in (link.a, link.b):
            switch = fabric.switches.get(end)
            if switch is None or switch.tier is Tier.NVLINK:
                continue
            if link.kind is _DOWN[switch.tier]:
                down[end] += link.capacity
                down_n[end] += 1
            elif link.kind is _UP.get(switch.tier):
                up[end] += link.capacity
                up_n[end] += 1
    result = []
    for tier in NETWORK_TIERS:
        members = [s.name for s in fabric.switches.values() if s.tier is tier]
        if not members:
            continue
        ratios = [down[m] / up[m] for m in members if up[m]]
        result.append(
            TierCapacity(
                tier=tier,
                switches=len(members),
                down_links=sum(down_n[m] for m in members),
                up_links=sum(up_n[m] for m in members),
                down_capacity=sum(down[m] for m in members),
                up_capacity=sum(up[m] for m in members),
                worst_ratio=max(ratios) if ratios else None,
            )
        )
    return tuple(result)


# --- paths -------------------------------------------------------------------------------


class _PathGraph:
    """Adjacency for network paths (see module docstring), parallel links kept apart."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.forwarding = fabric.gpu_forwarding
        self.adj: dict[str, list[tuple[str, LinkKind]]] = {}
        for link in fabric.links:
            if link.kind is LinkKind.NVLINK and not self.forwarding:
                continue
            self.adj.setdefault(link.a, []).append((link.b, link.kind))
            self.adj.setdefault(link.b, []).append((link.a, link.kind))

    def search(self, src: str) -> tuple[dict[str, int], dict[str, int], dict[str, list[str]]]:
        """BFS from GPU ``src``: distance (links), path count and one path per GPU reached.

        States are nodes, except that a transit GPU is a state per arrival link kind (it may
        only turn NVLink <-> NIC); GPUs other than ``src`` are otherwise never expanded.
        """
        gpus = self.fabric.gpus
        State = tuple[str, LinkKind | None]
        start: State = (src, None)
        dist: dict[State, int] = {start: 0}
        count: dict[State, int] = {start: 1}
        parent: dict[State, State | None] = {start: None}
        queue: deque[State] = deque([start])
        while queue:
            state = queue.popleft()
            node, arrived = state
            if node in gpus and node != src:
                # Only a forwarding GPU passes traffic on, and only across NVLink <-> NIC.
                if not self.forwarding or arrived is None:
                    continue
                allowed: Callable[[LinkKind], bool] = (
                    (lambda kind: kind is not LinkKind.NVLINK)
                    if arrived is LinkKind.NVLINK
                    else (lambda kind: kind is LinkKind.NVLINK)
                )
            elif node == src and arrived is not None:
                continue  # back at the source: never shortest
            else:
                allowed = _any_kind
            for neighbour, kind in self.adj.get(node, ()):
                if not allowed(kind):
                    continue
                nxt: State = (neighbour, kind if neighbour in gpus else None)
                if nxt not in dist:
                    dist[nxt] = dist[state] + 1
                    count[nxt] = count[state]
                    parent[nxt] = state
                    queue.append(nxt)
                elif dist[nxt] == dist[state] + 1:
                    count[nxt] += count[state]
        best: dict[str, int] = {}
        paths: dict[str, int] = {}
        example: dict[str, list[str]] = {}
        for (node, _), d in dist.items():
            if node not in gpus or node == src:
                continue
            if node not in best or d < best[node]:
                best[node], paths[node] = d, 0
        for state, d in dist.items():
            node = state[0]
            if node in best and d == best[node]:
                paths[node] += count[state]
                if node not in example:
                    walk: list[str] = []
                    cursor: State | None = state
                    while cursor is not None:
                        walk.append(cursor[0])
                        cursor = parent[cursor]
                    example[node] = walk[::-1]
        return best, paths, example


@dataclass(frozen=True)
class Route:
    """What a shortest network path between two GPUs crosses (see the module docstring)."""

    switches: int  # network switches: ToR, aggregation, core
    nvlink_hops: int = 0  # NVLink switches on it (cross-rail forwarding, rail-only)
    gpu_transits: int = 0  # GPUs forwarding on it


def routes_from(fabric: Fabric, src: str, graph: _PathGraph | None = None) -> dict[str, Route]:
    """The shortest network path from GPU ``src`` to every GPU it reaches, by what it crosses.

    Every policy routes on shortest paths (controllers/routing.py), and all of one pair's
    shortest paths cross the same number of switches, so one example path tells.
    """
    graph = graph if graph is not None else _PathGraph(fabric)
    _, _, example = graph.search(src)
    routes = {}
    for dst, walk in example.items():
        inner = walk[1:-1]
        nvlink = sum(1 for n in inner if n in fabric.switches and _is_nvlink(fabric, n))
        transits = sum(1 for n in inner if n in fabric.gpus)
        routes[dst] = Route(len(inner) - transits - nvlink, nvlink, transits)
    return routes


def all_routes(fabric: Fabric) -> dict[tuple[str, str], Route]:
    """:func:`routes_from` every GPU: (src, dst) -> Route, one search per GPU."""
    graph = _PathGraph(fabric)
    return {
        (src, dst): route
        for src in fabric.gpus
        for dst, route in routes_from(fabric, src, graph).items()
    }


def _any_kind(kind: LinkKind) -> bool:
    return True


def _pair_paths(fabric: Fabric, graph: _PathGraph) -> tuple[PairPath, ...]:
    ranked = fabric.gpus_by_rank()
    if not ranked:
        return tuple(PairPath(cls) for cls in PAIR_CLASSES)
    nic_peers: dict[str, set[str]] = {}
    for link in fabric.links:
        if link.kind is LinkKind.NIC:
            end, tor = (link.a, link.b) if link.a in fabric.gpus else (link.b, link.a)
            nic_peers.setdefault(end, set()).add(tor)
    src = ranked[0]
    src_tors = nic_peers.get(src.name, set())

    def classify(dst: Gpu) -> str | None:
        if dst.name == src.name:
            return None
        if dst.rail == src.rail:
            if nic_peers.get(dst.name, set()) & src_tors:
                return "same-tor"
            return "same-rail" if dst.pod == src.pod else "same-rail-other-pod"
        if dst.pod != src.pod:
            return "cross-rail-other-pod"
        return "cross-rail" if dst.server != src.server else None

    chosen: dict[str, Gpu] = {}
    for gpu in ranked:
        cls = classify(gpu)
        if cls is not None and cls not in chosen:
            chosen[cls] = gpu
    dist, paths, example = graph.search(src.name)
    result = []
    for cls in PAIR_CLASSES:
        dst = chosen.get(cls)
        if dst is None:
            result.append(PairPath(cls))
            continue
        if dst.name not in dist:
            result.append(PairPath(cls, src.name, dst.name, hops=-1, paths=0))
            continue
        walk = example[dst.name][1:-1]
        nvlink = sum(1 for n in walk if n in fabric.switches and _is_nvlink(fabric, n))
        transits = sum(1 for n in walk if n in fabric.gpus)
        result.append(
            PairPath(
                cls,
                src.name,
                dst.name,
                hops=len(walk) - transits,
                nvlink_hops=nvlink,
                gpu_transits=transits,
                paths=paths[dst.name],
                example=tuple(example[dst.name]),
            )
        )
    return tuple(result)


def _is_nvlink(fabric: Fabric, node: str) -> bool:
    return fabric.switches[node].tier is Tier.NVLINK


def _max_hops(fabric: Fabric, graph: _PathGraph) -> int:
    ranked = fabric.gpus_by_rank()
    if len(ranked) < 2:
        return 0
    most = 0
    for src in {ranked[0].name, ranked[-1].name}:
        dist, _, example = graph.search(src)
        for dst in dist:
            walk = example[dst][1:-1]
            most = max(most, sum(1 for n in walk if n not in fabric.gpus))
    return most


# --- bisection ---------------------------------------------------------------------------


def _cut_orders(fabric: Fabric) -> list[tuple[str, str, Callable[[Gpu], tuple[int, ...]]]]:
    """The candidate cuts that split something: pods, servers of a pod, rails."""
    index = {name: server.index for name, server in fabric.servers.items()}
    orders: list[tuple[str, str, Callable[[Gpu], tuple[int, ...]]]] = []
    if len({g.pod for g in fabric.gpus.values()}) > 1:
        orders.append(
            (
                "pods",
                "first half of the GPUs in rank order (half of the pods when even)",
                lambda g: (g.rank,),
            )
        )
    if len(set(index.values())) > 1:
        orders.append(
            (
                "servers",
                "first half of the servers of every pod",
                lambda g: (index[g.server], g.pod, g.local_rank),
            )
        )
    if len({g.rail for g in fabric.gpus.values()}) > 1:
        orders.append(
            (
                "rails",
                "GPUs of the first half of the rails",
                lambda g: (g.rail, g.pod, index[g.server]),
            )
        )
    return orders


def bisection(fabric: Fabric) -> Bisection:
    """Max-flow across each candidate balanced cut (module docstring)."""
    spec = fabric.spec
    gpu_bw = spec.nic_ports * spec.speeds.nic
    gpus = list(fabric.gpus.values())
    half = len(gpus) // 2
    if half == 0:
        return Bisection((), gpu_bw)
    named: list[tuple[str, str]] = []
    sides: list[frozenset[str]] = []
    seen: set[frozenset[str]] = set()
    for name, text, order in _cut_orders(fabric):
        side_a = frozenset(g.name for g in sorted(gpus, key=order)[:half])
        if side_a in seen:
            continue
        seen.add(side_a)
        named.append((name, text))
        sides.append(side_a)
    capacities = cut_capacities(fabric, sides)
    cuts = [
        Cut(name, text, half, capacity)
        for (name, text), capacity in zip(named, capacities, strict=True)
    ]
    return Bisection(tuple(cuts), gpu_bw)


def cut_capacities(fabric: Fabric, sides: Sequence[frozenset[str]]) -> list[float]:
    """Max flow from every GPU in each of ``sides`` to every other GPU, exactly.

    The flow network of every cut is the fabric with its GPUs contracted to a source S (the
    side's GPUs) and a sink T (the others); it is solved on its quotient by the coarsest
    equitable partition of the switches (module docstring), one partition for all the
    cuts: a switch's first colour is its capacity to S and to T in every cut.
    """
    if not sides:
        return []
    scale, units = _exact_units(fabric)
    net = _SwitchGraph(fabric, units)
    # Which sides each GPU is on, as a bit mask: a switch's GPU links are summed per mask.
    mask: defaultdict[str, int] = defaultdict(int)
    for k, side in enumerate(sides):
        for name in side:
            mask[name] |= 1 << k
    ends: list[tuple[tuple[int, int], ...]] = []  # per switch, per cut: (to S, to T)
    for attached in net.gpu_links:
        by_mask: defaultdict[int, int] = defaultdict(int)
        for gpu, weight in attached:
            by_mask[mask[gpu]] += weight
        total = sum(by_mask.values())
        into = [sum(w for m, w in by_mask.items() if m >> k & 1) for k in range(len(sides))]
        ends.append(tuple((s, total - s) for s in into))
    colour = _equitable_colours(net.adj, ends)
    capacities = []
    for k, side in enumerate(sides):
        across = sum(w for a, b, w in net.gpu_pairs if (a in side) != (b in side))
        value = _quotient_flow(net.adj, colour, [end[k] for end in ends]) + across
        capacities.append(float(Fraction(value, scale)))
    return capacities


def _quotient_flow(
    adj: Sequence[dict[int, int]], colour: Sequence[int], ends: Sequence[tuple[int, int]]
) -> int:
    """Max flow from S to T on the quotient of one cut's network by an equitable ``colour``
    of its switches (``ends``: each switch's capacity to S and to T)."""
    size = Counter(colour)
    representative: dict[int, int] = {}
    for node, c in enumerate(colour):
        representative.setdefault(c, node)
    source, sink = "\0source", "\0sink"
    capacity: defaultdict[tuple[object, object], int] = defaultdict(int)
    for c, node in representative.items():
        # Equitable: every member of class c has the representative's capacity into each
        # other class and into S and T, so the class's total is size[c] times it.
        for other, weight in adj[node].items():
            if colour[other] != c:
                capacity[(c, colour[other])] += size[c] * weight
        for end, weight in zip((source, sink), ends[node], strict=True):
            if weight:
                capacity[(end, c)] += size[c] * weight
                capacity[(c, end)] += size[c] * weight
    graph = nx.DiGraph()
    graph.add_nodes_from((source, sink))
    graph.add_weighted_edges_from(((a, b, c) for (a, b), c in capacity.items()), weight="capacity")
    return int(nx.maximum_flow_value(graph, source, sink, capacity="capacity"))


def _exact_units(fabric: Fabric) -> tuple[int, dict[float, int]]:
    """Every link capacity as a whole number of 1/``scale`` bit/s, exactly.

    A float is a fraction with a power-of-two denominator, so the common denominator of
    the few distinct capacities turns all of them into integers: the sums and the max-flow
    are then exact, and the quotient's figure is the fabric's to the last bit.
    """
    exact = {c: Fraction(c) for c in {link.capacity for link in fabric.links}}
    scale = math.lcm(1, *(f.denominator for f in exact.values()))
    return scale, {c: int(f * scale) for c, f in exact.items()}


class _SwitchGraph:
    """The flow network's links, GPUs apart: what every cut's network is made of.

    Switches are numbered in ``fabric.switches`` order. ``adj[i]`` maps a switch's
    neighbours to the summed capacity of the links between them (integer units,
    :func:`_exact_units`); ``gpu_links[i]`` lists the GPUs a switch links to with each link's
    capacity; ``gpu_pairs`` are links between two GPUs. Links are those of network paths
    (module docstring): NVLink only where GPUs forward.
    """

    def __init__(self, fabric: Fabric, units: dict[float, int]) -> None:
        gpus = fabric.gpus
        forwarding = fabric.gpu_forwarding
        index = {name: i for i, name in enumerate(fabric.switches)}
        self.adj: list[defaultdict[int, int]] = [defaultdict(int) for _ in index]
        self.gpu_links: list[list[tuple[str, int]]] = [[] for _ in index]
        self.gpu_pairs: list[tuple[str, str, int]] = []
        for link in fabric.links:
            if link.kind is LinkKind.NVLINK and not forwarding:
                continue
            weight = units[link.capacity]
            a, b = link.a, link.b
            if a in gpus:
                if b in gpus:
                    self.gpu_pairs.append((a, b, weight))
                else:
                    self.gpu_links[index[b]].append((a, weight))
            elif b in gpus:
                self.gpu_links[index[a]].append((b, weight))
            elif a != b:
                i, j = index[a], index[b]
                self.adj[i][j] += weight
                self.adj[j][i] += weight


def _equitable_colours(adj: Sequence[dict[int, int]], first: Sequence[Hashable]) -> list[int]:
    """Colour refinement: the coarsest partition, finer than ``first``'s, in which every
    node of a class has the same summed capacity into each class (an equitable partition).

    Each round splits a class by its members' capacities into the classes of the last
    round; a round that splits nothing ends it (at most one round per class).
    """
    keys: dict[Hashable, int] = {}
    colour = [keys.setdefault(key, len(keys)) for key in first]
    classes = len(keys)
    while True:
        keys = {}
        refined = []
        for node, neighbours in enumerate(adj):
            into: defaultdict[int, int] = defaultdict(int)
            for other, weight in neighbours.items():
                into[colour[other]] += weight
            key = (colour[node], tuple(sorted(into.items())))
            refined.append(keys.setdefault(key, len(keys)))
        colour = refined
        if len(keys) == classes:
            return colour
        classes = len(keys)
