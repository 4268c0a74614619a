"""Which bucket an Open vSwitch select group picks for a packet, computed outside the switch.

The ECMP policies install their select groups with Open vSwitch's selection method ``hash``
(controllers.policies.ecmp): the switch hashes the listed fields of the packet, seeded with
the group's ``selection_method_param`` (the basis), and takes the live bucket with the
highest ``(hash(bucket_id, flow hash) & 0xffff) * weight``, the last of equal scores
(ofproto-dpif-xlate.c ``pick_hash_fields_select_group`` and ``group_best_live_bucket``).
Nothing in that is random: the same five-tuple, basis and bucket ids give the same bucket
on every run and every machine. So a forecast need not draw ECMP's outcome when it knows
the connections' five-tuples: this module computes it.

The hash is Open vSwitch's ``lib/hash.h`` in its portable form (murmur3's mixing steps;
a build for CPUs with SSE 4.2 would use CRC32 instructions instead, and Debian's and
Ubuntu's packages do not). The fields are hashed one after the other in Open vSwitch's
field order (its ``mf_field_id`` enumeration, not the order the group lists them), each
value in network byte order through ``hash_bytes``; a field whose prerequisites the packet
does not meet (UDP ports on a TCP packet) is skipped.

Checked against the switches: of the ECMP connections whose paths four runs traced
through Open vSwitch 3.1.0 (``ofproto/trace``; fat-tree-small, hpn-like,
astral-oversubscribed, rail-only-small), 1,224 of 1,224 took the path this computes
(docs/forecast.md, "ECMP's hash, reproduced"); tests/integration/test_path_trace.py
compares it with the switches on every run of the suite.

A group whose fields include one this module does not reproduce (``in_port``: the packet
model has no ingress port) or whose method is ``dp_hash`` (the datapath's own hash) has no
computed choice: :func:`pick` returns None and the caller draws.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from controllers.plan import IPPROTO_TCP, Bucket, GroupEntry, Packet

_MASK = 0xFFFFFFFF
_IPPROTO_UDP = 17
_ETH_TYPE_IPV4 = 0x0800

#: the fields reproduced, in Open vSwitch's field order (meta-flow.h's enumeration:
#: eth_type, ipv4_src, ipv4_dst, ip_proto, ip_dscp (its shifted OXM form), ip_ecn,
#: tcp_src, tcp_dst, udp_src, udp_dst)
FIELD_ORDER = (
    "eth_type",
    "ipv4_src",
    "ipv4_dst",
    "ip_proto",
    "ip_dscp",
    "ip_ecn",
    "tcp_src",
    "tcp_dst",
    "udp_src",
    "udp_dst",
)


def _rotate(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _MASK


def hash_add(hash_: int, data: int) -> int:
    """``hash_add`` (``mhash_add``): one 32-bit word mixed in; a zero word mixes nothing
    but still turns the state."""
    if data:
        data = (data * 0xCC9E2D51) & _MASK
        data = _rotate(data, 15)
        data = (data * 0x1B873593) & _MASK
        hash_ ^= data
    hash_ = _rotate(hash_, 13)
    return (hash_ * 5 + 0xE6546B64) & _MASK


def hash_finish(hash_: int, final: int) -> int:
    """``hash_finish`` (``mhash_finish`` of the state xor ``final``)."""
    hash_ ^= final & _MASK
    hash_ ^= hash_ >> 16
    hash_ = (hash_ * 0x85EBCA6B) & _MASK
    hash_ ^= hash_ >> 13
    hash_ = (hash_ * 0xC2B2AE35) & _MASK
    return hash_ ^ (hash_ >> 16)


def hash_bytes(data: bytes, basis: int) -> int:
    """``hash_bytes``: 32-bit words read in the host's (little-endian) order, the tail
    zero-padded, finished with the length."""
    hash_ = basis
    for i in range(0, len(data) - len(data) % 4, 4):
        hash_ = hash_add(hash_, int.from_bytes(data[i : i + 4], "little"))
    tail = data[len(data) - len(data) % 4 :]
    if tail:
        hash_ = hash_add(hash_, int.from_bytes(tail.ljust(4, b"\0"), "little"))
    return hash_finish(hash_, len(data))


def hash_uint64(value: int) -> int:
    """``hash_uint64``: the basis a group's 64-bit ``selection_method_param`` seeds."""
    return hash_finish(hash_add(hash_add(0, value & _MASK), (value >> 32) & _MASK), 8)


def hash_int(value: int, basis: int) -> int:
    """``hash_int`` (``hash_2words``)."""
    return hash_finish(hash_add(hash_add(value & _MASK, 0), basis), 8)


def _value(field: str, packet: Packet) -> bytes | None:
    """``field`` of ``packet`` in network byte order; None where the packet does not meet
    the field's prerequisites (Open vSwitch skips it)."""
    proto = packet.ip_proto
    if field == "eth_type":
        return _ETH_TYPE_IPV4.to_bytes(2, "big")
    if field in ("ipv4_src", "ipv4_dst"):
        address = packet.ipv4_src if field == "ipv4_src" else packet.ipv4_dst
        return ipaddress.IPv4Address(address or "0.0.0.0").packed
    if field == "ip_proto":
        return bytes([proto or 0])
    if field in ("ip_dscp", "ip_ecn"):
        return b"\0"  # the workers' and the probes' traffic is unmarked
    wanted = IPPROTO_TCP if field.startswith("tcp_") else _IPPROTO_UDP
    if proto != wanted:
        return None
    port = packet.src_port if field.endswith("_src") else packet.dst_port
    return (port or 0).to_bytes(2, "big")


def flow_hash(packet: Packet, fields: Sequence[str], param: int) -> int:
    """The hash Open vSwitch computes of ``packet`` for a group hashing ``fields`` (all of
    :data:`FIELD_ORDER`: :func:`reproducible`) with ``selection_method_param`` ``param``."""
    basis = hash_uint64(param)
    for field in sorted(set(fields), key=FIELD_ORDER.index):
        value = _value(field, packet)
        if value is not None:
            basis = hash_bytes(value, basis)
    return basis


def pick(group: GroupEntry, live: Sequence[Bucket], packet: Packet) -> Bucket | None:
    """The bucket of ``live`` (``group``'s buckets the switch considers alive) that Open
    vSwitch picks for ``packet``, or None where its choice is not reproduced here (the
    ``dp_hash`` method, a field this module does not know)."""
    selection = group.selection
    if selection is None or not reproducible(group) or not live:
        return None
    hashed = flow_hash(packet, selection.fields, selection.basis)
    ids = dict(zip(group.buckets, group.bucket_ids(), strict=True))
    best: Bucket | None = None
    best_score = -1
    for bucket in group.buckets:  # in the group's order: the last of equal scores wins
        if bucket in live:
            score = (hash_int(ids[bucket], hashed) & 0xFFFF) * bucket.weight
            if score >= best_score:
                best, best_score = bucket, score
    return best


def reproducible(group: GroupEntry) -> bool:
    """Whether :func:`pick` computes ``group``'s choice (for any packet)."""
    selection = group.selection
    return (
        selection is not None
        and selection.method == "hash"
        and all(f in FIELD_ORDER for f in selection.fields)
    )
