"""Path pinning: the source port of a TCP connection decides its path through the fabric.

Deterministic path control in the style of Astral/HPN (source-port path selection) and
P-ECMP: the orchestrator gives the connections of a collective source ports whose paths
are link-disjoint (``controllers.pinning.assign_paths``), so they do not collide the way
randomly hashed flows do. The rules (``controllers.pinning`` explains the bit layout):

- at a switch with ``k > 1`` equal-cost next hops towards a GPU, ``2**w`` entries at
  :data:`PIN_PRIORITY` match ``ipv4_dst``, ``ip_proto=6`` and the ``w``-bit field of
  ``tcp_src`` that the switch's distance to the GPU selects, and forward to hop
  ``field % k`` (hops in port order): rules grow with destinations and hops, not flows;
- a default entry per destination (:data:`~controllers.plan.ROUTE_PRIORITY`) carries
  everything else (ICMP, UDP, ARP-resolved control traffic) on one shortest path, as
  ``shortest`` does.

The controller publishes the resulting paths per (src, dst) pair (``--paths``, format in
``controllers.pinning``). The first hop, GPU -> ToR, is the host's (kernel multipath) choice:
pinning is inside the fabric, and the published paths and the assignment cover both NIC
ports; which one a connection takes is the hosts' ``host_ports`` setting
(orchestrator/testbed/hostports.py), the same under every policy.

Option ``fast_failover`` (default on): each pinned (and default) choice is the first bucket
of a fast-failover group whose other buckets are the remaining equal-cost hops, plus the
detour through the other ToR on a dual-homed GPU's last hop (``controllers.multipath``), so
a failed link's flows move in the data plane; the controller then re-renders without the
link (the layout stays, ``field % k`` picks among the surviving hops) and republishes the
paths.
"""

from __future__ import annotations

from typing import Any, ClassVar

from controllers.multipath import (
    PlanBuilder,
    Route,
    add_detour_guards,
    detour_hops,
    failover_actions,
    hop_actions,
    routes,
)
from controllers.pinning import PinnedPaths, PortLayout, paths_document, port_layout
from controllers.plan import IPPROTO_TCP, ROUTE_PRIORITY, Action, FlowEntry, ForwardingPlan
from controllers.policies.options import flag
from controllers.routing import Adjacency, RoutingGraph, tie_break
from topologies.description import FabricDescription
from topologies.model import Link

PIN_PRIORITY = ROUTE_PRIORITY + 100


class PathPinnedPolicy:
    name = "path-pinned"
    pins_source_ports: ClassVar[bool] = True  # the host's half: orchestrator.testbed.pinning

    def __init__(self, fast_failover: str | bool = True) -> None:
        self.fast_failover = flag("fast_failover", fast_failover)
        self._layouts: dict[str, PortLayout] = {}

    def layout(self, description: FabricDescription) -> PortLayout:
        """The source-port layout of the intact fabric (the same after failures)."""
        key = description.fabric.name
        if key not in self._layouts:
            self._layouts[key] = port_layout(description)
        return self._layouts[key]

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        layout = self.layout(description)
        graph = RoutingGraph(description.fabric, failed_links)
        builder = PlanBuilder(description, graph, self.name)
        for route in routes(builder):
            switch = route.switch
            detours = detour_hops(builder, route) if self.fast_failover else []
            default = route.hops[tie_break(switch.name, route.ip, len(route.hops))]
            builder.add_flow(
                FlowEntry(
                    switch.dpid,
                    switch.name,
                    route.ip,
                    self._towards(builder, route, default, detours),
                )
            )
            add_detour_guards(builder, route, self._ordered(route, default), detours)
            bits = layout.field(route.distance)
            if len(route.hops) < 2 or bits is None:
                continue
            mask = ((1 << bits.width) - 1) << bits.shift
            for value in range(1 << bits.width):
                hop = route.hops[value % len(route.hops)]
                builder.add_flow(
                    FlowEntry(
                        switch.dpid,
                        switch.name,
                        route.ip,
                        self._towards(builder, route, hop, []),
                        priority=PIN_PRIORITY,
                        ip_proto=IPPROTO_TCP,
                        tcp_src=value << bits.shift,
                        tcp_src_mask=mask,
                    )
                )
        return builder.plan({"layout": layout.to_dict()})

    def _towards(
        self, builder: PlanBuilder, route: Route, hop: Adjacency, detours: list[Adjacency]
    ) -> tuple[Action, ...]:
        if not self.fast_failover:
            return hop_actions(builder.description, route, hop)
        return failover_actions(builder, route, self._ordered(route, hop), detours)

    @staticmethod
    def _ordered(route: Route, hop: Adjacency) -> list[Adjacency]:
        """``hop`` first, then the route's other hops (the fast-failover order)."""
        return [hop, *(h for h in route.hops if h != hop)]

    def publish(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> dict[str, Any]:
        """The paths file's content for the fabric with ``failed_links`` down."""
        pinned = PinnedPaths(description, failed_links, self.layout(description))
        return paths_document(pinned, self.name)
