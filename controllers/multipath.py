"""Building blocks the multipath policies share: next-hop sets, groups, data-plane failover.

Pure functions over the routing graph (``controllers.routing``), like the shortest-path plan;
the policies (``controllers.policies``) combine them:

- :class:`PlanBuilder` collects flow entries and groups per switch and gives each group a
  stable id (``routing.stable_group_id``): identical groups on a switch are one group
  (every destination reached over the same uplinks shares one select group), and a group
  keeps its id when a failure changes other groups, so re-rendering modifies little.
- :func:`routes` lists, for every (switch, destination GPU), the equal-cost next hops and the
  switch's distance to the GPU (what path-pinned's bit fields are indexed by).
- Data-plane failover (``fast_failover=True``): wherever a switch has an alternative, the
  plan points at a group whose buckets watch their ports, so Open vSwitch moves traffic
  the moment a port goes down, before the controller hears of it:

  * several equal-cost next hops (ToR -> agg, agg -> core upward; agg -> the two ToRs of a
    dual-homed GPU downward): a fast-failover group, preferred hop first, then the others
    (shortest, path-pinned), or a select group whose buckets watch their output ports
    (ecmp: Open vSwitch skips a select bucket whose watched port is down);
  * the last hop, ToR -> GPU, for a dual-homed GPU: a fast-failover group whose first
    bucket delivers to the GPU and whose backups go up to the aggregation switches that
    also reach the GPU's other ToR ("detour"); those aggregation switches get a
    higher-priority entry for packets of that GPU coming *from* that ToR (``in_port``),
    sending them to the other ToR, so a detoured packet never bounces back.
    A packet for the GPU that came *down* one of those uplinks must not take it back up:
    OpenFlow drops an output to the ingress port (Open vSwitch: "skipping output to input
    port"; only the reserved port IN_PORT may send a packet back). So the ToR also gets, per
    detour uplink, a higher-priority entry for packets arriving on it, whose group has the
    same delivery bucket but only the *other* detours as backups. Without them, every
    packet that an aggregation switch sent down to a ToR whose GPU link had died was
    dropped there whenever that aggregation switch was the ToR's first detour: the stream
    stopped at the failure instead of failing over.

  What stays with the controller: a core's single link down into a plane (core -> agg) has
  no loop-free alternative without a detour through another plane; traffic to it waits
  for the controller to re-route (the agg side of that link fails over in the data plane).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from controllers.plan import (
    ROUTE_PRIORITY,
    Action,
    Bucket,
    FlowEntry,
    ForwardingPlan,
    Group,
    GroupEntry,
    GroupType,
    Output,
    SelectionMethod,
    SwitchTable,
    stable_group_id,
)
from controllers.routing import Adjacency, RoutingGraph, last_hop_actions, programmable_switches
from topologies.description import FabricDescription
from topologies.model import Link, Switch

# Above path-pinned's source-port entries (ROUTE_PRIORITY + 100): a detoured packet must
# not follow a pinned choice back to where it came from.
DETOUR_PRIORITY = ROUTE_PRIORITY + 200


@dataclass(frozen=True)
class Route:
    """Where ``switch`` may send packets for ``gpu``: ``hops`` (equal cost, by port)."""

    switch: Switch
    gpu: str
    ip: str
    distance: int  # hops from the switch to the GPU
    hops: tuple[Adjacency, ...]


def routes(builder: PlanBuilder) -> Iterator[Route]:
    """Every (switch, destination GPU) with at least one next hop, GPUs by rank."""
    description, graph = builder.description, builder.graph
    fabric = description.fabric
    switches = {s.name: s for s in programmable_switches(fabric)}
    for gpu in fabric.gpus_by_rank():
        ip = description.addresses[gpu.name].fabric_ip
        dist = builder.distances(gpu.name)
        for name in sorted(dist, key=lambda n: switches[n].dpid if n in switches else -1):
            switch = switches.get(name)
            if switch is None:
                continue
            hops = graph.next_hops(name, gpu.name, dist)
            if hops:
                yield Route(switch, gpu.name, ip, dist[name], tuple(hops))


@dataclass
class PlanBuilder:
    """Flow entries and groups per switch, with shared, stably numbered groups."""

    description: FabricDescription
    graph: RoutingGraph
    policy: str
    flows: dict[int, list[FlowEntry]] = field(default_factory=dict)
    groups: dict[int, dict[int, GroupEntry]] = field(default_factory=dict)
    _contents: dict[int, dict[int, object]] = field(default_factory=dict)
    _ids: dict[tuple[int, object], int] = field(default_factory=dict)
    _dist: dict[str, dict[str, int]] = field(default_factory=dict)

    def distances(self, gpu: str) -> dict[str, int]:
        """``graph.distances_to(gpu)``, computed once per render."""
        if gpu not in self._dist:
            self._dist[gpu] = self.graph.distances_to(gpu)
        return self._dist[gpu]

    def add_flow(self, entry: FlowEntry) -> None:
        self.flows.setdefault(entry.dpid, []).append(entry)

    def group(
        self,
        switch: Switch,
        kind: GroupType,
        buckets: tuple[Bucket, ...],
        selection: SelectionMethod | None = None,
    ) -> Group:
        """A :class:`Group` action for this group on ``switch`` (created once per content)."""
        content = (kind, buckets, selection)
        gid = self._ids.get((switch.dpid, content))
        if gid is None:
            taken = self._contents.setdefault(switch.dpid, {})
            gid = stable_group_id(switch.name, content, taken)
            taken[gid] = content
            self._ids[(switch.dpid, content)] = gid
            self.groups.setdefault(switch.dpid, {})[gid] = GroupEntry(
                switch.dpid, switch.name, gid, kind, buckets, selection
            )
        return Group(gid)

    def plan(self, extra: Mapping[str, Any] | None = None) -> ForwardingPlan:
        tables = {}
        for switch in programmable_switches(self.description.fabric):
            flows = sorted(self.flows.get(switch.dpid, []), key=flow_order)
            groups = sorted(self.groups.get(switch.dpid, {}).values(), key=lambda g: g.group_id)
            tables[switch.dpid] = SwitchTable(switch.dpid, switch.name, tuple(flows), tuple(groups))
        return ForwardingPlan(self.policy, tables, self.graph.failed, dict(extra or {}))


def flow_order(entry: FlowEntry) -> tuple[Any, ...]:
    return (
        -entry.priority,
        tuple(int(x) for x in entry.ipv4_dst.split(".")),
        repr(sorted(entry.match().items())),
    )


def hop_actions(description: FabricDescription, route: Route, hop: Adjacency) -> tuple[Action, ...]:
    """Forward over ``hop``: rewrite and output if it reaches the GPU, else output."""
    if hop.neighbor == route.gpu:
        return tuple(last_hop_actions(description, route.gpu, route.switch.name, hop.port))
    return (Output(hop.port),)


def detour_hops(builder: PlanBuilder, route: Route) -> list[Adjacency]:
    """For a last hop (switch -> GPU): the uplinks to switches that reach the GPU another
    way (through the GPU's other ToR), by port. Empty for a single-homed GPU.
    """
    if route.distance != 1:
        return []
    graph = builder.graph
    dist = builder.distances(route.gpu)
    found = []
    for adj in graph.neighbors(route.switch.name):
        if adj.neighbor not in graph.switches or dist.get(adj.neighbor) != 2:
            continue
        others = [
            h
            for h in graph.next_hops(adj.neighbor, route.gpu, dist)
            if h.neighbor != route.switch.name
        ]
        if others:
            found.append(adj)
    return found


def failover_actions(
    builder: PlanBuilder, route: Route, ordered: list[Adjacency], detours: list[Adjacency]
) -> tuple[Action, ...]:
    """Forward over ``ordered[0]``; with alternatives, through a fast-failover group whose
    buckets watch their ports: ``ordered`` (equal-cost hops, preferred first), then
    ``detours`` (see :func:`detour_hops`).
    """
    if len(ordered) + len(detours) == 1:
        return hop_actions(builder.description, route, ordered[0])
    buckets = tuple(
        Bucket(hop_actions(builder.description, route, hop), watch_port=hop.port) for hop in ordered
    ) + tuple(Bucket((Output(hop.port),), watch_port=hop.port) for hop in detours)
    return (builder.group(route.switch, GroupType.FAST_FAILOVER, buckets),)


def add_detour_guards(
    builder: PlanBuilder, route: Route, ordered: list[Adjacency], detours: list[Adjacency]
) -> None:
    """The entries that keep a last hop's detours (see :func:`detour_hops`) loop-free, for the
    route whose entry is ``failover_actions(builder, route, ordered, detours)``:

    - at ``route.switch`` (the ToR), for packets arriving on a detour uplink: the same
      delivery (``ordered``), then only the other detours, since a switch never sends a
      packet back out of the port it came in by (the module docstring); none when there is
      no other detour (such a packet has no way around);
    - at each switch a detour goes through: packets for the GPU that come from
      ``route.switch`` go on over the hops that avoid it (fast-failover, in port order).
    """
    for came_in in detours:
        others = [d for d in detours if d.port != came_in.port]
        if not others:
            continue
        builder.add_flow(
            FlowEntry(
                route.switch.dpid,
                route.switch.name,
                route.ip,
                failover_actions(builder, route, ordered, others),
                priority=DETOUR_PRIORITY,
                in_port=came_in.port,
            )
        )
    fabric = builder.description.fabric
    dist = builder.distances(route.gpu)
    for detour in detours:
        via = fabric.switches[detour.neighbor]
        hops = [
            h
            for h in builder.graph.next_hops(via.name, route.gpu, dist)
            if h.neighbor != route.switch.name
        ]
        guard = Route(via, route.gpu, route.ip, dist[via.name], tuple(hops))
        actions = failover_actions(builder, guard, hops, [])
        builder.add_flow(
            FlowEntry(
                via.dpid,
                via.name,
                route.ip,
                actions,
                priority=DETOUR_PRIORITY,
                in_port=detour.neighbor_port,
            )
        )


def failed_ends(failed: frozenset[Link]) -> set[tuple[str, int]]:
    return {(x.a, x.a_port) for x in failed} | {(x.b, x.b_port) for x in failed}
