"""The controller's forwarding plan as data: what each fabric switch should hold.

A policy (:mod:`controllers.policies`) renders a :class:`ForwardingPlan`: one
:class:`SwitchTable` per programmable switch, made of :class:`FlowEntry` (match an IPv4
destination, maybe more, then apply actions) and :class:`GroupEntry` (buckets of actions that
flows reach with a :class:`Group` action). Plain frozen dataclasses and no os-ken, so that a
plan is rendered, compared and checked in unit tests before anything touches a switch (render,
then check, then start). The os-ken app (:mod:`controllers.app`) only diffs plans and
translates them into OpenFlow messages (:mod:`controllers.openflow`); how plans are computed
lives in :mod:`controllers.routing`, how they are followed hop by hop in
:mod:`controllers.tracer`.

Ports in a plan are the model's port numbers (``topologies.model``);
:class:`~controllers.ports.PortMap` translates them to OpenFlow port numbers when the emulation
had to use others.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from topologies.model import Link

# OpenFlow priorities of the controller's entries (table 0).
ROUTE_PRIORITY = 100
ARP_PRIORITY = 10
MISS_PRIORITY = 0

# Entries the orchestrator's fault injection installs (a blackhole: orchestrator/emulation/
# faults.py) carry a cookie of this family, FAULT_COOKIE | the fault's id, above every
# policy's priority. The controller leaves them alone when it finds them in a switch (a
# restart, a policy change), so that a fault lasts until the orchestrator removes it;
# "fa17" reads "fault".
FAULT_COOKIE = 0xA5A5_FA17_0000_0000
FAULT_COOKIE_MASK = 0xFFFF_FFFF_0000_0000
FAULT_PRIORITY = 1000


def is_fault_cookie(cookie: int) -> bool:
    """Whether an entry with this cookie was installed by a fault (see FAULT_COOKIE)."""
    return cookie & FAULT_COOKIE_MASK == FAULT_COOKIE


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
