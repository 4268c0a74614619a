"""The baseline policy: one shortest path per (switch, destination), no load balancing.

Each switch forwards a destination's traffic over one next hop that is one hop closer to
it; among equal-cost next hops it takes the one ``controllers.routing.tie_break`` picks (a
static per-switch hash of the destination address), so destinations spread over the
parallel aggregation and core switches but every flow to one destination follows one path.
A failed link is routed around on the next render (the app re-renders on port status).
"""

from __future__ import annotations

from controllers.routing import ForwardingPlan, shortest_path_plan
from topologies.description import FabricDescription
from topologies.model import Link


class ShortestPathPolicy:
    name = "shortest"

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        return shortest_path_plan(description, failed_links, policy=self.name)
