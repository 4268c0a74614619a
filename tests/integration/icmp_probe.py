"""Ping many destinations out of one given interface; print the ones that did not answer.

    python icmp_probe.py --dev p0s0g0-eth1 --src 10.0.0.1 10.0.0.2 10.1.0.1 ...

Run inside a GPU's namespace (``host.pexec``). Why not ``ping -I DEV``: that binds the socket
to the device, so a reply that comes back over the GPU's *other* NIC port (the destination
hashes its reply onto either port) is never seen, and half the pairs of a dual-ToR fabric
look unreachable. Here the egress port is chosen per packet (IP_PKTINFO) and the raw socket
hears replies from every port.

Output: one JSON list of the destinations without a reply; exit status 0 either way.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import time

IP_PKTINFO = 8  # <linux/in.h>; socket.IP_PKTINFO is missing on some Python builds
ECHO_REQUEST, ECHO_REPLY = 8, 0


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int) -> bytes:
    payload = b"astral-probe" + struct.pack("!d", time.time())
    header = struct.pack("!BBHHH", ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ECHO_REQUEST, 0, checksum(header + payload), ident, seq) + payload


def probe(dev: str, src: str, destinations: list[str], tries: int, wait: float) -> list[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = os.getpid() & 0xFFFF
    pktinfo = struct.pack(
        "I4s4s", socket.if_nametoindex(dev), socket.inet_aton(src), socket.inet_aton("0.0.0.0")
    )
    pending = {seq: dst for seq, dst in enumerate(destinations)}
    for _ in range(tries):
        if not pending:
            break
        for seq, dst in pending.items():
            sock.sendmsg(
                [echo_request(ident, seq)], [(socket.IPPROTO_IP, IP_PKTINFO, pktinfo)], 0, (dst, 0)
            )
        deadline = time.monotonic() + wait
        while pending and (left := deadline - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            packet, (sender, _port) = sock.recvfrom(2048)
            ihl = (packet[0] & 0x0F) * 4
            kind, _code, _sum, rid, seq = struct.unpack("!BBHHH", packet[ihl : ihl + 8])
            if kind == ECHO_REPLY and rid == ident and pending.get(seq) == sender:
                del pending[seq]
    return sorted(pending.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dev", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--wait", type=float, default=1.0, help="seconds per try")
    parser.add_argument("destinations", nargs="+")
    args = parser.parse_args()
    print(json.dumps(probe(args.dev, args.src, args.destinations, args.tries, args.wait)))


if __name__ == "__main__":
    main()
