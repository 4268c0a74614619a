"""Following a plan back: the path a packet takes through the switches' entries and groups.

The check half of render, then check, then start: the tests ask where a packet would go under
a :class:`~controllers.plan.ForwardingPlan`, with groups resolved as a switch would resolve
them (fast-failover by watched ports, select by the caller's choice or every live bucket),
and get a :class:`~controllers.routing.RoutingError` for a loop, a missing entry, a port
that leads nowhere or an output to the port the packet came in by (an OpenFlow switch drops
that: only the reserved port IN_PORT sends a packet back; Open vSwitch says "skipping output
to input port"). Nothing here talks to a switch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from controllers.plan import (
    Action,
    Bucket,
    ForwardingPlan,
    Group,
    GroupEntry,
    GroupType,
    Output,
    Packet,
    SwitchTable,
)
from controllers.routing import RoutingError, link_ends
from topologies.description import FabricDescription

BucketChooser = Callable[[str, GroupEntry, list[Bucket]], Bucket]


def follow(
    description: FabricDescription,
    plan: ForwardingPlan,
    switch: str,
    destination: str | Packet,
    *,
    down: Iterable[tuple[str, int]] | None = None,
    choose: BucketChooser | None = None,
) -> list[str]:
    """The switches a packet visits from ``switch``, then the GPU reached.

    ``destination``: an address (the destination's default route) or a :class:`Packet`
    (entries matching more than the destination apply). Groups are resolved as the switch
    would: a fast-failover group takes its first bucket whose watched port is not ``down``
    ((switch, model port) pairs; default: both ends of ``plan.failed_links``), a select
    group with one live bucket takes it, with more it asks ``choose(switch, group, live)``
    (without ``choose``: a :class:`RoutingError`, since the switch's hash decides; see
    :func:`trace_all`).

    Raises :class:`RoutingError` on a loop, a missing entry, a port that leads nowhere or an
    output to the port the packet arrived on (which the switch would drop).
    """
    return [
        node
        for node, _ in follow_hops(description, plan, switch, destination, down=down, choose=choose)
    ]


def follow_hops(
    description: FabricDescription,
    plan: ForwardingPlan,
    switch: str,
    destination: str | Packet,
    *,
    down: Iterable[tuple[str, int]] | None = None,
    choose: BucketChooser | None = None,
) -> list[tuple[str, int | None]]:
    """:func:`follow`'s path with the port the packet came in by at each node (None at
    ``switch``): where two switches are joined by several links, which one it crossed."""
    return _trace(description, plan, switch, destination, down, choose, branch=False)[0]


def trace_all(
    description: FabricDescription,
    plan: ForwardingPlan,
    switch: str,
    destination: str | Packet,
    *,
    down: Iterable[tuple[str, int]] | None = None,
) -> list[list[str]]:
    """Every path a packet may take from ``switch``: one per live bucket of each select group.

    Sorted; :class:`RoutingError` as for :func:`follow` if any branch fails.
    """
    hops = _trace(description, plan, switch, destination, down, None, branch=True)
    return sorted([node for node, _ in path] for path in hops)


def _trace(
    description: FabricDescription,
    plan: ForwardingPlan,
    switch: str,
    destination: str | Packet,
    down: Iterable[tuple[str, int]] | None,
    choose: BucketChooser | None,
    branch: bool,
) -> list[list[tuple[str, int | None]]]:
    """Every path found, each as (node, the port it came in by) from ``switch`` (None)."""
    fabric = description.fabric
    ends = link_ends(fabric)
    packet = destination if isinstance(destination, Packet) else Packet(destination)
    ipv4_dst = packet.ipv4_dst
    if down is None:
        down_ends = {(x.a, x.a_port) for x in plan.failed_links}
        down_ends |= {(x.b, x.b_port) for x in plan.failed_links}
    else:
        down_ends = set(down)
    done: list[list[tuple[str, int | None]]] = []
    # Depth-first over (path so far, (node, port it arrived on) states visited); select
    # groups branch. A loop is a state seen twice: a packet may pass a switch twice when it
    # comes back by another port (a fast-failover detour: ToR -> agg -> other ToR).
    stack: list[tuple[list[str], list[tuple[str, int | None]]]] = [([switch], [(switch, None)])]
    while stack:
        path, states = stack.pop()
        node, in_port = states[-1]
        if node not in fabric.switches:
            if (
                description.addresses.get(node) is None
                or description.addresses[node].fabric_ip != ipv4_dst
            ):
                raise RoutingError(f"{ipv4_dst} ends at {node}, not at its GPU (path {path})")
            done.append(states)
            continue
        dpid = fabric.switches[node].dpid
        entry = (
            plan.lookup_packet(dpid, packet, in_port)
            if isinstance(destination, Packet)
            else plan.lookup(dpid, ipv4_dst)
        )
        if entry is None:
            raise RoutingError(f"{node} has no entry for {ipv4_dst} (path {path})")
        down_here = {port for name, port in down_ends if name == node}
        for port in _resolve_ports(plan.tables[dpid], entry.actions, down_here, choose, branch):
            if port == in_port:
                raise RoutingError(
                    f"{node} sends {ipv4_dst} back out of port {port}, the port it came in "
                    f"by: a switch drops that (path {path})"
                )
            link = ends.get((node, port))
            if link is None:
                raise RoutingError(f"{node} port {port} has no link")
            nxt = link.other(node)
            state = (nxt, link.port_of(nxt))
            if state in states:
                raise RoutingError(f"loop for {ipv4_dst}: {[*path, nxt]}")
            stack.append(([*path, nxt], [*states, state]))
    return done


def _resolve_ports(
    table: SwitchTable,
    actions: tuple[Action, ...],
    down: set[int],
    choose: BucketChooser | None,
    branch: bool,
    depth: int = 0,
) -> list[int]:
    """The output ports ``actions`` lead to (several only when ``branch`` over select groups).

    Without ``branch``, exactly one port or a RoutingError.
    """
    if depth > 4:
        raise RoutingError(f"{table.switch}: groups nest too deeply")
    ports: list[int] = []
    for action in actions:
        if isinstance(action, Output):
            ports.append(action.port)
        elif isinstance(action, Group):
            group = table.group(action.group_id)
            live = group.live_buckets(down)
            if not live:
                raise RoutingError(f"{table.switch} group {group.group_id}: no live bucket")
            if group.type is GroupType.FAST_FAILOVER or group.type is GroupType.INDIRECT:
                chosen = [live[0]]
            elif group.type is GroupType.SELECT and branch:
                chosen = live
            elif group.type is GroupType.SELECT:
                if len(live) == 1:
                    chosen = live
                elif choose is None:
                    raise RoutingError(
                        f"{table.switch} group {group.group_id} selects among {len(live)} "
                        "buckets by hash: pass choose= or use trace_all"
                    )
                else:
                    chosen = [choose(table.switch, group, live)]
            else:  # ALL: every bucket
                chosen = list(group.buckets)
            for bucket in chosen:
                ports += _resolve_ports(table, bucket.actions, down, choose, branch, depth + 1)
    if not branch and len(ports) != 1:
        raise RoutingError(f"{table.switch} outputs to {len(ports)} ports")
    if branch and not ports:
        raise RoutingError(f"{table.switch} outputs nowhere")
    return ports
