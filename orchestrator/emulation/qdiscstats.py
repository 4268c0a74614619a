"""A network namespace's root qdiscs and their counters, read over rtnetlink.

What ``tc -s qdisc show`` prints, without a process: one ``RTM_GETQDISC`` dump on a
``NETLINK_ROUTE`` socket answers with every qdisc of the namespace the socket was *opened
in*, with its counters (``TCA_STATS2``: bytes and packets sent, packets dropped, bytes
and packets held). The egress queues of the GPUs' NIC ports live in the GPUs' own
namespaces, one per GPU: one ``tc`` per GPU per half second costs about 4.5 ms each (10-20 %
of a core on a 16-GPU fabric, measured), where a socket opened inside each namespace once
(:func:`orchestrator.emulation.probe.opened_in`) and asked from the sampling thread costs
a system call and some parsing.

Only the netlink messages this needs are spoken (``linux/rtnetlink.h``,
``linux/gen_stats.h``); the parsing is separate from the socket so that it can be
unit-tested on bytes.
"""

from __future__ import annotations

import errno
import itertools
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

NETLINK_ROUTE = 0
RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300  # NLM_F_ROOT | NLM_F_MATCH
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCA_KIND = 1
TCA_STATS2 = 7
TCA_STATS_BASIC = 1
TCA_STATS_QUEUE = 3
TC_H_ROOT = 0xFFFFFFFF
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
_TCMSG = struct.Struct("=BxxxiIII")  # tcmsg: family, ifindex, handle, parent, info
_ATTR = struct.Struct("=HH")  # rtattr: length, type
_BASIC = struct.Struct("=QI")  # gnet_stats_basic: bytes, packets
_QUEUE = struct.Struct("=IIIII")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits

_sequence = itertools.count(1)


@dataclass(frozen=True)
class QdiscStats:
    """One qdisc's counters: cumulative bytes and packets it sent and packets it dropped,
    and what it held when asked (``backlog`` bytes, ``qlen`` packets)."""

    ifindex: int
    handle: int
    parent: int
    kind: str
    bytes: int
    packets: int
    drops: int
    backlog: int
    qlen: int

    @property
    def root(self) -> bool:
        return self.parent == TC_H_ROOT


def dump_request(sequence: int) -> bytes:
    """An ``RTM_GETQDISC`` dump request: every qdisc of every interface."""
    body = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return _HEADER.pack(_HEADER.size + len(body), RTM_GETQDISC, flags, sequence, 0) + body


def _align(n: int) -> int:
    return (n + 3) & ~3


def _attributes(data: bytes, offset: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of each rtattr in ``data[offset:end]``."""
    while offset + _ATTR.size <= end:
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > end:
            return  # malformed: stop rather than read past it
        yield kind & NLA_TYPE_MASK, data[offset + _ATTR.size : offset + length]
        offset += _align(length)


def parse_qdisc(message: bytes) -> QdiscStats:
    """One ``RTM_NEWQDISC`` message's body (after the netlink header)."""
    _, ifindex, handle, parent, _ = _TCMSG.unpack_from(message, 0)
    kind = ""
    sent_bytes = packets = drops = backlog = qlen = 0
    for attr, payload in _attributes(message, _TCMSG.size, len(message)):
        if attr == TCA_KIND:
            kind = payload.split(b"\0", 1)[0].decode(errors="replace")
        elif attr == TCA_STATS2:
            for stat, value in _attributes(payload, 0, len(payload)):
                if stat == TCA_STATS_BASIC and len(value) >= _BASIC.size:
                    sent_bytes, packets = _BASIC.unpack_from(value, 0)
                elif stat == TCA_STATS_QUEUE and len(value) >= _QUEUE.size:
                    qlen, backlog, drops, _, _ = _QUEUE.unpack_from(value, 0)
    return QdiscStats(ifindex, handle, parent, kind, sent_bytes, packets, drops, backlog, qlen)


def parse_messages(data: bytes, sequence: int) -> tuple[list[QdiscStats], bool]:
    """The qdiscs in one datagram of a dump's answer to ``sequence``, and whether the dump
    ended with it. An error message raises OSError with its errno."""
    out: list[QdiscStats] = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, _, seq, _ = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            break
        body = data[offset + _HEADER.size : offset + length]
        offset += _align(length)
        if seq != sequence:
            continue  # an answer to an earlier request that timed out
        if kind == NLMSG_DONE:
            return out, True
        if kind == NLMSG_ERROR:
            (error,) = struct.unpack_from("=i", body, 0)
            if error:
                raise OSError(-error, f"RTM_GETQDISC: {errno.errorcode.get(-error, str(-error))}")
            return out, True
        if kind == RTM_NEWQDISC:
            out.append(parse_qdisc(body))
    return out, False


def open_socket() -> socket.socket:
    """A rtnetlink socket in the calling thread's namespace (where it stays)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        sock.settimeout(2.0)
    except BaseException:
        sock.close()
        raise
    return sock


def dump(sock: socket.socket) -> list[QdiscStats]:
    """Every qdisc of the namespace ``sock`` was opened in (OSError: a failed or timed-out
    dump)."""
    sequence = next(_sequence) & 0xFFFFFFFF
    sock.send(dump_request(sequence))
    out: list[QdiscStats] = []
    while True:
        found, done = parse_messages(sock.recv(1 << 16), sequence)
        out += found
        if done:
            return out
