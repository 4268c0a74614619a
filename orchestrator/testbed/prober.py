"""The probe mesh's sender: small TCP messages on chosen paths, and what the kernels saw.

A collective's traffic crosses some links of a fabric and not others, so a fault on a link
it does not cross leaves no trace in its connections (docs/diagnosis.md: a third of the
misses of the 2026-12 suites). Astral's monitor and its peers (SkeletonHunter, NetBouncer,
Pingmesh) probe the fabric as well; here that is a few dozen TCP connections between GPUs
whose five-tuples were chosen so that their paths cover every link direction
(:mod:`orchestrator.testbed.probemesh`), each carrying a :data:`MESSAGE` bytes message every
``interval``. TCP, not UDP or ICMP, because the policies steer TCP by its source port
(``path-pinned`` matches ``tcp_src`` bits; its default entries carry everything else on one
path), so only TCP probes can be placed on the paths the collectives use; and because the
sender's kernel counts what it retransmitted and how long it waited (``TCP_INFO``), which
is what the diagnosis already reads for the collectives' connections.

One process for all of them (python -m orchestrator.testbed.prober, the plan as JSON on
stdin): each socket is made inside its GPU's namespace by a helper thread
(:func:`orchestrator.emulation.probe.opened_in`) and all are driven from one loop. Every
``sample`` seconds one line goes to the output file::

    {"t": 1796366664.64, "v": [[probe, bytes acked, retransmitted segments, rtt us,
                                unacked segments, duplicate segments (DSACK)], ...]}

after a first line ``{"started": t, "connected": [ids], "failed": {id: why}}``. A message
that the socket cannot take (a stalled connection's buffer full) is skipped, not queued:
the probe stays a trickle however long a path is broken. SIGTERM ends it after a last line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import select
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from orchestrator.emulation.probe import opened_in
from orchestrator.worker.transport import TcpView

MESSAGE = 64  # bytes per message: one small segment
CONNECT_S = 5.0  # a probe not connected by then is reported failed (and kept trying)
_BYTES_ACKED = 120  # struct tcp_info's tcpi_bytes_acked (orchestrator.worker.transport)
_DSACK_DUPS = 216  # tcpi_dsack_dups (Linux 5.4+): segments the receiver said it had twice


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: a TCP connection from ``src`` (GPU) ``src_ip:sport`` to ``dst``
    ``dst_ip:dport``."""

    id: int
    src: str
    dst: str
    src_ip: str
    sport: int
    dst_ip: str
    dport: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeSpec:
        return cls(
            int(data["id"]),
            str(data["src"]),
            str(data["dst"]),
            str(data["src_ip"]),
            int(data["sport"]),
            str(data["dst_ip"]),
            int(data["dport"]),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _listener(ip: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, port))
    sock.listen(256)
    sock.setblocking(False)
    return sock


def _client(probe: ProbeSpec) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # messages leave as written; the kernel's own minimum RTO (200 ms), not the small one
    # the workers ask for: a probe's RTT swings by the queues it shares with the
    # collectives, and a timer a few ms above the RTT retransmits what was not lost
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((probe.src_ip, probe.sport))
    sock.setblocking(False)
    code = sock.connect_ex((probe.dst_ip, probe.dport))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise OSError(code, f"probe {probe.id}: connect: {errno.errorcode.get(code, code)}")
    return sock


def read_view(sock: socket.socket) -> tuple[int, TcpView, int] | None:
    """(bytes acknowledged, the kernel's view, duplicate segments the receiver reported)
    of a sending socket; None if unreadable. The duplicates tell a retransmission that was
    not needed (a timer that fired while the queues the probe shares with the collectives
    held its segment: the segment came twice) from one that replaced a lost segment."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    if len(info) < _BYTES_ACKED + 8:
        return None
    acked = int.from_bytes(info[_BYTES_ACKED : _BYTES_ACKED + 8], sys.byteorder)
    dups = 0
    if len(info) >= _DSACK_DUPS + 4:
        dups = int.from_bytes(info[_DSACK_DUPS : _DSACK_DUPS + 4], sys.byteorder)
    return acked, TcpView.parse(info), dups


class Prober:
    """The loop of the module docstring over already opened sockets."""

    def __init__(
        self,
        listeners: list[socket.socket],
        clients: dict[int, socket.socket],
        out: TextIO,
        interval: float,
        sample: float,
    ) -> None:
        self.listeners = listeners
        self.clients = clients
        self.out = out
        self.interval = interval
        self.sample = sample
        self.accepted: list[socket.socket] = []
        self.connected: set[int] = set()
        self.failed: dict[int, str] = {}  # probes whose socket could not be made
        self.stopping = False

    def run(self, began: float) -> None:
        payload = b"p" * MESSAGE
        next_send = next_sample = time.monotonic()
        reported = False
        while not self.stopping:
            now = time.monotonic()
            if now >= next_send:
                for probe, sock in self.clients.items():
                    if probe not in self.connected and self._connected(sock):
                        self.connected.add(probe)
                    if probe in self.connected:
                        with contextlib.suppress(BlockingIOError, InterruptedError):
                            sock.send(payload)
                next_send += self.interval
                if next_send < now:  # fell behind (a busy machine): no burst to catch up
                    next_send = now + self.interval
            if now >= next_sample:
                if not reported and (
                    len(self.connected) == len(self.clients) or now - began >= CONNECT_S
                ):
                    self._header(time.time())
                    reported = True
                if reported:
                    self._sample()
                next_sample += self.sample
                if next_sample < now:
                    next_sample = now + self.sample
            self._drain(max(0.0, min(next_send, next_sample) - time.monotonic()))
        if not reported:
            self._header(time.time())
        self._sample()
        self.out.flush()

    def _connected(self, sock: socket.socket) -> bool:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            return False
        try:
            sock.getpeername()
        except OSError:
            return False
        return True

    def _header(self, t: float) -> None:
        failed = {p: "not connected" for p in self.clients if p not in self.connected}
        failed.update(self.failed)
        line = {"started": t, "connected": sorted(self.connected), "failed": failed}
        self.out.write(json.dumps(line) + "\n")

    def _sample(self) -> None:
        t = time.time()
        rows = []
        for probe in sorted(self.connected):
            view = read_view(self.clients[probe])
            if view is not None:
                acked, tcp, dups = view
                rows.append([probe, acked, tcp.retrans, tcp.rtt_us, tcp.unacked, dups])
        self.out.write(json.dumps({"t": round(t, 4), "v": rows}, separators=(",", ":")) + "\n")
        self.out.flush()

    def _drain(self, timeout: float) -> None:
        """Accept and read (and forget) what the probes' receivers got, up to ``timeout``."""
        readable = [*self.listeners, *self.accepted]
        try:
            ready, _, _ = select.select(readable, [], [], timeout)
        except InterruptedError:
            return
        for sock in ready:
            if sock in self.listeners:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    conn, _ = sock.accept()
                    conn.setblocking(False)
                    self.accepted.append(conn)
                continue
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                self.accepted.remove(sock)
                sock.close()

    def close(self) -> None:
        for sock in [*self.listeners, *self.accepted, *self.clients.values()]:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            sock.close()


def open_prober(plan: Mapping[str, Any], out: TextIO) -> Prober:
    """The listeners (one per destination address and port) and the probes' sockets of
    ``plan``, each made in its GPU's namespace."""
    namespaces: dict[str, str] = dict(plan["namespaces"])
    probes = [ProbeSpec.from_dict(p) for p in plan["probes"]]
    ends = sorted({(p.dst, p.dst_ip, p.dport) for p in probes})
    listeners = opened_in(
        {end: namespaces[end[0]] for end in ends},
        lambda end: _listener(end[1], end[2]),
        socket.socket.close,
    )
    by_id = {p.id: p for p in probes}

    def client(probe_id: int) -> socket.socket | str:
        try:
            return _client(by_id[probe_id])
        except OSError as error:  # a port in use: this probe is lost, not the mesh
            return str(error)

    try:
        made = opened_in(
            {p.id: namespaces[p.src] for p in probes},
            client,
            lambda s: s.close() if isinstance(s, socket.socket) else None,
        )
    except BaseException:
        for sock in listeners.values():
            sock.close()
        raise
    prober = Prober(
        list(listeners.values()),
        {i: s for i, s in made.items() if isinstance(s, socket.socket)},
        out,
        float(plan.get("interval", 0.05)),
        float(plan.get("sample", 0.1)),
    )
    prober.failed = {i: s for i, s in made.items() if isinstance(s, str)}
    return prober


def main() -> int:
    plan = json.load(sys.stdin)
    began = time.monotonic()
    with open(plan["out"], "a", encoding="utf-8") as out:
        prober = open_prober(plan, out)

        def stop(_signum: int, _frame: Any) -> None:
            prober.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            prober.run(began)
        finally:
            prober.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
