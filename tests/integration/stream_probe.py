"""Traffic for the controller's integration tests, run inside GPU namespaces (``host.popen``).

    stream_probe.py udp-recv  --bind IP --port P --duration S       # prints a JSON report
    stream_probe.py udp-send  --src IP --dst IP --port P --rate PPS --duration S [--sport N]
    stream_probe.py udp-spray --src IP --dst IP --port P --sports A-B [--packets N]
    stream_probe.py tcp-recv  --bind IP --port P --duration S [--bytes B]  # until B arrived
    stream_probe.py tcp-send  --src IP --dst IP --port P --sport N --bytes B | --duration S
                              [--rate BYTES_PER_S]

Receivers print one JSON object: packets (UDP) or bytes (TCP), the first and last arrival
(time.monotonic of this namespace = the machine's), the longest gap between consecutive
arrivals and when it started, and (UDP) how many sequence numbers never arrived. A sender
paces itself; the UDP payload carries a sequence number.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import sys
import time

SEQ = struct.Struct("!Q")


class Gaps:
    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.max_gap = 0.0
        self.gap_at: float | None = None

    def arrived(self, now: float) -> None:
        if self.first is None:
            self.first = now
        elif self.last is not None and now - self.last > self.max_gap:
            self.max_gap = now - self.last
            self.gap_at = self.last
        self.last = now

    def report(self, **extra: object) -> dict[str, object]:
        return {
            "first": self.first,
            "last": self.last,
            "max_gap": self.max_gap,
            "gap_at": self.gap_at,
            **extra,
        }


def udp_recv(args: argparse.Namespace) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
    sock.bind((args.bind, args.port))
    sock.settimeout(0.2)
    gaps = Gaps()
    seen: set[int] = set()
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline:
        try:
            data = sock.recv(2048)
        except TimeoutError:
            continue
        gaps.arrived(time.monotonic())
        if len(data) >= SEQ.size:
            seen.add(SEQ.unpack_from(data)[0])
    top = max(seen, default=-1)
    return gaps.report(packets=len(seen), lost=top + 1 - len(seen))


def udp_send(args: argparse.Namespace) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.src, args.sport))
    interval = 1.0 / args.rate
    start = time.monotonic()
    sent = 0
    while True:
        now = time.monotonic()
        if now - start >= args.duration:
            break
        due = start + sent * interval
        if now < due:
            time.sleep(due - now)
        # No route for a moment (the host's NIC went down): keep the pace.
        with contextlib.suppress(OSError):
            sock.sendto(SEQ.pack(sent) + b"x" * 56, (args.dst, args.port))
        sent += 1
    return {"sent": sent}


def udp_spray(args: argparse.Namespace) -> dict[str, object]:
    low, high = (int(x) for x in args.sports.split("-"))
    for sport in range(low, high + 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((args.src, sport))
        for n in range(args.packets):
            sock.sendto(SEQ.pack(n) + b"y" * 56, (args.dst, args.port))
        sock.close()
    return {"flows": high - low + 1}


def tcp_recv(args: argparse.Namespace) -> dict[str, object]:
    import selectors

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((args.bind, args.port))
    server.listen(64)
    server.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    gaps = Gaps()
    total = 0
    per_peer: dict[str, int] = {}
    deadline = time.monotonic() + args.duration
    while time.monotonic() < deadline and not (args.bytes and total >= args.bytes):
        for key, _ in selector.select(timeout=0.1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is server:
                conn, _addr = server.accept()
                conn.setblocking(False)
                selector.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                continue
            gaps.arrived(time.monotonic())
            total += len(data)
            host, port = sock.getpeername()
            peer = f"{host}:{port}"
            per_peer[peer] = per_peer.get(peer, 0) + len(data)
    return gaps.report(bytes=total, peers=per_peer)


def tcp_send(args: argparse.Namespace) -> dict[str, object]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.src, args.sport))
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.connect((args.dst, args.port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            sock.close()
            time.sleep(0.1)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((args.src, args.sport))
    chunk = b"z" * 16384
    sent = 0
    start = time.monotonic()
    while True:
        now = time.monotonic()
        if args.bytes and sent >= args.bytes:
            break
        if args.duration and now - start >= args.duration:
            break
        if args.rate:
            due = start + sent / args.rate
            if now < due:
                time.sleep(due - now)
        size = len(chunk) if not args.bytes else min(len(chunk), args.bytes - sent)
        sock.sendall(chunk[:size])
        sent += size
    sock.close()
    return {"sent": sent}


def main() -> int:
    modes = {
        "udp-recv": udp_recv,
        "udp-send": udp_send,
        "udp-spray": udp_spray,
        "tcp-recv": tcp_recv,
        "tcp-send": tcp_send,
    }
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=sorted(modes))
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--src", default="0.0.0.0")
    parser.add_argument("--dst")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sport", type=int, default=0)
    parser.add_argument("--sports", default="20000-20063")
    parser.add_argument("--packets", type=int, default=3)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--duration", type=float, default=0.0)
    parser.add_argument("--bytes", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(modes[args.mode](args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
