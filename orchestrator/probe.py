"""Fan-out ICMP echo from inside one emulated GPU: ``python -m orchestrator.probe``.

Readiness needs every GPU to reach every other GPU (fabric addresses, through every NIC
port) and its server-mates (NVLink addresses). Forking one ``ping`` per pair is thousands of
processes at 64 GPUs; this sends all echoes of one GPU from one process over raw sockets
and resends the unanswered ones until each is answered or the deadline passes.

Input (stdin, JSON): ``[{"target": "10.0.1.1", "dev": "p0s0g0-eth1"}, ...]``; ``dev`` binds
the request to one port (SO_BINDTODEVICE), so a dual-ToR GPU can test each NIC port; the
reply may come back on either port, so replies are read from one unbound socket.
Output (stdout, JSON): the same list with ``"rtt"`` (seconds) or ``null``.

Standard library only: it runs in the GPU's namespace and must start fast.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import struct
import sys
import time
from typing import Any

ICMP_ECHO_REQUEST = 8
ICMP_ECHO_REPLY = 0
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
SOL_RAW = 255  # <linux/socket.h>
ICMP_FILTER = 1  # <linux/icmp.h>: a bit mask of ICMP types the raw socket drops


def checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes = b"astral-probe") -> bytes:
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    csum = checksum(header + payload)
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, csum, ident, seq) + payload


def parse_reply(packet: bytes) -> tuple[str, int, int] | None:
    """(source address, identifier, sequence) of an echo reply, else None."""
    if len(packet) < 20:
        return None
    ihl = (packet[0] & 0x0F) * 4
    icmp = packet[ihl : ihl + 8]
    if len(icmp) < 8:
        return None
    kind, _code, _csum, ident, seq = struct.unpack("!BBHHH", icmp)
    if kind != ICMP_ECHO_REPLY:
        return None
    return socket.inet_ntoa(packet[12:16]), ident, seq


def _only_replies(sock: socket.socket, replies: bool) -> None:
    """Let the raw socket receive echo replies only (or nothing at all): every raw ICMP
    socket gets a copy of every ICMP packet of the namespace, including the echo requests
    other GPUs' probes send here, and a full receive buffer drops replies."""
    allowed = 1 << ICMP_ECHO_REPLY if replies else 0
    sock.setsockopt(SOL_RAW, ICMP_FILTER, struct.pack("I", ~allowed & 0xFFFFFFFF))


def probe(
    targets: list[dict[str, Any]],
    timeout: float = 3.0,
    interval: float = 0.3,
    rate: float | None = None,
) -> list[dict[str, Any]]:
    """Echo every target; resend an unanswered one after ``interval``, doubling it each time
    (at most 1 s), until ``timeout``; send at most ``rate`` echoes per second.

    Pacing and back-off matter: every GPU probes every other at once, and Open vSwitch's
    userspace datapath drops (uncounted) what arrives faster than it forwards: at 64 GPUs an
    unpaced first round lost nine echoes in ten.
    """
    ident = os.getpid() & 0xFFFF
    receiver = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    _only_replies(receiver, True)
    try:
        receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
    except OSError:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    senders: dict[str | None, socket.socket] = {None: receiver}
    try:
        for item in targets:
            dev = item.get("dev")
            if dev is not None and dev not in senders:
                sender = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
                _only_replies(sender, False)
                sender.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, dev.encode() + b"\0")
                senders[dev] = sender
        pending = {seq: item for seq, item in enumerate(targets, start=1)}
        due = dict.fromkeys(pending, 0.0)  # when each may be (re)sent
        backoff = dict.fromkeys(pending, interval)
        sent: dict[int, float] = {}
        rtts: dict[int, float] = {}
        gap = 1.0 / rate if rate else 0.0
        start = time.monotonic()
        next_send = start
        while pending and time.monotonic() - start < timeout:
            now = time.monotonic()
            for seq in [s for s in pending if due[s] <= now - start]:
                if now < next_send:
                    break
                item = pending[seq]
                try:
                    senders[item.get("dev")].sendto(
                        echo_request(ident, seq & 0xFFFF), (item["target"], 0)
                    )
                    sent.setdefault(seq, now)
                except OSError:
                    pass  # no route yet (port down): counts as unanswered
                due[seq] = now - start + backoff[seq]
                backoff[seq] = min(1.0, backoff[seq] * 2)
                next_send = max(next_send + gap, now - 0.05) if gap else now
            soonest = min((due[s] for s in pending), default=0.0) + start
            wake = max(soonest, next_send) if gap else soonest
            wait = max(0.0, min(wake, start + timeout) - time.monotonic())
            readable, _, _ = select.select([receiver], [], [], min(wait, 0.05) if gap else wait)
            if not readable:
                continue
            while True:
                try:
                    packet = receiver.recv(2048, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                reply = parse_reply(packet)
                if reply is None or reply[1] != ident:
                    continue
                source, _, seq = reply
                answered = pending.get(seq)
                if answered is not None and answered["target"] == source:
                    rtts[seq] = time.monotonic() - sent.get(seq, start)
                    del pending[seq]
        return [{**item, "rtt": rtts.get(seq)} for seq, item in enumerate(targets, start=1)]
    finally:
        for sock in senders.values():
            sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.probe")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=0.3)
    parser.add_argument("--rate", type=float, default=None, help="echoes per second at most")
    args = parser.parse_args(argv)
    targets = json.load(sys.stdin)
    json.dump(probe(targets, args.timeout, args.interval, args.rate), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
