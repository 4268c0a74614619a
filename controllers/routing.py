"""Forwarding state as data: what each fabric switch should do with each destination.

Pure functions over a :class:`~topologies.description.FabricDescription` (no os-ken here, so
everything is unit-tested without a switch; docs/architecture.md: render, then check, then
start). The
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
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


# --- actions, matches, entries and groups ------------------------------------------------


@dataclass(frozen=True)
class SetField:
    """Rewrite a header field (OXM name as os-ken spells it: ``eth_src``, ``eth_dst``)."""

    field: str
    value: str


@dataclass(frozen=True)
class Output:
    """Send out of a port (model port number)."""

    port: int


@dataclass(frozen=True)
class Group:
    """Hand the packet to group ``group_id`` of the same switch (a :class:`GroupEntry`)."""

    group_id: int


Action = SetField | Output | Group

# IP protocol numbers the matches use.
IPPROTO_TCP = 6
IPPROTO_UDP = 17

# Match fields a FlowEntry may carry besides ipv4_dst, in OXM order (os-ken's spelling).
# Ports may be masked (``tcp_src_mask``): a packet matches if ``port & mask == value``.
MATCH_FIELDS = (
    "in_port",
    "ipv4_src",
    "ipv4_dst",
    "ip_proto",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
)
MASKABLE_FIELDS = ("tcp_src", "tcp_dst", "udp_src", "udp_dst")


@dataclass(frozen=True)
class FlowEntry:
    """One flow entry of table 0: match IPv4 packets, apply ``actions`` in order.

    The match is ``ipv4_dst`` (exact; every entry names one destination) plus, where not
    None: ``in_port`` (model port), ``ipv4_src`` (exact), ``ip_proto``, and the TCP/UDP
    ports, each with an optional mask (None = exact; a mask must be given with its value).
    A port match needs ``ip_proto`` (OpenFlow prerequisite: 6 for tcp_*, 17 for udp_*).

    ``key`` identifies the entry in the switch (OpenFlow: priority + match): a table holds
    one entry per key. The app installs every entry with the controller's cookie.
    """

    dpid: int
    switch: str
    ipv4_dst: str
    actions: tuple[Action, ...]
    priority: int = ROUTE_PRIORITY
    ipv4_src: str | None = None
    ip_proto: int | None = None
    tcp_src: int | None = None
    tcp_src_mask: int | None = None
    tcp_dst: int | None = None
    tcp_dst_mask: int | None = None
    udp_src: int | None = None
    udp_src_mask: int | None = None
    udp_dst: int | None = None
    udp_dst_mask: int | None = None
    in_port: int | None = None

    def __post_init__(self) -> None:
        for name in MASKABLE_FIELDS:
            value, mask = getattr(self, name), getattr(self, name + "_mask")
            if mask is not None and value is None:
                raise ValueError(f"{name}_mask without {name}")
            if value is not None:
                proto = IPPROTO_TCP if name.startswith("tcp") else IPPROTO_UDP
                if self.ip_proto != proto:
                    raise ValueError(f"matching {name} needs ip_proto={proto}")
                if mask is not None and value & ~mask & 0xFFFF:
                    raise ValueError(f"{name}={value:#x} has bits outside its mask {mask:#x}")
                if mask == 0xFFFF:  # canonical: a full mask is an exact match
                    object.__setattr__(self, name + "_mask", None)

    def match(self) -> dict[str, int | str | tuple[int, int]]:
        """The match as OXM fields besides ``eth_type`` (masked ports as (value, mask))."""
        fields: dict[str, int | str | tuple[int, int]] = {}
        for name in MATCH_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            mask = getattr(self, name + "_mask", None)
            fields[name] = value if mask is None else (value, mask)
        return fields

    @property
    def key(self) -> FlowKey:
        """What identifies the entry in the switch (priority and match): one per key."""
        return (self.priority, tuple(sorted(self.match().items())))

    @property
    def out_ports(self) -> tuple[int, ...]:
        return tuple(a.port for a in self.actions if isinstance(a, Output))

    @property
    def group_ids(self) -> tuple[int, ...]:
        return tuple(a.group_id for a in self.actions if isinstance(a, Group))

    def matches(self, packet: Packet, in_port: int | None = None) -> bool:
        """Whether ``packet`` arriving on ``in_port`` (model port) matches this entry."""
        if self.ipv4_dst != packet.ipv4_dst:
            return False
        if self.in_port is not None and self.in_port != in_port:
            return False
        if self.ipv4_src is not None and self.ipv4_src != packet.ipv4_src:
            return False
        if self.ip_proto is not None and self.ip_proto != packet.ip_proto:
            return False
        for name in MASKABLE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            port = packet.src_port if name.endswith("_src") else packet.dst_port
            mask = getattr(self, name + "_mask")
            if port is None or port & (0xFFFF if mask is None else mask) != value:
                return False
        return True


# (priority, sorted match items): FlowEntry.key.
FlowKey = tuple[int, tuple[tuple[str, Any], ...]]


@dataclass(frozen=True)
class Packet:
    """What the plan's matches look at: an IPv4 packet's five-tuple (ports None if not L4)."""

    ipv4_dst: str
    ipv4_src: str | None = None
    ip_proto: int | None = None
    src_port: int | None = None
    dst_port: int | None = None

    @classmethod
    def tcp(cls, src: str, dst: str, src_port: int, dst_port: int) -> Packet:
        return cls(dst, src, IPPROTO_TCP, src_port, dst_port)


class GroupType(str, Enum):
    """OpenFlow group types (values as users and files spell them)."""

    ALL = "all"
    SELECT = "select"
    INDIRECT = "indirect"
    FAST_FAILOVER = "fast_failover"


@dataclass(frozen=True)
class Bucket:
    """One bucket of a group.

    ``weight``: select groups only (relative share; the app sends it only for them).
    ``watch_port`` (model port): fast-failover groups use the first bucket whose watched port
    is live; Open vSwitch also skips a select group's bucket whose watched port is down, so
    a select group whose buckets watch their output ports fails over in the data plane too.
    """

    actions: tuple[Action, ...]
    weight: int = 1
    watch_port: int | None = None

    @property
    def out_ports(self) -> tuple[int, ...]:
        return tuple(a.port for a in self.actions if isinstance(a, Output))


# OXM payload sizes in bytes of the fields a selection method may hash (os-ken's names).
OXM_FIELD_BYTES = {
    "in_port": 4,
    "eth_type": 2,
    "ip_dscp": 1,
    "ip_ecn": 1,
    "ip_proto": 1,
    "ipv4_src": 4,
    "ipv4_dst": 4,
    "tcp_src": 2,
    "tcp_dst": 2,
    "udp_src": 2,
    "udp_dst": 2,
}
# The five-tuple, for TCP and UDP (Open vSwitch skips the fields whose prerequisites a
# packet does not meet), padded with two constant-per-flow fields (eth_type, ip_dscp) so the
# OXM list is a multiple of 4 bytes long: os-ken parses experimenter properties in 4-byte
# words and drops the whole group description reply otherwise (see SelectionMethod).
FIVE_TUPLE_FIELDS = (
    "eth_type",
    "ip_dscp",
    "ip_proto",
    "ipv4_src",
    "ipv4_dst",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
)


@dataclass(frozen=True)
class SelectionMethod:
    """How an Open vSwitch select group picks a bucket (OpenFlow 1.5 NTR extension).

    ``method="hash"``: a hash of ``fields`` (full masks), seeded with ``basis`` (OVS's
    ``selection_method_param``), then highest-random-weight over the live buckets (score
    ``hash(bucket_id, hash) * weight``): the same packet fields, basis and buckets give the
    same bucket on every run, and a dead bucket only moves its own flows. ``"dp_hash"``:
    the datapath's hash (OVS's default since 2.10; no fields allowed).

    ``fields`` are kept in canonical (sorted) order, so a group read back from a switch
    compares equal. The OXM list must be a multiple of 4 bytes long (each field is 4 bytes
    of header plus its payload): os-ken parses an experimenter property as 4-byte words.
    """

    method: str = "hash"
    fields: tuple[str, ...] = FIVE_TUPLE_FIELDS
    basis: int = 0

    def __post_init__(self) -> None:
        if self.method not in ("hash", "dp_hash"):
            raise ValueError(f"selection method {self.method!r}: expected hash or dp_hash")
        if self.method == "dp_hash" and self.fields:
            raise ValueError("selection method dp_hash takes no fields")
        unknown = [f for f in self.fields if f not in OXM_FIELD_BYTES]
        if unknown:
            raise ValueError(f"cannot hash on {unknown}; known: {sorted(OXM_FIELD_BYTES)}")
        if len(set(self.fields)) != len(self.fields):
            raise ValueError(f"repeated hash fields {self.fields}")
        if sum(4 + OXM_FIELD_BYTES[f] for f in self.fields) % 4:
            raise ValueError(
                f"hash fields {self.fields} make an OXM list that is not a multiple of 4 "
                "bytes (os-ken could not read the group back); add or drop a field"
            )
        if not 0 <= self.basis < 1 << 64:
            raise ValueError(f"basis {self.basis} is not a 64-bit unsigned integer")
        object.__setattr__(self, "fields", tuple(sorted(self.fields)))


@dataclass(frozen=True)
class GroupEntry:
    """One group of a switch's group table; flows reach it with a :class:`Group` action.

    ``selection`` applies to select groups only (None: the switch's default method).
    """

    dpid: int
    switch: str
    group_id: int
    type: GroupType
    buckets: tuple[Bucket, ...]
    selection: SelectionMethod | None = None

    def __post_init__(self) -> None:
        if not 0 < self.group_id <= MAX_GROUP_ID:
            raise ValueError(f"group id {self.group_id} outside 1..{MAX_GROUP_ID}")
        if self.selection is not None and self.type is not GroupType.SELECT:
            raise ValueError(f"group {self.group_id}: a selection method needs a select group")
        if self.type is GroupType.FAST_FAILOVER and any(b.watch_port is None for b in self.buckets):
            raise ValueError(f"group {self.group_id}: every fast-failover bucket watches a port")

    @property
    def key(self) -> int:
        return self.group_id

    def bucket_ids(self) -> list[int]:
        """OpenFlow 1.5 bucket ids: each bucket's first output port (model port), so that a
        next hop keeps its id when the controller re-renders the group without a failed
        one. Open vSwitch's ``hash`` selection scores each bucket with
        ``hash(bucket_id, flow hash)``: numbering by position would renumber the buckets
        after the removed one and move flows whose next hop is fine. Positions only where
        the buckets do not have distinct output ports."""
        firsts = [b.out_ports[0] if b.out_ports else -1 for b in self.buckets]
        if -1 in firsts or len(set(firsts)) != len(firsts):
            return list(range(len(self.buckets)))
        return firsts

    def live_buckets(self, down_ports: Iterable[int] = ()) -> list[Bucket]:
        """The buckets whose watched port (if any) is not in ``down_ports``, in order."""
        down = set(down_ports)
        return [b for b in self.buckets if b.watch_port is None or b.watch_port not in down]


# OpenFlow group ids above 0xffffff00 are reserved (OFPG_MAX).
MAX_GROUP_ID = 0xFFFFFF00


def stable_group_id(switch: str, content: object, taken: Mapping[int, object]) -> int:
    """A group id for ``content`` on ``switch`` that stays the same across renders.

    A BLAKE2b hash of (switch, content) in 1..2^24 (so that ids are short to read in
    ``ovs-ofctl dump-groups``), probing upward past ids ``taken`` by other content: the same
    next-hop set keeps its id when a failure changes other groups, so a re-render modifies
    or deletes only the groups that changed. Deterministic when callers allocate in a
    deterministic order.
    """
    digest = hashlib.blake2b(f"{switch}|{content!r}".encode(), digest_size=8).digest()
    gid = 1 + int.from_bytes(digest, "big") % (1 << 24)
    while gid in taken and taken[gid] != content:
        gid = gid % MAX_GROUP_ID + 1
    return gid


@dataclass(frozen=True)
class SwitchTable:
    """Everything the controller installs on one switch for a plan: flows and groups.

    The app installs groups before the flows that point at them and deletes them after.
    Every :class:`Group` action of a flow (or bucket) names a group of the same table.
    """

    dpid: int
    switch: str
    flows: tuple[FlowEntry, ...] = ()
    groups: tuple[GroupEntry, ...] = ()

    def group(self, group_id: int) -> GroupEntry:
        for entry in self.groups:
            if entry.group_id == group_id:
                return entry
        raise KeyError(f"{self.switch} has no group {group_id}")


@dataclass(frozen=True)
class ForwardingPlan:
    """Per-switch tables for every programmable switch (empty tables included).

    ``extra`` is free-form, JSON-serializable data a policy publishes with its plan (for
    example path-pinned's source-port layout); it is not installed anywhere.
    """

    policy: str
    tables: Mapping[int, SwitchTable]
    failed_links: frozenset[Link] = field(default_factory=frozenset)
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def table(self, dpid: int) -> SwitchTable:
        return self.tables[dpid]

    def flows(self) -> Iterable[FlowEntry]:
        for dpid in sorted(self.tables):
            yield from self.tables[dpid].flows

    def groups(self) -> Iterable[GroupEntry]:
        for dpid in sorted(self.tables):
            yield from self.tables[dpid].groups

    def lookup(self, dpid: int, ipv4_dst: str) -> FlowEntry | None:
        """The route entry ``dpid`` uses for ``ipv4_dst`` (highest priority), if any.

        Only entries that match on the destination alone count (the destination's default
        route): entries that also match ports or sources (path-pinned's source-port rules)
        need a whole packet, :meth:`lookup_packet`.
        """
        best: FlowEntry | None = None
        for entry in self.tables[dpid].flows:
            if (
                entry.ipv4_dst == ipv4_dst
                and len(entry.match()) == 1
                and (best is None or entry.priority > best.priority)
            ):
                best = entry
        return best

    def lookup_packet(
        self, dpid: int, packet: Packet, in_port: int | None = None
    ) -> FlowEntry | None:
        """The entry of ``dpid`` that ``packet`` arriving on ``in_port`` hits, if any."""
        best: FlowEntry | None = None
        for entry in self.tables[dpid].flows:
            if entry.matches(packet, in_port) and (best is None or entry.priority > best.priority):
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

    Raises :class:`RoutingError` on a loop, a missing entry or a port that leads nowhere.
    """
    paths = _trace(description, plan, switch, destination, down, choose, branch=False)
    return paths[0]


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
    return sorted(_trace(description, plan, switch, destination, down, None, branch=True))


def _trace(
    description: FabricDescription,
    plan: ForwardingPlan,
    switch: str,
    destination: str | Packet,
    down: Iterable[tuple[str, int]] | None,
    choose: BucketChooser | None,
    branch: bool,
) -> list[list[str]]:
    fabric = description.fabric
    ends = link_ends(fabric)
    packet = destination if isinstance(destination, Packet) else Packet(destination)
    ipv4_dst = packet.ipv4_dst
    if down is None:
        down_ends = {(x.a, x.a_port) for x in plan.failed_links}
        down_ends |= {(x.b, x.b_port) for x in plan.failed_links}
    else:
        down_ends = set(down)
    done: list[list[str]] = []
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
            done.append(path)
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
