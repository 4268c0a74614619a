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

**Trains.** Small messages cannot see a slow link: 64 bytes cross a quarter-rate link as
fast as a full-rate one, and nothing queues behind them. So each probe also sends, every
``train_cycle`` seconds (the probes staggered, at most :data:`TRAINS_PER_S` trains a
second in all), one :data:`TRAIN` bytes message, paced by its kernel at ``pace`` bytes
a second (``SO_MAX_PACING_RATE``: 1.5 times its path's slowest link, so the train does not
leave as a few 64 kB GSO bursts that a token bucket lets through whole). The receiver
notes when the train's bytes arrived, by the kernel's receive timestamps
(``SO_TIMESTAMPNS``: when the segments reached the GPU, not when this loop got to them),
and a sample line carries the trains completed since the last one::

    "tr": [[probe, bytes, first arrival, bytes in it, arrival of the half, bytes by then,
            last arrival], ...]

The rate of the train's second half is the rate of the slowest link of its path once that
link's token bucket is spent (measured on astral-small, a link of 20 Mbit/s, idle: 27
Mbit/s at the 30 Mbit/s pace; slowed to a quarter 4.4; to half 10). Why the second half:
the first passes each link's bucket (10 ms of its rate, 8 frames at least) at the pace.
The trains are the mesh's larger cost: about 32 kB per probe per 4 s, 0.6 % of a 12 Mbit/s
link per probe that crosses it. On a slow link (a 15:1 core at 0.8 Mbit/s) the same
probes would take a quarter of it; the mesh gives each probe a budget
(:func:`orchestrator.testbed.probemesh.budgeted`): a message every ``every`` ticks and a
train every ``train_every`` of its turns.
"""

from __future__ import annotations

import contextlib
import errno
import json
import select
import signal
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from orchestrator.emulation.probe import opened_in
from orchestrator.worker.transport import TcpView

MESSAGE = 64  # bytes per message: one small segment
TRAIN = 32768  # bytes per train (more than a slowed link's token bucket, 8 frames)
TRAIN_CYCLE_S = 4.0  # each probe sends a train this often
TRAINS_PER_S = 15.0  # all probes together at most
TRAIN_GAP_S = 1.0  # a train's bytes this far apart from the last: a train cut short
QUIET_TRIES = 3  # probes asked whether their path is quiet, per train's turn, at most
QUIET_US = 3000  # a path is quiet for a train when its smoothed RTT is within this of its least
_TCPI_RTT, _TCPI_MIN_RTT = 68, 148  # struct tcp_info: tcpi_rtt, tcpi_min_rtt (microseconds)
_MESSAGE_BYTE, _TRAIN_BYTE = b"p", b"t"  # the receiver tells a train's bytes by them
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
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
    pace: int = 0  # the trains' pacing, bytes a second (0: the kernel's own)
    #: a message every ``every`` message ticks, a train every ``train_every`` of its turns:
    #: the mesh's budget on the slow links of its path (orchestrator.testbed.probemesh)
    every: int = 1
    train_every: int = 1

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
            int(data.get("pace", 0)),
            max(1, int(data.get("every", 1))),
            max(1, int(data.get("train_every", 1))),
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
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * TRAIN)  # a train at once
    if probe.pace > 0:
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, probe.pace)
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


@dataclass
class Arrival:
    """A train arriving at its receiver: when its bytes came (kernel timestamps)."""

    probe: int
    bytes: int = 0
    first: float = 0.0
    first_bytes: int = 0
    half: float | None = None
    half_bytes: int = 0
    last: float = 0.0

    def add(self, n: int, t: float, whole: int) -> None:
        if self.bytes == 0:
            self.first, self.first_bytes = t, n
        self.bytes += n
        if self.half is None and self.bytes >= whole / 2:
            self.half, self.half_bytes = t, self.bytes
        self.last = t

    def row(self) -> list[Any]:
        half = self.half if self.half is not None else self.last
        return [
            self.probe,
            self.bytes,
            round(self.first, 6),
            self.first_bytes,
            round(half, 6),
            self.half_bytes or self.bytes,
            round(self.last, 6),
        ]


class Prober:
    """The loop of the module docstring over already opened sockets."""

    def __init__(
        self,
        listeners: list[socket.socket],
        clients: dict[int, socket.socket],
        out: TextIO,
        interval: float,
        sample: float,
        *,
        senders: Mapping[tuple[str, int], int] | None = None,
        train: int = 0,
        train_cycle: float = TRAIN_CYCLE_S,
        order: list[int] | None = None,
        every: Mapping[int, int] | None = None,
        train_every: Mapping[int, int] | None = None,
    ) -> None:
        self.listeners = listeners
        self.clients = clients
        self.out = out
        self.interval = interval
        self.sample = sample
        # (source address, port) -> probe, to name the trains a receiver got
        self.senders = dict(senders or {})
        self.train = train
        self.train_every = max(train_cycle / max(len(clients), 1), 1.0 / TRAINS_PER_S)
        self.accepted: list[socket.socket] = []
        self.peers: dict[socket.socket, int] = {}  # accepted socket -> its probe
        self.arriving: dict[socket.socket, Arrival] = {}
        self.arrived: list[list[Any]] = []  # trains complete since the last sample
        self.pending: dict[int, int] = {}  # probe -> bytes of its train still to send
        # the turns of the trains: the probes of one GPU spread out (back to back, one
        # GPU's link would carry several trains at once, and read slow for its own)
        self.order = [p for p in (order or sorted(clients)) if p in clients]
        self.turn = 0  # the next probe in that order to send a train
        # per probe: a message every that many ticks, a train every that many turns
        self.every = {p: max(1, (every or {}).get(p, 1)) for p in clients}
        self.train_turns = {p: max(1, (train_every or {}).get(p, 1)) for p in clients}
        self.tick = 0  # message ticks so far
        self.turns: Counter[int] = Counter()  # train turns each probe has had
        self.skipped = 0  # trains not sent since the last sample: their paths were busy
        self.connected: set[int] = set()
        self.failed: dict[int, str] = {}  # probes whose socket could not be made
        self.stopping = False

    def run(self, began: float) -> None:
        payload = _MESSAGE_BYTE * MESSAGE
        next_send = next_sample = next_train = time.monotonic()
        reported = False
        while not self.stopping:
            now = time.monotonic()
            if now >= next_send:
                for probe, sock in self.clients.items():
                    if probe not in self.connected and self._connected(sock):
                        self.connected.add(probe)
                    due = (self.tick + probe) % self.every[probe] == 0  # staggered by id
                    if due and probe in self.connected and probe not in self.pending:
                        with contextlib.suppress(BlockingIOError, InterruptedError):
                            sock.send(payload)
                self.tick += 1
                next_send += self.interval
                if next_send < now:  # fell behind (a busy machine): no burst to catch up
                    next_send = now + self.interval
            if self.train and now >= next_train:
                self._start_train()
                next_train += self.train_every
                if next_train < now:
                    next_train = now + self.train_every
            self._send_trains()
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
            wake = min(next_send, next_sample, next_train if self.train else next_send)
            self._drain(max(0.0, wake - time.monotonic()))
        if not reported:
            self._header(time.time())
        self._sample()
        self.out.flush()

    def _start_train(self) -> None:
        """The next connected probe in turn whose last train has gone and whose path is
        quiet (:func:`quiet`) starts one; a probe on a busy path waits for its next turn
        (:attr:`skipped` counts them). At most :data:`QUIET_TRIES` probes are asked per
        turn: on a fabric busy everywhere, asking every probe's kernel every turn cost
        the prober more CPU than the emulation could spare (1,500 ``TCP_INFO`` reads a
        second for 100 probes)."""
        order = self.order
        tries = 0
        for _ in range(len(order)):
            if tries >= QUIET_TRIES:
                return
            probe = order[self.turn]
            self.turn = (self.turn + 1) % len(order)
            if probe not in self.connected or probe in self.pending:
                continue
            self.turns[probe] += 1
            if self.turns[probe] % self.train_turns[probe]:
                continue  # not its turn under its budget: the next probe's, at no cost
            tries += 1
            if not quiet(self.clients[probe]):
                self.skipped += 1
                continue
            self.pending[probe] = self.train
            return

    def _send_trains(self) -> None:
        for probe, left in list(self.pending.items()):
            try:
                sent = self.clients[probe].send(_TRAIN_BYTE * min(left, 65536))
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:  # a broken connection: its train is lost, as its messages are
                sent = left
            if sent >= left:
                del self.pending[probe]
            else:
                self.pending[probe] = left - sent

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
        line: dict[str, Any] = {"t": round(t, 4), "v": rows}
        if self.arrived:
            line["tr"], self.arrived = self.arrived, []
        if self.skipped:
            line["ts"], self.skipped = self.skipped, 0
        self.out.write(json.dumps(line, separators=(",", ":")) + "\n")
        self.out.flush()

    def _drain(self, timeout: float) -> None:
        """Accept and read what the probes' receivers got, up to ``timeout``: the
        messages are forgotten, the trains' arrivals noted."""
        readable = [*self.listeners, *self.accepted]
        writable = [self.clients[p] for p in self.pending]
        try:
            ready, _, _ = select.select(readable, writable, [], timeout)
        except InterruptedError:
            return
        for sock in ready:
            if sock in self.listeners:
                with contextlib.suppress(BlockingIOError, InterruptedError):
                    conn, peer = sock.accept()
                    conn.setblocking(False)
                    with contextlib.suppress(OSError):
                        conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
                    self.accepted.append(conn)
                    probe = self.senders.get((str(peer[0]), int(peer[1])))
                    if probe is not None:
                        self.peers[conn] = probe
                continue
            try:
                data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data, ancillary = b"", []
            if not data:
                self.accepted.remove(sock)
                self.peers.pop(sock, None)
                self.arriving.pop(sock, None)
                sock.close()
                continue
            with contextlib.suppress(OSError):  # acknowledge at once (see quiet())
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            self._arrive(sock, data.count(_TRAIN_BYTE), _stamp(ancillary))

    def _arrive(self, sock: socket.socket, n: int, t: float) -> None:
        probe = self.peers.get(sock)
        if probe is None or not self.train:
            return
        train = self.arriving.get(sock)
        if train is not None and n and t - train.last > TRAIN_GAP_S:
            self.arrived.append(train.row())  # cut short (a loss, a hole): as far as it came
            del self.arriving[sock]
            train = None
        if n == 0:
            return
        if train is None:
            train = self.arriving[sock] = Arrival(probe)
        train.add(n, t, self.train)
        if train.bytes >= self.train:
            self.arrived.append(train.row())
            del self.arriving[sock]

    def close(self) -> None:
        for sock in [*self.listeners, *self.accepted, *self.clients.values()]:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            sock.close()


def quiet(sock: socket.socket) -> bool:
    """Whether the probe's path is quiet enough for a train: its smoothed RTT within
    :data:`QUIET_US` of the least it has seen. A train on a busy path measures the path's
    traffic, not its links (the diagnosis excuses it), and costs that traffic: 32 kB at
    1.5 times a link's rate into a queue a collective keeps full makes the collective
    lose packets (measured: a pinned ring lost 7 % of its bus bandwidth to trains sent
    regardless). The receivers acknowledge at once (``TCP_QUICKACK`` after every read) so
    that the RTT is the path's, not the delayed acknowledgement's 40 ms."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return False
    if len(info) < _TCPI_MIN_RTT + 4:
        return True  # an old kernel: no least RTT to compare with
    (rtt,) = struct.unpack_from("I", info, _TCPI_RTT)
    (least,) = struct.unpack_from("I", info, _TCPI_MIN_RTT)
    return bool(rtt) and rtt <= least + QUIET_US


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> float:
    """The kernel's receive timestamp of what a read returned (the last segment in it);
    the clock now if there is none."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return seconds + nanoseconds * 1e-9
    return time.time()


def interleaved(probes: list[ProbeSpec]) -> list[int]:
    """The probes' ids taking each source GPU in turn: a GPU's probes as far apart as the
    GPUs allow."""
    by_source: dict[str, list[int]] = {}
    for p in sorted(probes, key=lambda p: p.id):
        by_source.setdefault(p.src, []).append(p.id)
    queues = [by_source[src] for src in sorted(by_source)]
    out = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


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
        senders={(p.src_ip, p.sport): p.id for p in probes},
        train=int(plan.get("train", 0)),
        train_cycle=float(plan.get("train_cycle", TRAIN_CYCLE_S)),
        order=interleaved(probes),
        every={p.id: p.every for p in probes},
        train_every={p.id: p.train_every for p in probes},
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
