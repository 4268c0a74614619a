"""ECMP: every switch spreads flows over all its equal-cost next hops by a five-tuple hash.

For each destination with several equal-cost next hops, the switch's entry points at an
OpenFlow select group with one bucket per next hop (destinations with the same next hops
share the group). The group is installed with Open vSwitch's OpenFlow 1.5 selection method
``hash`` over the five-tuple (``controllers.plan.FIVE_TUPLE_FIELDS``: addresses,
protocol, TCP and UDP ports) and a per-switch ``basis`` (``selection_method_param``):

- **Why ``hash`` and not ``dp_hash``** (OVS's default since 2.10): with ``hash``, Open vSwitch
  hashes exactly the listed fields, seeded with the basis, and picks the live bucket with
  the highest score ``hash(bucket_id, flow_hash) * weight`` (rendezvous hashing;
  ofproto-dpif-xlate.c ``pick_hash_fields_select_group``). The bucket a flow lands in is
  therefore a function of its five-tuple, the basis and the bucket ids only: the same
  connection takes the same path run after run and on every machine, which experiments
  need to be repeatable and which lets telemetry name each flow's path. ``dp_hash`` uses
  the datapath's packet hash (RSS or a software hash of the kernel/userspace datapath,
  recirculated), whose value depends on the datapath implementation and version, and maps
  it to buckets through a table built when the group is installed: reproducible neither
  across datapaths nor obviously from the five-tuple.
- **Why a salt per switch**: with the same hash and basis everywhere, a switch two tiers up
  sees only flows that already hashed to one bucket below and, having the same number of
  buckets, sends them all to the same bucket again (polarization:
  ``ecmp-polarized`` shows it). The basis is a BLAKE2b hash of the datapath id
  (:func:`switch_basis`): different on every switch, the same on every run.
- Each bucket watches its output port (option ``fast_failover``, default on): Open vSwitch
  skips a bucket whose watched port is down, so the flows of a failed link move to the
  surviving buckets in the data plane, and only those (rendezvous hashing). The last hop
  of a dual-homed GPU gets a fast-failover group with a detour through its other ToR
  (``controllers.multipath``). With ``fast_failover=off`` recovery waits for the
  controller's re-render.

The switch must speak OpenFlow 1.5 for the selection method; over 1.3 the app installs the
same groups with the switch's default method and warns.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

from controllers.multipath import (
    PlanBuilder,
    Route,
    add_detour_guards,
    detour_hops,
    failover_actions,
    hop_actions,
    routes,
)
from controllers.plan import (
    FIVE_TUPLE_FIELDS,
    Action,
    Bucket,
    FlowEntry,
    ForwardingPlan,
    GroupType,
    SelectionMethod,
)
from controllers.policies.options import flag
from controllers.routing import RoutingGraph
from topologies.description import FabricDescription
from topologies.model import Link


def switch_basis(dpid: int) -> int:
    """The per-switch salt: 32 bits of BLAKE2b of the datapath id (stable across runs)."""
    digest = hashlib.blake2b(f"astral-ecmp|{dpid}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


class EcmpPolicy:
    name = "ecmp"
    pins_source_ports: ClassVar[bool] = False

    def __init__(self, fast_failover: str | bool = True) -> None:
        self.fast_failover = flag("fast_failover", fast_failover)

    def basis(self, route: Route) -> int:
        return switch_basis(route.switch.dpid)

    def render(
        self, description: FabricDescription, failed_links: frozenset[Link]
    ) -> ForwardingPlan:
        graph = RoutingGraph(description.fabric, failed_links)
        builder = PlanBuilder(description, graph, self.name)
        for route in routes(builder):
            actions: tuple[Action, ...]
            if len(route.hops) > 1:
                buckets = tuple(
                    Bucket(
                        hop_actions(description, route, hop),
                        watch_port=hop.port if self.fast_failover else None,
                    )
                    for hop in route.hops
                )
                selection = SelectionMethod("hash", FIVE_TUPLE_FIELDS, self.basis(route))
                actions = (builder.group(route.switch, GroupType.SELECT, buckets, selection),)
            elif self.fast_failover:
                detours = detour_hops(builder, route)
                actions = failover_actions(builder, route, list(route.hops), detours)
                add_detour_guards(builder, route, list(route.hops), detours)
            else:
                actions = hop_actions(description, route, route.hops[0])
            builder.add_flow(FlowEntry(route.switch.dpid, route.switch.name, route.ip, actions))
        return builder.plan()
