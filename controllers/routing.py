"""Forwarding state as data: what each fabric switch should do with each destination.

Pure functions over a :class:`~topologies.description.FabricDescription` (no os-ken here, so
everything is unit-tested without a switch; STYLE.md: render, then check, then start). The
policies in :mod:`controllers.policies` render a :class:`ForwardingPlan`; the os-ken app
(:mod:`controllers.app`) only translates it into OpenFlow messages.

Routing model::

    GPU --(NIC link)--> ToR --> agg --> core --> agg --> ToR --(NIC link)--> GPU
     |  eth_dst = gateway MAC, ip dst = destination's fabric address            ^
     |  (GPUs never forward fabric packets; NVLink switches are not programmed) |
     +-- every switch matches ipv4_dst = the fabric address (/32); the last hop
         (ToR port facing the destination's NIC port) rewrites eth_dst to that
         NIC port's MAC and eth_src to the gateway MAC, then outputs.

The routing graph holds the fabric switches (ToR, agg, core) and the GPUs, joined by every
NIC, ToR-agg and agg-core link that has not failed; NVLink links and NVLink switches are left
out (cross-rail forwarding of rail-only fabrics happens inside the server, over NVLink). A
GPU is a leaf: it may end a path, never carry one. A switch that cannot reach a destination
gets no entry for it (the table-miss entry drops).

Ports in a plan are the model's port numbers (``topologies.model``); :class:`PortMap`
translates them to OpenFlow port numbers when the emulation had to use others
(``description.extra["ofports"]``).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from topologies.addressing import GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.model import Fabric, Link, LinkKind, Switch, Tier

# OpenFlow priorities of the controller's entries (table 0).
ROUTE_PRIORITY = 100
ARP_PRIORITY = 10
MISS_PRIORITY = 0

# Links the switches route over; NVLink links belong to the servers' own L2 switches.
FABRIC_LINK_KINDS = frozenset({LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE})


class RoutingError(Exception):
    """A plan does not do what it should (a loop or a dead end while following it)."""


# --- actions and entries -------------------------------------------------------------------


@dataclass(frozen=True)
class SetField:
    """Rewrite a header field (OXM name as os-ken spells it: ``eth_src``, ``eth_dst``)."""

    field: str
    value: str


@dataclass(frozen=True)
class Output:
    """Send out of a port (model port number)."""

    port: int


# Later policies add e.g. ``Group(group_id)`` here (select / fast-failover groups).
Action = SetField | Output


@dataclass(frozen=True)
class FlowEntry:
    """One flow entry of table 0: match ``ipv4_dst`` (exact), apply ``actions`` in order."""

    dpid: int
    switch: str
    ipv4_dst: str
    actions: tuple[Action, ...]
    priority: int = ROUTE_PRIORITY

    @property
    def key(self) -> tuple[int, str]:
        """What identifies the entry in the switch (priority and match): one per key."""
        return (self.priority, self.ipv4_dst)

    @property
    def out_ports(self) -> tuple[int, ...]:
        return tuple(a.port for a in self.actions if isinstance(a, Output))


@dataclass(frozen=True)
class SwitchTable:
    """Everything the controller installs on one switch for a plan.

    Room to grow: a later policy adds ``groups`` (select / fast-failover group entries)
    next to ``flows``, and the app installs groups before the flows that point at them.
    """

    dpid: int
    switch: str
    flows: tuple[FlowEntry, ...] = ()


@dataclass(frozen=True)
class ForwardingPlan:
    """Per-switch tables for every programmable switch (empty tables included)."""

    policy: str
    tables: Mapping[int, SwitchTable]
    failed_links: frozenset[Link] = field(default_factory=frozenset)

    def table(self, dpid: int) -> SwitchTable:
        return self.tables[dpid]

    def flows(self) -> Iterable[FlowEntry]:
        for dpid in sorted(self.tables):
            yield from self.tables[dpid].flows

    def lookup(self, dpid: int, ipv4_dst: str) -> FlowEntry | None:
        """The route entry ``dpid`` uses for ``ipv4_dst`` (highest priority), if any."""
        best: FlowEntry | None = None
        for entry in self.tables[dpid].flows:
            if entry.ipv4_dst == ipv4_dst and (best is None or entry.priority > best.priority):
                best = entry
        return best


# --- the routing graph ---------------------------------------------------------------------


def programmable_switches(fabric: Fabric) -> list[Switch]:
    """The switches the controller programs (every tier but NVLink), by dpid."""
    return sorted(
        (s for s in fabric.switches.values() if s.tier is not Tier.NVLINK), key=lambda s: s.dpid
    )


@dataclass(frozen=True)
class Adjacency:
    """One usable link as seen from ``node``: leave by ``port``, arrive at ``neighbor``."""

    port: int
    neighbor: str
    neighbor_port: int
    link: Link


class RoutingGraph:
    """The fabric's switches and GPUs joined by its live fabric links."""

    def __init__(self, fabric: Fabric, failed_links: Iterable[Link] = ()) -> None:
        self.fabric = fabric
        self.failed = frozenset(failed_links)
        self.switches = {s.name for s in programmable_switches(fabric)}
        adjacency: dict[str, list[Adjacency]] = {}
        for link in fabric.links:
            if link.kind not in FABRIC_LINK_KINDS or link in self.failed:
                continue
            adjacency.setdefault(link.a, []).append(
                Adjacency(link.a_port, link.b, link.b_port, link)
            )
            adjacency.setdefault(link.b, []).append(
                Adjacency(link.b_port, link.a, link.a_port, link)
            )
        self.adjacency = {
            node: sorted(adj, key=lambda x: x.port) for node, adj in adjacency.items()
        }

    def neighbors(self, node: str) -> list[Adjacency]:
        return self.adjacency.get(node, [])

    def distances_to(self, destination: str) -> dict[str, int]:
        """Hop counts from every switch that can reach ``destination`` (0 for itself).

        Breadth-first from the destination through switches only: a GPU is never transit.
        """
        dist = {destination: 0}
        queue = deque([destination])
        while queue:
            node = queue.popleft()
            for adj in self.neighbors(node):
                if adj.neighbor in self.switches and adj.neighbor not in dist:
                    dist[adj.neighbor] = dist[node] + 1
                    queue.append(adj.neighbor)
        return dist

    def next_hops(self, switch: str, destination: str, dist: Mapping[str, int]) -> list[Adjacency]:
        """Links out of ``switch`` that lie on a shortest path to ``destination``, by port."""
        here = dist.get(switch)
        if here is None or here == 0:
            return []
        return [
            adj
            for adj in self.neighbors(switch)
            if (adj.neighbor in self.switches or adj.neighbor == destination)
            and dist.get(adj.neighbor) == here - 1
        ]


def tie_break(switch: str, ipv4_dst: str, count: int) -> int:
    """Index of the equal-cost next hop ``switch`` uses for ``ipv4_dst`` (of ``count``).

    A static hash of (switch, destination), BLAKE2b, so the choice is the same in every
    process and on every run (Python's ``hash`` of a str is salted per process). Including the
    switch name salts the hash per switch, so that tiers do not all pick the same index for a
    destination; the hash must not be linear: with CRC-32, ``crc(t|ip) ^ crc(a|ip)`` is the
    same for every ``ip`` (equal-length inputs), so a ToR's and an aggregation switch's choices
    stay correlated and astral-small used only two of its four cores (polarization).
    """
    if count <= 0:
        raise ValueError("no next hop to choose from")
    digest = hashlib.blake2b(f"{switch}|{ipv4_dst}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count


def last_hop_actions(
    description: FabricDescription, destination: str, switch: str, port: int
) -> list[Action]:
    """Deliver to ``destination``'s NIC port behind ``switch``'s ``port``: rewrite, output."""
    for nic in description.addresses[destination].nics:
        if nic.peer == switch and nic.peer_port == port:
            return [SetField("eth_src", GATEWAY_MAC), SetField("eth_dst", nic.mac), Output(port)]
    raise RoutingError(f"{destination} has no NIC port behind {switch} port {port}")


def shortest_path_plan(
    description: FabricDescription, failed_links: Iterable[Link] = (), policy: str = "shortest"
) -> ForwardingPlan:
    """One next hop per (switch, destination) on a shortest path; ties by :func:`tie_break`.

    Every next hop is one hop closer to the destination, so following the entries from any
    switch reaches the destination in exactly its shortest-path distance (no loops).
    """
    fabric = description.fabric
    graph = RoutingGraph(fabric, failed_links)
    switches = {s.name: s for s in programmable_switches(fabric)}
    flows: dict[int, list[FlowEntry]] = {s.dpid: [] for s in switches.values()}
    for gpu in fabric.gpus_by_rank():
        ip = description.addresses[gpu.name].fabric_ip
        dist = graph.distances_to(gpu.name)
        for name in dist:  # the switches that reach the GPU (and the GPU itself)
            switch = switches.get(name)
            hops = graph.next_hops(name, gpu.name, dist) if switch is not None else []
            if switch is None or not hops:
                continue
            hop = hops[tie_break(switch.name, ip, len(hops))]
            if hop.neighbor == gpu.name:
                actions = last_hop_actions(description, gpu.name, switch.name, hop.port)
            else:
                actions = [Output(hop.port)]
            flows[switch.dpid].append(FlowEntry(switch.dpid, switch.name, ip, tuple(actions)))
    tables = {
        s.dpid: SwitchTable(s.dpid, s.name, tuple(sorted(flows[s.dpid], key=_flow_order)))
        for s in switches.values()
    }
    return ForwardingPlan(policy, tables, graph.failed)


def _flow_order(entry: FlowEntry) -> tuple[int, tuple[int, ...]]:
    return (-entry.priority, tuple(int(x) for x in entry.ipv4_dst.split(".")))


# --- reading a plan back -------------------------------------------------------------------


def follow(
    description: FabricDescription, plan: ForwardingPlan, switch: str, ipv4_dst: str
) -> list[str]:
    """The switches a packet for ``ipv4_dst`` visits from ``switch``, then the GPU reached.

    Raises :class:`RoutingError` on a loop, a missing entry or a port that leads nowhere.
    """
    fabric = description.fabric
    ends = link_ends(fabric)
    path = [switch]
    node = switch
    while node in fabric.switches:
        entry = plan.lookup(fabric.switches[node].dpid, ipv4_dst)
        if entry is None:
            raise RoutingError(f"{node} has no entry for {ipv4_dst} (path {path})")
        ports = entry.out_ports
        if len(ports) != 1:
            raise RoutingError(f"{node} outputs {ipv4_dst} to {len(ports)} ports")
        link = ends.get((node, ports[0]))
        if link is None:
            raise RoutingError(f"{node} port {ports[0]} has no link")
        node = link.other(node)
        if node in path:
            raise RoutingError(f"loop for {ipv4_dst}: {[*path, node]}")
        path.append(node)
    if description.addresses.get(node) is None or description.addresses[node].fabric_ip != ipv4_dst:
        raise RoutingError(f"{ipv4_dst} ends at {node}, not at its GPU (path {path})")
    return path


def link_ends(fabric: Fabric) -> dict[tuple[str, int], Link]:
    """Every link by each of its ends, (node, port)."""
    ends: dict[tuple[str, int], Link] = {}
    for link in fabric.links:
        ends[(link.a, link.a_port)] = link
        ends[(link.b, link.b_port)] = link
    return ends


def failed_links_at(fabric: Fabric, down_ports: Iterable[tuple[str, int]]) -> frozenset[Link]:
    """The fabric links with an end among ``down_ports`` ((switch, model port) pairs)."""
    ends = link_ends(fabric)
    return frozenset(
        ends[end] for end in down_ports if end in ends and ends[end].kind in FABRIC_LINK_KINDS
    )


# --- OpenFlow port numbers -----------------------------------------------------------------


class PortMap:
    """Model port <-> OpenFlow port, per switch.

    The emulation asks Open vSwitch for ``ofport = model port`` (``ofport_request``); where it
    could not, it publishes ``description.extra["ofports"] = {switch: {model_port: ofport}}``
    (JSON object keys are strings). Ports not in the map keep their model number.
    """

    def __init__(self, ofports: Mapping[str, Mapping[Any, Any]] | None = None) -> None:
        self._to_of: dict[str, dict[int, int]] = {}
        self._to_model: dict[str, dict[int, int]] = {}
        for switch, ports in (ofports or {}).items():
            forward = {int(model): int(of) for model, of in ports.items()}
            self._to_of[switch] = forward
            self._to_model[switch] = {of: model for model, of in forward.items()}

    @classmethod
    def of(cls, description: FabricDescription) -> PortMap:
        raw = description.extra.get("ofports")
        if raw is not None and not isinstance(raw, Mapping):
            raise ValueError("description.extra['ofports'] must map switch -> {port: ofport}")
        return cls(raw)

    def ofport(self, switch: str, model_port: int) -> int:
        return self._to_of.get(switch, {}).get(model_port, model_port)

    def model_port(self, switch: str, ofport: int) -> int:
        return self._to_model.get(switch, {}).get(ofport, ofport)
