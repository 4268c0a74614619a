"""The baseline policy: one shortest path per (switch, destination), no load balancing.

Each switch forwards a destination's traffic over one next hop that is one hop closer to
it; among equal-cost next hops it takes the one ``controllers.routing.tie_break`` picks (a
static per-switch hash of the destination address), so destinations spread over the
parallel aggregation and core switches but every flow to one destination follows one path.
A failed link is routed around on the next render (the app re-renders on port status).

Option ``fast_failover`` (default off, so that the baseline stays one plain entry per
destination): the chosen hop goes into a fast-failover group with the other equal-cost
hops (and, on a dual-homed GPU's last hop, the detour through its other ToR) as backups,
so the data plane recovers before the controller re-routes (``controllers.multipath``).
"""

from __future__ import annotations

from typing import ClassVar

from controllers.multipath import (
    PlanBuilder,
    add_detour_guards,
    detour_hops,
    failover_actions,
    routes,
)
from controllers.plan import FlowEntry, ForwardingPlan
from controllers.policies.options import flag
from controllers.routing import RoutingGraph, shortest_path_plan, tie_break
from topologies.description import FabricDescription
from topologies.model import Link


class ShortestPathPolicy:
    name = "shortest"
    pins_source_ports: ClassVar[bool] = False

    def __init__(self, fast_failover: str | bool = False) -> None:
        self.fast_failover = flag("fast_failover", fast_failover)

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        if not self.fast_failover:
            return shortest_path_plan(description, failed_links, policy=self.name)
        graph = RoutingGraph(description.fabric, failed_links)
        builder = PlanBuilder(description, graph, self.name)
        for route in routes(builder):
            hops = list(route.hops)
            chosen = hops.pop(tie_break(route.switch.name, route.ip, len(hops)))
            detours = detour_hops(builder, route)
            actions = failover_actions(builder, route, [chosen, *hops], detours)
            builder.add_flow(FlowEntry(route.switch.dpid, route.switch.name, route.ip, actions))
            add_detour_guards(builder, route, [chosen, *hops], detours)
        return builder.plan()
