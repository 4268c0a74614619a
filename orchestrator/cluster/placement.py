"""Which machine runs which GPU and switch when one emulated fabric spans several machines.

One machine's Open vSwitch forwards only so many hop-bit/s (docs/capacity.md), so a fabric
too large for one machine is spread over several: each runs its share with its own Open
vSwitch, and a link whose two ends land on different machines becomes a tunnel between them
(docs/environment.md, "Between machines"). This module decides the spread. It is arithmetic
on the fabric model only (no machine, no root), so the cluster emulation, the run record
and the tests use it anywhere; :func:`place` is the entry point.

The rule, in our issue's words: "a placement that cuts few links (by pod, then by rail
plane, balancing emulated GPUs and switch-hop load per machine)".

The server is never split
-------------------------
A server's GPUs and its NVLink switch always stay on one machine: the NVLink switch is a
Linux bridge inside one kernel, so an NVLink link cannot become a tunnel. That settles what
"by rail plane" can mean. In rail-optimized and Astral fabrics a rail plane (its ToRs and,
in Astral, its aggregation switches) serves one GPU of every server, so a cut between
planes through the servers would cut exactly the NVLink links. A pod that must be split is
therefore split by *servers*, in index order (the servers of one ToR group, which a
dual-ToR pair serves on every rail, stay together), and its rail planes then go whole to
the machines holding its servers, or follow the servers they serve (below).

Hop load (bit/s, the calibration's hop-bit/s unit)
---------------------------------------------------
The *hop load* of a switch is the sum of the emulated rates of its links
(``description.emulated_rate``): at full load every link brings its rate into the switch,
and every bit entering one port leaves by another, so that is the most the switch forwards,
each bit counted once per switch it crosses, as orchestrator.calibration.capacity counts an
emulator's capacity. NVLink switches count zero, as in the calibration: they are Linux
bridges, forwarded by the kernel, not by ovs-vswitchd (so are GPUs that forward for their
server-mates in rail-only fabrics: kernel IP forwarding, zero too). A cut link costs *both*
machines its emulated rate: each end's datapath encapsulates what it sends into the tunnel
and decapsulates what it receives, one more pass of the link's rate. A machine's hop load
is its switches' hop loads plus the rates of its cut links (``MachineShare.tunnel_bps``).
It should be within ``LOAD_TOLERANCE`` (25 %) of its fair share, its weight's share of the
machines' total, where that is possible.

The method (:func:`place`)
--------------------------
1. **Atoms.** The nodes that must stay together: every server (GPUs, NVLink switch, and
   anything else NVLink links join to them) is one atom, every other switch one atom. Atoms
   are joined by the fabric's other links, weighted by their emulated rates (parallel links
   summed). The cut's weight is the tunnels' load; with uniform speeds it is proportional
   to the number of cut links.
2. **GPU balance.** Machine ``m`` of weight ``w`` (its relative capacity, default 1) gets
   ``servers x w / sum(w)`` servers, rounded by largest remainder, so its GPU count is
   within one server's GPUs of its fair share (a fabric's servers all have the same GPUs).
   Later moves keep each count between the floor and the ceiling of that quota.
3. **By pod.** Whole pods go to the machine with the most room left that holds them,
   largest pod first: with as many pods as machines, or a multiple, every pod is whole.
   A pod placed whole stays whole with the switches only it uses; nothing below moves
   them. That holds even where cutting the tier above the ToRs would cut fewer links
   (astral-64 over two machines: 64 ToR uplinks instead of 128 aggregation-core links),
   because links are not equally busy: collectives keep most traffic inside a pod, which
   then never crosses a tunnel, while a split upper tier would send a share of every
   ToR-to-ToR path through a tunnel and back. The pods that fit nowhere whole are split by
   server in index order: a pod's remainder to the tightest machine that holds it, else
   its largest piece to the roomiest machine, so few pods are split and into few pieces.
4. **Seeds for the rest** (the switches of split pods, the switches all pods share), up
   to three, each refined (5) and the best kept:

   - *follow*: bottom up (ToRs, aggregation, core, by datapath id), each switch to the
     machine where most of its links' rate to placed atoms lands, among the machines its
     hop load fits (ties to the least loaded for its weight): a core or a rail-optimized
     spine goes where most of its links' load lands;
   - *by rail plane*, when a pod is split: its rail planes (the switches of one pod and
     rail) dealt whole to the machines holding its servers, in proportion to their servers
     there; then *follow*;
   - *by column*: the ToRs follow their servers, and every column (a connected group of the
     free switches above the ToRs: the aggregation switches of one index with their core
     group in Astral and the fat-tree, one spine in the two-tier kinds) goes whole to the
     least loaded machine, heaviest first. Every ToR reaches every column alike, so this
     cuts ToR uplinks instead of the links above (the better cut in a split Astral pod).
5. **Refinement**, on the atom graph with the whole pods fixed: first bring the hop loads
   within the tolerance where a switch move can (the move that costs the least cut and
   lowers the worst deviation, then the spread of deviations, until none does); then
   Fiduccia-Mattheyses passes (the unlocked atom with the best gain moves even at a loss,
   locked, and so on; the best prefix is kept, so it climbs out of what single moves
   cannot leave, e.g. a core group and its aggregation switches changing machine
   together), single switch and server moves and server swaps, each kept only if it
   lowers the cut's rate without taking any machine's hop load beyond the tolerance (or
   beyond the worst deviation so far, if larger) or keeps the cut and evens the loads out;
   then the hop loads once more. Every refinement step lowers (cut, spread) and every
   balancing step (worst deviation, spread), and the passes are bounded, so it ends.
6. **The best seed**: within the load tolerance first, then the smallest cut's rate, then
   the earlier seed.

Everything iterates in the fabric's own orders and ties break by machine order, so the same
fabric, machines and weights always give the same placement; a 512-GPU fabric is placed in
about 0.1 s.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from topologies.description import FabricDescription
from topologies.model import Fabric, Link, LinkKind, Tier
from topologies.units import format_rate

#: A machine's hop load may be off its fair share (its weight's share of all machines' hop
#: load) by this fraction, either way, before the placement trades cut links for balance.
LOAD_TOLERANCE = 0.25
#: Refinement passes at most (each pass that changes nothing ends it sooner).
MAX_PASSES = 64
#: Moves a Fiduccia-Mattheyses pass makes past its best prefix before it gives up.
FM_PATIENCE = 64
#: Server pairs tried per machine pair and step of the swap search.
SWAP_CANDIDATES = 8
_EPS = 1e-9


@dataclass(frozen=True)
class MachineShare:
    """What one machine holds: its GPUs in rank order, its switches (NVLink switches too)
    in datapath-id order, and its hop load in bit/s (module docstring), of which
    ``tunnel_bps`` is its cut links' part."""

    machine: str
    gpus: tuple[str, ...]
    switches: tuple[str, ...]
    hop_load_bps: float
    tunnel_bps: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "gpus": list(self.gpus),
            "switches": list(self.switches),
            "hop_load_bps": self.hop_load_bps,
            "tunnel_bps": self.tunnel_bps,
        }


@dataclass(frozen=True)
class Placement:
    """Where every GPU and switch of ``description``'s fabric runs. Build it with
    :func:`place`; ``where`` is read-only."""

    machines: tuple[str, ...]
    where: Mapping[str, str]  # node name -> machine, for every GPU and switch
    description: FabricDescription = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        nodes = set(self.description.fabric.nodes())
        missing = sorted(nodes - set(self.where))
        if missing:
            raise ValueError(f"placement leaves {len(missing)} node(s) out: {missing[:5]}")
        extra = sorted(set(self.where) - nodes)
        if extra:
            raise ValueError(f"placement names node(s) the fabric lacks: {extra[:5]}")
        unknown = sorted(set(self.where.values()) - set(self.machines))
        if unknown:
            raise ValueError(f"placement uses machine(s) not listed: {unknown}")
        object.__setattr__(self, "where", MappingProxyType(dict(self.where)))

    @property
    def fabric(self) -> Fabric:
        return self.description.fabric

    def machine_of(self, node: str) -> str:
        try:
            return self.where[node]
        except KeyError:
            raise KeyError(f"{node!r} is no GPU or switch of fabric {self.fabric.name}") from None

    def share(self, machine: str) -> MachineShare:
        self._check_machine(machine)
        return self._shares()[self.machines.index(machine)]

    def shares(self) -> list[MachineShare]:
        """Every machine's share, in the order the machines were given."""
        return self._shares()

    def cut_links(self) -> list[Link]:
        """The links whose two ends are on different machines (the tunnels), in fabric order."""
        where = self.where
        return [link for link in self.fabric.links if where[link.a] != where[link.b]]

    def cut_between(self, a: str, b: str) -> list[Link]:
        """The cut links between machines ``a`` and ``b`` (either way round), fabric order."""
        self._check_machine(a)
        self._check_machine(b)
        if a == b:
            return []
        pair = {a, b}
        return [
            link for link in self.cut_links() if {self.where[link.a], self.where[link.b]} == pair
        ]

    def cut_rate(self) -> float:
        """The cut links' emulated rates summed (bit/s per direction)."""
        return sum(self.description.emulated_rate(link) for link in self.cut_links())

    def lines(self) -> list[str]:
        """A human report: per machine its servers, GPUs, switches and hop load; the cut
        links with their emulated rates, and their count."""
        fabric = self.fabric
        cut = self.cut_links()
        out = [
            f"fabric {fabric.name} over {len(self.machines)} machine(s): "
            f"{len(cut)} cut link(s) (tunnels), {_bps(self.cut_rate())} emulated"
        ]
        width = max(len(m) for m in self.machines)
        for share in self.shares():
            servers = sorted(
                {fabric.gpus[g].server for g in share.gpus},
                key=lambda s: (fabric.servers[s].pod, fabric.servers[s].index),
            )
            nvlink = sum(1 for s in share.switches if fabric.switches[s].tier is Tier.NVLINK)
            out.append(
                f"  {share.machine:<{width}}  {len(share.gpus)} GPUs on {len(servers)} "
                f"server(s), {len(share.switches)} switches ({nvlink} NVLink), hop load "
                f"{_bps(share.hop_load_bps)} (tunnels {_bps(share.tunnel_bps)})"
            )
            out.append(f"  {'':<{width}}  servers  {' '.join(servers) or '-'}")
            network = [s for s in share.switches if fabric.switches[s].tier is not Tier.NVLINK]
            out.append(f"  {'':<{width}}  switches {' '.join(network) or '-'}")
        if cut:
            out.append(f"  cut links ({len(cut)}):")
            for link in cut:
                out.append(
                    f"    {link.a}-{link.b}  {_bps(self.description.emulated_rate(link))}  "
                    f"({self.where[link.a]} - {self.where[link.b]})"
                )
        else:
            out.append("  cut links: none")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, for a run record."""
        cut = self.cut_links()
        return {
            "machines": list(self.machines),
            "where": dict(self.where),
            "shares": [share.to_dict() for share in self.shares()],
            "cut_links": [
                {
                    "a": link.a,
                    "a_port": link.a_port,
                    "b": link.b,
                    "b_port": link.b_port,
                    "kind": link.kind.value,
                    "emulated": self.description.emulated_rate(link),
                    "machines": [self.where[link.a], self.where[link.b]],
                }
                for link in cut
            ],
            "cut_count": len(cut),
            "cut_bps": self.cut_rate(),
        }

    def _check_machine(self, machine: str) -> None:
        if machine not in self.machines:
            raise KeyError(
                f"{machine!r} is not one of the placement's machines ({', '.join(self.machines)})"
            )

    def _shares(self) -> list[MachineShare]:
        fabric, where = self.fabric, self.where
        loads = hop_loads(self.description)
        tunnels = dict.fromkeys(self.machines, 0.0)
        for link in self.cut_links():
            rate = self.description.emulated_rate(link)
            tunnels[where[link.a]] += rate
            tunnels[where[link.b]] += rate
        gpus = fabric.gpus_by_rank()
        switches = sorted(fabric.switches.values(), key=lambda s: s.dpid)
        shares = []
        for machine in self.machines:
            mine = tuple(s.name for s in switches if where[s.name] == machine)
            shares.append(
                MachineShare(
                    machine=machine,
                    gpus=tuple(g.name for g in gpus if where[g.name] == machine),
                    switches=mine,
                    hop_load_bps=sum(loads[s] for s in mine) + tunnels[machine],
                    tunnel_bps=tunnels[machine],
                )
            )
        return shares


def _bps(rate: float) -> str:
    return f"{format_rate(rate)}bit/s"


def hop_loads(description: FabricDescription) -> dict[str, float]:
    """Every switch's hop load in bit/s: the emulated rates of its links summed, 0 for NVLink
    switches (module docstring, "Hop load")."""
    fabric = description.fabric
    loads = dict.fromkeys(fabric.switches, 0.0)
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        rate = description.emulated_rate(link)
        for end in (link.a, link.b):
            if end in loads and fabric.switches[end].tier is not Tier.NVLINK:
                loads[end] += rate
    return loads


# --- checking the request --------------------------------------------------------------


def _check_machines(machines: Sequence[str]) -> tuple[str, ...]:
    if isinstance(machines, str):
        raise ValueError(f"machines must be a list of names, not the string {machines!r}")
    names = tuple(machines)
    if not names:
        raise ValueError("no machines to place the fabric on: name at least one")
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a machine name must be a non-empty string, not {name!r}")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"machine {name!r} is listed more than once")
        seen.add(name)
    return names


def _check_weights(names: tuple[str, ...], weights: Mapping[str, float] | None) -> list[float]:
    """Each machine's share of the work (summing to 1), from its relative capacity."""
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(names))
    if unknown:
        raise ValueError(
            f"weights name machine(s) not listed: {', '.join(map(repr, unknown))} "
            f"(the machines are {', '.join(names)})"
        )
    for name, weight in weights.items():
        ok = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not ok or not math.isfinite(weight) or weight <= 0:
            raise ValueError(
                f"the weight of machine {name!r} must be a positive number, not {weight!r}"
            )
    values = [float(weights.get(name, 1.0)) for name in names]
    total = sum(values)
    return [v / total for v in values]


# --- the atom graph --------------------------------------------------------------------


@dataclass
class _Graph:
    """Atoms (servers, other switches) and the rates between them (module docstring, 1)."""

    members: list[list[str]]
    servers: list[int]  # the atoms holding GPUs, in (pod, index) order
    is_server: list[bool]
    switches: list[int]  # the other atoms, in datapath-id order
    pod: list[int | None]
    rail: list[int | None]  # a switch's rail plane; None for servers and shared switches
    tier: list[int]  # a switch's tier rank; 0 (the NVLink tier's) for servers
    load: list[float]
    adj: list[dict[int, float]]
    atom_of: dict[str, int]
    total_rate: float

    @classmethod
    def of(cls, description: FabricDescription) -> _Graph:
        fabric = description.fabric
        parent: dict[str, str] = {}

        def root(node: str) -> str:
            while parent.get(node, node) != node:
                parent[node] = parent.get(parent[node], parent[node])
                node = parent[node]
            return node

        def union(a: str, b: str) -> None:
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[rb] = ra

        servers = sorted(fabric.servers.values(), key=lambda s: (s.pod, s.index))
        for server in servers:
            for gpu in server.gpus:
                union(server.nvswitch, gpu)
        for link in fabric.links:
            if link.kind is LinkKind.NVLINK:
                union(link.a, link.b)
        # Canonical node order: servers' nodes, then switches by dpid, then any other GPU.
        order = [n for s in servers for n in (s.nvswitch, *s.gpus)]
        placed = set(order)
        order += [
            s.name
            for s in sorted(fabric.switches.values(), key=lambda s: s.dpid)
            if s.name not in placed
        ]
        placed.update(order)
        order += [g.name for g in fabric.gpus_by_rank() if g.name not in placed]
        groups: dict[str, list[str]] = {}
        for node in order:
            groups.setdefault(root(node), []).append(node)
        members = list(groups.values())
        atom_of = {node: i for i, nodes in enumerate(members) for node in nodes}

        loads = hop_loads(description)
        load = [sum(loads.get(n, 0.0) for n in nodes) for nodes in members]
        holds_gpus = [any(n in fabric.gpus for n in nodes) for nodes in members]
        pod: list[int | None] = []
        for nodes in members:
            first_gpu = next((n for n in nodes if n in fabric.gpus), None)
            pod.append(
                fabric.gpus[first_gpu].pod
                if first_gpu is not None
                else fabric.switches[nodes[0]].pod
            )
        rail = [
            None if holds_gpus[i] else fabric.switches[nodes[0]].rail
            for i, nodes in enumerate(members)
        ]
        tier = [
            Tier.NVLINK.rank if holds_gpus[i] else fabric.switches[nodes[0]].tier.rank
            for i, nodes in enumerate(members)
        ]
        adj: list[dict[int, float]] = [{} for _ in members]
        total = 0.0
        for link in fabric.links:
            a, b = atom_of[link.a], atom_of[link.b]
            if a == b:
                continue
            rate = description.emulated_rate(link)
            adj[a][b] = adj[a].get(b, 0.0) + rate
            adj[b][a] = adj[b].get(a, 0.0) + rate
            total += rate
        return cls(
            members=members,
            servers=[i for i in range(len(members)) if holds_gpus[i]],
            is_server=holds_gpus,
            switches=[i for i in range(len(members)) if not holds_gpus[i]],
            pod=pod,
            rail=rail,
            tier=tier,
            load=load,
            adj=adj,
            atom_of=atom_of,
            total_rate=total,
        )

    def cut_of(self, assign: list[int]) -> float:
        """The rate of the links ``assign`` cuts."""
        return sum(
            rate
            for atom, neighbours in enumerate(self.adj)
            for other, rate in neighbours.items()
            if atom < other and assign[atom] != assign[other]
        )


def _quotas(servers: int, shares: list[float]) -> list[float]:
    return [servers * s for s in shares]


def _apportion(quotas: list[float], names: tuple[str, ...]) -> list[int]:
    """Whole servers per machine by largest remainder (ties: the earlier machine)."""
    counts = [math.floor(q + _EPS) for q in quotas]
    rest = round(sum(quotas)) - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:rest]:
        counts[i] += 1
    for i, count in enumerate(counts):
        if count == 0:
            raise ValueError(
                f"the weights leave machine {names[i]!r} no server (its share is "
                f"{quotas[i]:.2f} of {round(sum(quotas))} servers, and a server cannot be "
                "split): raise its weight or leave it out"
            )
    return counts


def _place_servers(graph: _Graph, counts: list[int]) -> tuple[list[int], set[int | None]]:
    """Whole pods where they fit, the rest split by server in index order (module
    docstring, 3); every other atom unplaced (-1). Also the pods placed whole."""
    machines = len(counts)
    assign = [-1] * len(graph.members)
    room = list(counts)
    pods: dict[int | None, list[int]] = {}
    for atom in graph.servers:
        pods.setdefault(graph.pod[atom], []).append(atom)
    order = list(pods)
    left: list[int] = []
    whole: set[int | None] = set()
    for index in sorted(range(len(order)), key=lambda i: (-len(pods[order[i]]), i)):
        atoms = pods[order[index]]
        fits = [m for m in range(machines) if room[m] >= len(atoms)]
        if not fits:
            left.append(index)
            continue
        target = max(fits, key=lambda m: (room[m], -m))
        room[target] -= len(atoms)
        whole.add(order[index])
        for atom in atoms:
            assign[atom] = target
    for index in sorted(left):
        rest = pods[order[index]]
        while rest:
            # The pod's remainder whole to the tightest machine that holds it, else its
            # largest piece to the roomiest: few pieces per pod, few pods per machine.
            fits = [m for m in range(machines) if room[m] >= len(rest)]
            if fits:
                target = min(fits, key=lambda m: (room[m], m))
            else:
                target = max(range(machines), key=lambda m: (room[m], -m))
            take = min(room[target], len(rest))
            for atom in rest[:take]:
                assign[atom] = target
            room[target] -= take
            rest = rest[take:]
    return assign, whole


def _deal_planes(graph: _Graph, assign: list[int]) -> list[int]:
    """``assign`` with the rail planes of every split pod dealt whole to the machines holding
    its servers, in proportion to their servers there and in their servers' order: the
    other reading of "by rail plane" (the switches of one (pod, rail) together), which cuts
    the NIC links of the servers on the other machines instead of the planes' uplinks."""
    assign = list(assign)
    holders: dict[int | None, dict[int, int]] = {}
    for atom in graph.servers:
        counts = holders.setdefault(graph.pod[atom], {})
        counts[assign[atom]] = counts.get(assign[atom], 0) + 1
    planes: dict[int | None, dict[int, list[int]]] = {}
    for atom in graph.switches:
        rail = graph.rail[atom]
        if rail is not None and graph.pod[atom] is not None:
            planes.setdefault(graph.pod[atom], {}).setdefault(rail, []).append(atom)
    for pod, counts in holders.items():
        rails = sorted(planes.get(pod, {}))
        if len(counts) < 2 or not rails:
            continue
        machines = list(counts)  # in the order of the pod's servers
        total = sum(counts.values())
        quotas = [len(rails) * counts[m] / total for m in machines]
        dealt = [math.floor(q + _EPS) for q in quotas]
        by_remainder = sorted(range(len(machines)), key=lambda i: (dealt[i] - quotas[i], i))
        for i in by_remainder[: len(rails) - sum(dealt)]:
            dealt[i] += 1
        position = 0
        for machine, n in zip(machines, dealt, strict=True):
            for rail in rails[position : position + n]:
                for atom in planes[pod][rail]:
                    assign[atom] = machine
            position += n
    return assign


def _follow(graph: _Graph, assign: list[int], shares: list[float]) -> list[int]:
    """``assign`` with every unplaced switch placed bottom up where most of its links' rate
    to placed atoms lands, among the machines whose switches' hop load stays within their
    fair share plus the tolerance (else the least loaded for its weight); ties to the
    machine with the least hop load for its weight (module docstring, 4)."""
    assign = list(assign)
    machines = len(shares)
    total = sum(graph.load)
    load = [0.0] * machines
    for atom, machine in enumerate(assign):
        if machine >= 0:
            load[machine] += graph.load[atom]
    for atom in graph.switches:
        if assign[atom] >= 0:
            continue
        own = graph.load[atom]
        room = [
            m for m in range(machines) if load[m] + own <= shares[m] * total * (1 + LOAD_TOLERANCE)
        ]
        if not room:
            room = [min(range(machines), key=lambda m: ((load[m] + own) / shares[m], m))]
        conn = [0.0] * machines
        for other, rate in graph.adj[atom].items():
            if assign[other] >= 0:
                conn[assign[other]] += rate
        best = max(conn[m] for m in room)
        tie = _EPS * max(1.0, best)
        candidates = [m for m in room if conn[m] >= best - tie]
        target = min(candidates, key=lambda m: ((load[m] + own) / shares[m], m))
        assign[atom] = target
        load[target] += own
    return assign


def _deal_columns(graph: _Graph, assign: list[int], shares: list[float]) -> list[int]:
    """``assign`` with the ToRs following their servers and every *column* dealt whole to
    the machine with the least hop load for its weight, heaviest first. A column is a
    connected group of the switches above the ToRs: in Astral and the fat-tree the
    aggregation switches of one index with their core group, in the two-tier kinds one
    spine. Every ToR reaches every column alike, so this cuts some of every ToR's uplinks
    instead of the links between pods (better where the ToRs have fewer uplinks in all
    than the aggregation switches have)."""
    machines = len(shares)
    upper = [a for a in graph.switches if graph.tier[a] > Tier.TOR.rank and assign[a] < 0]
    follow = _follow(graph, assign, shares)
    assign = list(assign)
    for atom in graph.switches:
        if graph.tier[atom] <= Tier.TOR.rank:
            assign[atom] = follow[atom]
    inside = set(upper)
    column_of: dict[int, int] = {}
    columns: list[list[int]] = []
    for start in upper:
        if start in column_of:
            continue
        column_of[start] = len(columns)
        members, stack = [start], [start]
        while stack:
            atom = stack.pop()
            for other in graph.adj[atom]:
                if other in inside and other not in column_of:
                    column_of[other] = len(columns)
                    members.append(other)
                    stack.append(other)
        columns.append(members)
    load = [0.0] * machines
    for atom, machine in enumerate(assign):
        if machine >= 0:
            load[machine] += graph.load[atom]
    weight = [sum(graph.load[a] for a in column) for column in columns]
    for index in sorted(range(len(columns)), key=lambda i: (-weight[i], i)):
        target = min(range(machines), key=lambda m: ((load[m] + weight[index]) / shares[m], m))
        for atom in columns[index]:
            assign[atom] = target
        load[target] += weight[index]
    return assign


def _seeds(
    graph: _Graph, counts: list[int], shares: list[float]
) -> tuple[list[list[int]], list[bool]]:
    """The starting points (module docstring, 3 and 4), and which atoms are fixed: the
    servers and switches of the pods placed whole. Seeds: the switches following the
    servers; when a pod is split, its rail planes dealt out first; the columns above the
    ToRs of split pods, and the shared ones, dealt out."""
    servers, whole = _place_servers(graph, counts)
    home = {graph.pod[a]: servers[a] for a in graph.servers if graph.pod[a] in whole}
    fixed = [graph.pod[a] in whole for a in range(len(graph.members))]
    base = list(servers)
    for atom in graph.switches:
        if fixed[atom]:
            base[atom] = home[graph.pod[atom]]
    seeds = [_follow(graph, base, shares)]
    planes = _deal_planes(graph, base)
    if planes != base:
        seeds.append(_follow(graph, planes, shares))
    columns = _deal_columns(graph, base, shares)
    if columns not in seeds:
        seeds.append(columns)
    return seeds, fixed


# --- refinement ------------------------------------------------------------------------


class _State:
    """An assignment of atoms to machines with its cut, loads and per-atom connections
    kept up to date move by move."""

    def __init__(
        self,
        graph: _Graph,
        assign: list[int],
        shares: list[float],
        quotas: list[float],
        fixed: list[bool],
    ) -> None:
        self.graph = graph
        self.assign = list(assign)
        # What the moves may move: not the pods placed whole ("by pod" first).
        self.switches = [a for a in graph.switches if not fixed[a]]
        self.servers = [a for a in graph.servers if not fixed[a]]
        self.movable = [not f for f in fixed]
        self.shares = shares
        self.machines = len(shares)
        self.low = [math.floor(q + _EPS) for q in quotas]
        self.high = [math.ceil(q - _EPS) for q in quotas]
        self.tol = _EPS * max(1.0, graph.total_rate)
        m = self.machines
        self.conn = [[0.0] * m for _ in graph.members]
        self.count = [0] * m
        self.switch_load = [0.0] * m
        self.tunnel = [0.0] * m
        self.cut = 0.0
        for atom, neighbours in enumerate(graph.adj):
            here = assign[atom]
            self.switch_load[here] += graph.load[atom]
            for other, rate in neighbours.items():
                there = assign[other]
                self.conn[atom][there] += rate
                if there != here and atom < other:
                    self.cut += rate
                    self.tunnel[here] += rate
                    self.tunnel[there] += rate
        for atom in graph.servers:
            self.count[assign[atom]] += 1

    # The moves.

    def move(self, atom: int, target: int) -> None:
        graph, assign = self.graph, self.assign
        source = assign[atom]
        if source == target:
            return
        for other, rate in graph.adj[atom].items():
            there = assign[other]
            self.conn[other][source] -= rate
            self.conn[other][target] += rate
            if there != source:
                self.tunnel[source] -= rate
                self.tunnel[there] -= rate
                self.cut -= rate
            if there != target:
                self.tunnel[target] += rate
                self.tunnel[there] += rate
                self.cut += rate
        load = graph.load[atom]
        self.switch_load[source] -= load
        self.switch_load[target] += load
        if graph.is_server[atom]:
            self.count[source] -= 1
            self.count[target] += 1
        assign[atom] = target

    def gain(self, atom: int, target: int) -> float:
        """How much the cut's rate drops if ``atom`` moves to ``target``."""
        row = self.conn[atom]
        return row[target] - row[self.assign[atom]]

    # The balance.

    def loads(self) -> list[float]:
        """Each machine's hop load: its switches' plus its tunnels'."""
        return [s + t for s, t in zip(self.switch_load, self.tunnel, strict=True)]

    def loads_after(self, atom: int, target: int) -> list[float]:
        """The machines' hop loads if ``atom`` were on ``target``, without moving it: its
        links to machine k (``conn``) are tunnels now unless k is its machine, then unless k
        is ``target``, and a tunnel loads both its machines."""
        loads = self.loads()
        source = self.assign[atom]
        for k, rate in enumerate(self.conn[atom]):
            if rate == 0.0:
                continue
            if k != source:
                loads[source] -= rate
                loads[k] -= rate
            if k != target:
                loads[target] += rate
                loads[k] += rate
        loads[source] -= self.graph.load[atom]
        loads[target] += self.graph.load[atom]
        return loads

    def ratios(self, loads: list[float] | None = None) -> list[float]:
        """Each machine's hop load over its fair share (its weight's share of the total)."""
        loads = self.loads() if loads is None else loads
        total = sum(loads)
        if total <= 0:
            return [1.0] * self.machines
        return [load / (share * total) for load, share in zip(loads, self.shares, strict=True)]

    def balance(self, loads: list[float] | None = None) -> tuple[float, float]:
        """(the largest deviation of a machine's hop load from its fair share, as a fraction
        of that share; the weighted sum of the squared deviations), now or for ``loads``."""
        ratios = self.ratios(loads)
        worst = max(abs(r - 1.0) for r in ratios)
        spread = sum(share * (r - 1.0) ** 2 for r, share in zip(ratios, self.shares, strict=True))
        return worst, spread

    def attempt(self, moves: list[tuple[int, int]]) -> bool:
        """Make ``moves`` if they lower the cut within the load tolerance, or keep the cut and
        even out the loads; else undo them."""
        cut = self.cut
        worst, spread = self.balance()
        undo = [(atom, self.assign[atom]) for atom, _ in moves]
        for atom, target in moves:
            self.move(atom, target)
        new_worst, new_spread = self.balance()
        fits = new_worst <= max(LOAD_TOLERANCE, worst) + _EPS
        better = self.cut < cut - self.tol or (
            abs(self.cut - cut) <= self.tol and new_spread < spread - _EPS
        )
        if fits and better:
            return True
        for atom, source in reversed(undo):
            self.move(atom, source)
        return False

    # The passes.

    def refine(self) -> None:
        for _ in range(MAX_PASSES):
            changed = self._fm_pass()
            changed = self._switch_moves() or changed
            changed = self._server_moves() or changed
            changed = self._server_swaps() or changed
            if not changed:
                return

    def _fm_pass(self) -> bool:
        """One Fiduccia-Mattheyses pass: move the unlocked atom with the best gain, even a
        negative one, lock it, and so on; then keep the best prefix of the moves. Negative
        steps let it climb out of what single moves cannot leave (an Astral core group and
        its aggregation switches changing machine together). Every state of the pass keeps
        the hop loads within the tolerance (or the pass's starting deviation); server counts
        may stray by one server mid-pass (so two moves make a swap), but a prefix counts only
        where they are back within their bounds."""
        graph, machines = self.graph, self.machines
        limit = max(LOAD_TOLERANCE, self.balance()[0])
        best = (self.cut, self.balance()[1])
        best_length = 0
        locked = [False] * len(graph.members)
        version = [0] * len(graph.members)
        heap: list[tuple[float, int, int, int]] = []

        def push(atom: int) -> None:
            here = self.assign[atom]
            for target in range(machines):
                if target != here:
                    heapq.heappush(heap, (-self.gain(atom, target), atom, target, version[atom]))

        for atom in (*self.switches, *self.servers):
            push(atom)
        history: list[tuple[int, int]] = []
        while heap and len(history) - best_length <= FM_PATIENCE:
            _, atom, target, seen = heapq.heappop(heap)
            if locked[atom] or seen != version[atom]:
                continue
            source = self.assign[atom]
            if graph.is_server[atom] and (
                self.count[source] - 1 < self.low[source] - 1
                or self.count[target] + 1 > self.high[target] + 1
            ):
                continue
            worst, spread = self.balance(self.loads_after(atom, target))
            if worst > limit + _EPS:
                continue
            self.move(atom, target)
            locked[atom] = True
            history.append((atom, source))
            for other in graph.adj[atom]:
                if self.movable[other] and not locked[other]:
                    version[other] += 1
                    push(other)
            counted = all(
                low <= count <= high
                for low, count, high in zip(self.low, self.count, self.high, strict=True)
            )
            if counted and (
                self.cut < best[0] - self.tol
                or (abs(self.cut - best[0]) <= self.tol and spread < best[1] - _EPS)
            ):
                best = (self.cut, spread)
                best_length = len(history)
        for atom, source in reversed(history[best_length:]):
            self.move(atom, source)
        return best_length > 0

    def _targets(self, atom: int) -> list[int]:
        """Other machines by decreasing gain, the ones that would not lower the cut left out
        unless they keep it (a move that only evens the loads)."""
        here = self.assign[atom]
        others = [m for m in range(self.machines) if m != here]
        gains = {m: self.gain(atom, m) for m in others}
        keep = [m for m in others if gains[m] >= -self.tol]
        return sorted(keep, key=lambda m: (-gains[m], m))

    def _switch_moves(self) -> bool:
        changed = False
        for atom in self.switches:
            for target in self._targets(atom):
                if self.attempt([(atom, target)]):
                    changed = True
                    break
        return changed

    def _server_moves(self) -> bool:
        changed = False
        for atom in self.servers:
            source = self.assign[atom]
            if self.count[source] - 1 < self.low[source]:
                continue
            for target in self._targets(atom):
                if self.count[target] + 1 > self.high[target]:
                    continue
                if self.gain(atom, target) > self.tol and self.attempt([(atom, target)]):
                    changed = True
                    break
        return changed

    def _server_swaps(self) -> bool:
        changed = False
        for i in range(self.machines):
            for j in range(i + 1, self.machines):
                while self._swap(i, j):
                    changed = True
        return changed

    def _swap(self, i: int, j: int) -> bool:
        """Swap the best pair of servers between machines ``i`` and ``j``, if any pays."""

        def best(source: int, target: int) -> list[int]:
            atoms = [a for a in self.servers if self.assign[a] == source]
            atoms.sort(key=lambda a: (-self.gain(a, target), a))
            return atoms[:SWAP_CANDIDATES]

        pairs = []
        for a in best(i, j):
            for b in best(j, i):
                between = self.graph.adj[a].get(b, 0.0)
                gain = self.gain(a, j) + self.gain(b, i) - 2 * between
                if gain > self.tol:
                    pairs.append((-gain, a, b))
        return any(self.attempt([(a, j), (b, i)]) for _, a, b in sorted(pairs))

    def rebalance(self) -> None:
        """While a machine's hop load is off its fair share by more than the tolerance, make
        the switch move to or from it that costs the least cut and lowers (worst deviation,
        spread); stop when none does."""
        for _ in range(len(self.graph.members) * self.machines):
            worst, spread = self.balance()
            if worst <= LOAD_TOLERANCE + _EPS:
                return
            ratios = self.ratios()
            off = max(range(self.machines), key=lambda m: (abs(ratios[m] - 1.0), -m))
            best: tuple[float, float, float, int, int] | None = None
            for atom in self.switches:
                here = self.assign[atom]
                if self.graph.load[atom] <= 0:
                    continue
                targets = [m for m in range(self.machines) if m != here]
                if here != off:
                    targets = [off]
                for target in targets:
                    new_worst, new_spread = self.balance(self.loads_after(atom, target))
                    if new_worst < worst - _EPS or (
                        abs(new_worst - worst) <= _EPS and new_spread < spread - _EPS
                    ):
                        key = (-self.gain(atom, target), new_worst, new_spread, atom, target)
                        if best is None or key < best:
                            best = key
            if best is None:
                return
            self.move(best[3], best[4])


# --- the entry point -------------------------------------------------------------------


def place(
    description: FabricDescription,
    machines: Sequence[str],
    *,
    weights: Mapping[str, float] | None = None,
) -> Placement:
    """Place ``description``'s fabric over ``machines`` (module docstring, "The method").

    ``weights``: a machine's relative capacity (default 1 each); its GPU and hop-load shares
    follow it. ValueError, with a message for the user, for an empty list, a machine listed
    twice, weights naming other machines or not positive, or more machines than servers.
    """
    names = _check_machines(machines)
    shares = _check_weights(names, weights)
    fabric = description.fabric
    if len(names) == 1:
        return Placement(names, dict.fromkeys(fabric.nodes(), names[0]), description)
    if len(names) > len(fabric.servers):
        raise ValueError(
            f"{len(names)} machines but fabric {fabric.name} has only {len(fabric.servers)} "
            "server(s), and a server (its GPUs and NVLink switch) cannot be split: "
            f"use at most {len(fabric.servers)} machines"
        )
    graph = _Graph.of(description)
    quotas = _quotas(len(graph.servers), shares)
    counts = _apportion(quotas, names)
    seeds, fixed = _seeds(graph, counts, shares)
    chosen: list[int] = []
    best = (math.inf, math.inf)
    tol = _EPS * max(1.0, graph.total_rate)
    for seed in seeds:
        state = _State(graph, seed, shares, quotas, fixed)
        state.rebalance()
        state.refine()
        state.rebalance()
        # Within the load tolerance first, then the smaller cut, then the earlier seed.
        excess = max(0.0, state.balance()[0] - LOAD_TOLERANCE)
        cut = graph.cut_of(state.assign)  # afresh: the state's sum has seen many moves
        if excess < best[0] - _EPS or (abs(excess - best[0]) <= _EPS and cut < best[1] - tol):
            chosen, best = state.assign, (excess, cut)
    where = {node: names[chosen[graph.atom_of[node]]] for node in fabric.nodes()}
    return Placement(names, where, description)
