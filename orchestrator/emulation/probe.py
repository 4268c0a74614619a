"""Fan-out ICMP echo across many network namespaces from one process, paced.

Readiness needs every GPU to reach every other GPU (fabric addresses, through every NIC
port) and its server-mates (NVLink addresses): 8,512 echoes at 64 GPUs. One ``ping`` per
pair would be thousands of processes, one probe process per GPU still 64 Python start-ups
(most of a 13 s readiness check on 2 cores, and 0.8 GB at once, measured). Instead the raw
sockets are *opened inside* each GPU's namespace by a helper thread that enters it
(setns(2); a socket stays in the namespace it was created in), and all of them are driven
from one select loop in the calling thread, which never changes namespace.

Per namespace: one unbound receiver (ICMP_FILTER lets only echo replies in: every raw ICMP
socket gets a copy of every ICMP packet, including the echo requests other GPUs send here)
and one sender per device the echoes are bound to (SO_BINDTODEVICE, so a dual-ToR GPU tests
each NIC port; the reply may come back on either port, hence the separate receiver).

All namespaces together send at most ``rate`` echoes per second, round-robin, and resend an
unanswered echo after 0.3 s, doubling up to 1 s: Open vSwitch's userspace datapath drops,
without counting, what arrives faster than it forwards (64 GPUs probing unpaced lost nine
echoes in ten).

``python -m orchestrator.emulation.probe`` probes from the current namespace (stdin: JSON list of
``{"target", "dev"}``; stdout: the same with ``"rtt"`` in seconds or null).
"""

from __future__ import annotations

import argparse
import ctypes
import heapq
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

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


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

K = TypeVar("K")
T = TypeVar("T")
Echo = Mapping[str, Any]  # {"target": address, "dev": interface or None}


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns: {os.strerror(errno)}")


def _only_replies(sock: socket.socket, replies: bool) -> None:
    """Let a raw ICMP socket receive echo replies only (or nothing at all)."""
    allowed = 1 << ICMP_ECHO_REPLY if replies else 0
    sock.setsockopt(SOL_RAW, ICMP_FILTER, struct.pack("I", ~allowed & 0xFFFFFFFF))


class _Sockets:
    """One namespace's receiver and per-device senders."""

    def __init__(self, devs: set[str | None]) -> None:
        self.receiver = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        self.senders: dict[str | None, socket.socket] = {None: self.receiver}
        try:
            _only_replies(self.receiver, True)
            try:
                self.receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
            except OSError:
                self.receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            for dev in devs:
                if dev is None:
                    continue
                sender = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
                self.senders[dev] = sender
                _only_replies(sender, False)
                sender.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, dev.encode() + b"\0")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for sock in self.senders.values():
            sock.close()


def opened_in(
    namespaces: Mapping[K, str | None], make: Callable[[K], T], close: Callable[[T], None]
) -> dict[K, T]:
    """``make(key)`` called inside each namespace (key -> its /proc/PID/ns/net, or None for
    ours) by a helper thread that enters them in turn: what it makes (sockets) stays in the
    namespace it was made in, and the calling thread never changes namespace. On a failure
    what was made is closed and the error raised here."""
    opened: dict[K, T] = {}
    failure: list[BaseException] = []

    def work() -> None:
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            for key, path in namespaces.items():
                if path is None:
                    _setns(home)
                else:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        _setns(fd)
                    finally:
                        os.close(fd)
                opened[key] = make(key)
        except BaseException as err:  # handed to the calling thread
            failure.append(err)
        finally:
            try:
                _setns(home)  # the thread ends anyway; be tidy
            finally:
                os.close(home)

    thread = threading.Thread(target=work, name="probe-setns")
    thread.start()
    thread.join()
    if failure:
        for made in opened.values():
            close(made)
        raise failure[0]
    return opened


def _open(specs: Mapping[str, tuple[str | None, set[str | None]]]) -> dict[str, _Sockets]:
    """Sockets per namespace (name -> (its /proc/PID/ns/net or None for ours, devices))."""
    return opened_in(
        {name: path for name, (path, _) in specs.items()},
        lambda name: _Sockets(specs[name][1]),
        _Sockets.close,
    )


def probe_namespaces(
    echoes: Mapping[str, Sequence[Echo]],
    netns: Mapping[str, str | None],
    timeout: float = 3.0,
    rate: float | None = None,
    interval: float = 0.3,
) -> dict[str, list[float | None]]:
    """Echo every target of every namespace; per namespace, the round-trip time of each
    echo in order (None: unanswered by ``timeout``). ``netns`` maps a namespace's name to
    its ``/proc/<pid>/ns/net`` (None: this process's namespace)."""
    names = [name for name, items in echoes.items() if items]
    sockets = _open({n: (netns.get(n), {e.get("dev") for e in echoes[n]}) for n in names})
    try:
        return _loop(echoes, names, sockets, timeout, rate, interval)
    finally:
        for entry in sockets.values():
            entry.close()


def _loop(
    echoes: Mapping[str, Sequence[Echo]],
    names: list[str],
    sockets: dict[str, _Sockets],
    timeout: float,
    rate: float | None,
    interval: float,
) -> dict[str, list[float | None]]:
    base = os.getpid()
    ident = {name: (base + i) & 0xFFFF for i, name in enumerate(names)}
    by_fd = {sockets[name].receiver.fileno(): name for name in names}
    # Due echoes in a heap of (due, order, namespace, seq); the first round goes round-robin
    # over namespaces, so that every GPU's echoes spread over the round.
    heap: list[tuple[float, int, str, int]] = []
    longest = max((len(echoes[n]) for n in names), default=0)
    for i in range(longest):
        heap += [(0.0, len(heap), n, i + 1) for n in names if i < len(echoes[n])]
    heapq.heapify(heap)
    pending = {(name, seq) for _, _, name, seq in heap}
    backoff = dict.fromkeys(pending, interval)
    sent: dict[tuple[str, int], float] = {}
    rtts: dict[tuple[str, int], float] = {}
    gap = 1.0 / rate if rate else 0.0
    start = time.monotonic()
    next_send = start
    receivers = [sockets[n].receiver for n in names]
    counter = len(heap)
    while pending and time.monotonic() - start < timeout:
        now = time.monotonic()
        while heap and heap[0][0] <= now - start and (not gap or now >= next_send):
            _, _, name, seq = heapq.heappop(heap)
            key = (name, seq)
            if key not in pending:
                continue  # answered meanwhile
            echo = echoes[name][seq - 1]
            try:
                sockets[name].senders[echo.get("dev")].sendto(
                    echo_request(ident[name], seq & 0xFFFF), (echo["target"], 0)
                )
                sent.setdefault(key, now)
            except OSError:
                pass  # no route yet (port down): counts as unanswered
            counter += 1
            heapq.heappush(heap, (now - start + backoff[key], counter, name, seq))
            backoff[key] = min(1.0, backoff[key] * 2)
            if gap:
                next_send = max(next_send + gap, now - 0.05)
        soonest = start + heap[0][0] if heap else start + timeout
        wake = max(soonest, next_send) if gap else soonest
        wait = max(0.0, min(wake, start + timeout) - time.monotonic())
        readable, _, _ = select.select(receivers, [], [], wait)
        for sock in readable:
            name = by_fd[sock.fileno()]
            while True:
                try:
                    packet = sock.recv(2048, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                reply = parse_reply(packet)
                if reply is None or reply[1] != ident[name]:
                    continue
                source, _, seq = reply
                key = (name, seq)
                if key in pending and echoes[name][seq - 1]["target"] == source:
                    rtts[key] = time.monotonic() - sent.get(key, start)
                    pending.discard(key)
    return {
        name: [rtts.get((name, seq)) for seq in range(1, len(echoes[name]) + 1)] for name in echoes
    }


def probe(
    targets: Sequence[Echo],
    timeout: float = 3.0,
    interval: float = 0.3,
    rate: float | None = None,
) -> list[dict[str, Any]]:
    """:func:`probe_namespaces` from this process's own namespace."""
    rtts = probe_namespaces({"": targets}, {"": None}, timeout, rate, interval)[""]
    return [{**echo, "rtt": rtt} for echo, rtt in zip(targets, rtts, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.emulation.probe")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--interval", type=float, default=0.3)
    parser.add_argument("--rate", type=float, default=None, help="echoes per second at most")
    args = parser.parse_args(argv)
    targets = json.load(sys.stdin)
    json.dump(probe(targets, args.timeout, args.interval, args.rate), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
