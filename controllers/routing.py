"""The routing graph: which switch can reach which GPU, and the shortest-path plan.

Pure functions over a :class:`~topologies.description.FabricDescription` (no os-ken here, so
everything is unit-tested without a switch; docs/architecture.md: render, then
check, then start). Policies in
:mod:`controllers.policies` walk the :class:`RoutingGraph` to render a
:class:`~controllers.plan.ForwardingPlan`; :mod:`controllers.tracer` follows a rendered plan
back through the fabric to check it.

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
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controllers.plan import Action, FlowEntry, ForwardingPlan, Output, SetField, SwitchTable
from topologies.addressing import GATEWAY_MAC
from topologies.description import FabricDescription
from topologies.model import Fabric, Link, LinkKind, Switch, Tier

# Links the switches route over; NVLink links belong to the servers' own L2 switches.
FABRIC_LINK_KINDS = frozenset({LinkKind.NIC, LinkKind.TOR_AGG, LinkKind.AGG_CORE})


class RoutingError(Exception):
    """A plan does not do what it should (a loop or a dead end while following it)."""


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
