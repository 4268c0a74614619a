"""TCP between ranks: listeners, one connection per (source, destination, channel), counters.

A connection carries data one way, from the rank that opened it (``src``) to its peer
(``dst``), like an RDMA queue pair used for sending; its five-tuple is known once it is open
and is what the controller sees. Each connection has one thread that serves its queue of
jobs (send these regions / receive into those), so a ring step sends and receives at the
same time without deadlock, and the socket calls run with the GIL released.

Data path: whole regions go to ``sendall`` and ``recv_into(..., MSG_WAITALL)`` as memoryviews
of the numpy buffers, with no per-chunk allocation; a reducing receive lands in a per-
connection scratch slice and is added into the buffer slice by slice.

Counters, two kinds:

- application bytes (``sent``, ``received``), exact, for per-iteration accounting;
- kernel bytes from ``TCP_INFO`` (``tcpi_bytes_acked`` on the sender, ``tcpi_bytes_received``
  on the receiver), read by the :class:`Sampler` thread every 10 ms, so the throughput
  samples follow the wire, not the application's call pattern. At the monitor's full
  detail the sender's same ``TCP_INFO`` read also yields the kernel's view of the
  connection (:class:`TcpView`: RTT, congestion window, retransmissions), at no extra
  system call.

Connection set-up: each rank listens on its fabric and NVLink addresses, opens its outgoing
connections (optionally from a given source port: path pinning chooses the five-tuple), and
sends a 16-byte hello ``b"AWK1", src, dst, channel`` so the acceptor knows who called.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import astuple, dataclass, fields

from orchestrator.worker import rto

HELLO = struct.Struct("!4sIII")
# What the kernel counts beyond the application's bytes on an idle, open connection:
# acknowledged = SYN + hello on the sender, received = hello on the receiver.
HANDSHAKE_SENT = 1 + HELLO.size
HANDSHAKE_RECEIVED = HELLO.size
MAGIC = b"AWK1"
LINKS = ("fabric", "nvlink")

# struct tcp_info offsets (include/uapi/linux/tcp.h, stable since Linux 4.2)
_TCPI_BYTES_ACKED = 120
_TCPI_BYTES_RECEIVED = 128
_TCPI_UNACKED = 24  # __u32 fields from here on
_TCPI_LOST = 32
_TCPI_RTT = 68  # smoothed RTT, us; then rttvar, snd_ssthresh, snd_cwnd
_TCPI_TOTAL_RETRANS = 100
#: SO_LINGER {on, 0 s}: close with a reset instead of FIN and TIME_WAIT (Connection.close).
_LINGER_ABORT = struct.pack("ii", 1, 0)
_TCPI_MIN_LEN = 136
#: ioctl: bytes in a TCP socket's send queue not yet acknowledged by the peer (TIOCOUTQ,
#: include/uapi/asm-generic/ioctls.h; tcp(7) calls it SIOCOUTQ).
_SIOCOUTQ = 0x5411
#: How often a drain looks at the send queue: short against one step of a collective at
#: emulated rates (milliseconds), long enough not to spin.
DRAIN_POLL_S = 0.0002


@dataclass(frozen=True)
class TcpView:
    """The sender kernel's view of a connection (struct tcp_info): smoothed RTT and its
    variation (us), congestion window and slow-start threshold (segments), retransmitted
    segments in total, segments thought lost and not yet acknowledged right now."""

    rtt_us: int
    rttvar_us: int
    cwnd: int
    ssthresh: int
    retrans: int
    lost: int
    unacked: int

    @classmethod
    def parse(cls, info: bytes) -> TcpView:
        unacked, _, lost = struct.unpack_from("III", info, _TCPI_UNACKED)
        rtt, rttvar, ssthresh, cwnd = struct.unpack_from("IIII", info, _TCPI_RTT)
        (retrans,) = struct.unpack_from("I", info, _TCPI_TOTAL_RETRANS)
        return cls(rtt, rttvar, cwnd, ssthresh, retrans, lost, unacked)

    def row(self) -> list[int]:
        """The fields in the order of the protocol's ``tcp`` rows."""
        return list(astuple(self))


TCP_VIEW_FIELDS = tuple(f.name for f in fields(TcpView))


class TransportError(Exception):
    """A connection failed. ``peer`` is the rank at the other end (None if unknown)."""

    def __init__(self, message: str, peer: int | None = None) -> None:
        super().__init__(message)
        self.peer = peer


@dataclass(frozen=True, order=True)
class ConnectionKey:
    src: int
    dst: int
    channel: int = 0


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int


class Completion:
    """The jobs of one step: who is still pending, the first error, a wake-up when done."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}  # peer -> jobs outstanding
        self._left = 0
        self._done = threading.Event()
        self._done.set()
        self.error: BaseException | None = None

    def add(self, peer: int) -> None:
        with self._lock:
            self._pending[peer] = self._pending.get(peer, 0) + 1
            self._left += 1
            self._done.clear()

    def finish(self, peer: int, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and self.error is None:
                self.error = error
            left = self._pending[peer] - 1
            if left:
                self._pending[peer] = left
            else:
                del self._pending[peer]
            self._left -= 1
            if self._left == 0 or error is not None:
                self._done.set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def pending_peers(self) -> list[int]:
        with self._lock:
            return sorted(self._pending)


@dataclass
class RecvTarget:
    """Receive ``len(view)`` bytes into ``view``; or, with ``combine``, slice by slice into
    ``scratch`` and call ``combine(offset, nbytes)`` after each slice (the reduction)."""

    view: memoryview
    scratch: memoryview | None = None
    combine: Callable[[int, int], None] | None = None


class Connection:
    """One open TCP connection carrying data from ``key.src`` to ``key.dst``."""

    def __init__(
        self,
        key: ConnectionKey,
        sock: socket.socket,
        link: str,
        outgoing: bool,
        index: int,
    ) -> None:
        self.key = key
        self.sock = sock
        self.link = link
        self.outgoing = outgoing
        self.index = index  # position in the rank's connection list (samples refer to it)
        local, remote = sock.getsockname(), sock.getpeername()
        src, dst = (local, remote) if outgoing else (remote, local)
        # the ends of its five-tuple (the orchestrator's launcher builds the FiveTuple from
        # them: this process imports nothing of topologies/)
        self.src_address, self.dst_address = Endpoint(src[0], src[1]), Endpoint(dst[0], dst[1])
        self.sent = 0  # application bytes, owned by the serving thread
        self.received = 0
        self.submitted = 0  # jobs handed over (caller's thread) and finished (serving thread)
        self.completed = 0
        self._jobs: queue.SimpleQueue[
            tuple[list[memoryview] | list[RecvTarget], Completion] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._serve, name=f"conn-{key.src}-{key.dst}-{key.channel}", daemon=True
        )
        self._thread.start()

    @property
    def peer(self) -> int:
        return self.key.dst if self.outgoing else self.key.src

    def send(self, views: list[memoryview], done: Completion) -> None:
        done.add(self.peer)
        self.submitted += 1
        self._jobs.put((views, done))

    def recv(self, targets: list[RecvTarget], done: Completion) -> None:
        done.add(self.peer)
        self.submitted += 1
        self._jobs.put((targets, done))

    def drain(self, done: Completion) -> None:
        """Complete ``done`` once the peer has acknowledged every byte sent so far: the
        data has arrived, not merely left this process (``sendall`` returns as soon as the
        kernel holds the bytes). An operation ends on a rank only when its sends have
        drained this way (executor.py), as a collective's kernel ends when its last write
        has completed at the far side."""
        done.add(self.peer)
        self.submitted += 1
        self._jobs.put(([], done))

    def unacknowledged(self) -> int:
        """Bytes sent on this connection that the peer has not acknowledged yet."""
        value = fcntl.ioctl(self.sock.fileno(), _SIOCOUTQ, b"\0\0\0\0")
        queued: int = struct.unpack("i", value)[0]
        return queued

    @property
    def busy(self) -> bool:
        return self.submitted != self.completed

    def kernel_bytes(self) -> int:
        """Bytes the kernel has delivered: acknowledged (sender) or received (receiver)."""
        return self.kernel_view()[0]

    def kernel_view(self) -> tuple[int, TcpView | None]:
        """:meth:`kernel_bytes` and, on the sending end, what the kernel knows of the
        connection (None on the receiving end or an old kernel), from one TCP_INFO read."""
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        if len(info) < _TCPI_MIN_LEN:
            return (self.sent if self.outgoing else self.received), None
        offset = _TCPI_BYTES_ACKED if self.outgoing else _TCPI_BYTES_RECEIVED
        value: int = struct.unpack_from("Q", info, offset)[0]
        return value, (TcpView.parse(info) if self.outgoing else None)

    def close(self) -> None:
        """Abortive close (SO_LINGER 0: RST, no TIME_WAIT). Connections close only after
        the last collective, when every byte has been received and checked, so nothing is
        lost; and under ``path-pinned`` the next launch (another collective, the next
        round of a benchmark) opens the same five-tuples, which a connection lingering in
        TIME_WAIT for a minute would refuse (EADDRNOTAVAIL: without TCP timestamps, which
        the GPUs do not send, the kernel cannot reuse a TIME_WAIT tuple)."""
        self._jobs.put(None)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            items, done = job
            try:
                if self.outgoing and not items:
                    self._wait_acknowledged()
                elif self.outgoing:
                    for view in items:
                        assert isinstance(view, memoryview)
                        self.sock.sendall(view)
                        self.sent += len(view)
                else:
                    for target in items:
                        assert isinstance(target, RecvTarget)
                        self._receive(target)
            except TransportError as error:
                done.finish(self.peer, error)
            except OSError as error:
                done.finish(self.peer, TransportError(f"{self._describe()}: {error}", self.peer))
            else:
                done.finish(self.peer)
            finally:
                self.completed += 1

    def _wait_acknowledged(self) -> None:
        while self.unacknowledged():
            time.sleep(DRAIN_POLL_S)

    def _receive(self, target: RecvTarget) -> None:
        if target.combine is None or target.scratch is None:
            self._recv_exact(target.view)
            return
        size, slice_ = len(target.view), len(target.scratch)
        for offset in range(0, size, slice_):
            nbytes = min(slice_, size - offset)
            self._recv_exact(target.scratch[:nbytes])
            target.combine(offset, nbytes)

    def _recv_exact(self, view: memoryview) -> None:
        got, size = 0, len(view)
        while got < size:
            n = self.sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
            if n == 0:
                raise TransportError(f"{self._describe()}: peer closed the connection", self.peer)
            got += n
            self.received += n

    def _describe(self) -> str:
        src, dst = self.src_address, self.dst_address
        way = "to" if self.outgoing else "from"
        return (
            f"connection {way} rank {self.peer} ({src.ip}:{src.port} -> "
            f"{dst.ip}:{dst.port}, {self.link}, channel {self.key.channel})"
        )


def tune(sock: socket.socket, buffer_bytes: int) -> None:
    """TCP_NODELAY; a small minimum RTO (orchestrator.worker.rto: why, and how a kernel
    without it is reported); socket buffers only when asked (0 keeps the kernel's
    autotuning, which grows past what SO_SNDBUF may set when net.core.wmem_max is small)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rto.request(sock)
    if buffer_bytes:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer_bytes)


class Listener:
    """Listening sockets on the rank's own addresses, one per distinct address."""

    def __init__(self, addresses: dict[str, str], port: int = 0, backlog: int = 256) -> None:
        self._sockets: dict[str, socket.socket] = {}
        self.endpoints: dict[str, Endpoint] = {}
        try:
            for link, ip in addresses.items():
                existing = next((e for e in self.endpoints.values() if e.ip == ip), None)
                if existing is not None:
                    self.endpoints[link] = existing
                    continue
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((ip, port))
                sock.listen(backlog)
                self._sockets[link] = sock
                self.endpoints[link] = Endpoint(ip, sock.getsockname()[1])
        except OSError:
            self.close()
            raise

    def accept(self, timeout: float) -> socket.socket:
        with selectors.DefaultSelector() as selector:
            for sock in self._sockets.values():
                selector.register(sock, selectors.EVENT_READ)
            ready = selector.select(timeout)
            if not ready:
                raise TimeoutError
            listening = ready[0][0].fileobj
            assert isinstance(listening, socket.socket)
            conn, _ = listening.accept()
            return conn

    def close(self) -> None:
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()


@dataclass(frozen=True)
class Route:
    """How to reach a peer for one outgoing connection: addresses and the link they use."""

    link: str
    src: Endpoint  # port 0: any
    dst: Endpoint


class ConnectionPool:
    """A rank's connections, keyed by (src, dst, channel), opened on demand."""

    def __init__(self, rank: int, socket_buffer: int = 0) -> None:
        self.rank = rank
        self.socket_buffer = socket_buffer
        self.connections: dict[ConnectionKey, Connection] = {}
        self.order: list[Connection] = []  # by index

    def outgoing(self, dst: int, channel: int) -> Connection:
        return self.connections[ConnectionKey(self.rank, dst, channel)]

    def incoming(self, src: int, channel: int) -> Connection:
        return self.connections[ConnectionKey(src, self.rank, channel)]

    def _add(self, key: ConnectionKey, sock: socket.socket, link: str, outgoing: bool) -> None:
        conn = Connection(key, sock, link, outgoing, len(self.order))
        self.connections[key] = conn
        self.order.append(conn)

    def establish(
        self,
        listener: Listener,
        outgoing: dict[ConnectionKey, Route],
        incoming: Iterable[ConnectionKey],
        timeout: float,
    ) -> list[Connection]:
        """Open the missing outgoing connections, accept the missing incoming ones.

        Every rank listens before any rank connects (the launcher hands out the peer table
        only after all have reported their listening ports), so connecting first and
        accepting afterwards cannot deadlock: the kernel queues the calls.
        Returns the connections opened by this call.
        """
        before = len(self.order)
        deadline = time.monotonic() + timeout
        for key, route in sorted(outgoing.items()):
            if key not in self.connections:
                sock = self._connect(key, route, deadline)
                self._add(key, sock, route.link, outgoing=True)
        expected = {key for key in incoming if key not in self.connections}
        links = {e.ip: link for link, e in listener.endpoints.items()}
        while expected:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = ", ".join(f"rank {k.src} channel {k.channel}" for k in sorted(expected))
                raise TransportError(f"rank {self.rank}: no connection from {missing} in time")
            try:
                sock = listener.accept(left)
            except TimeoutError:
                continue
            key = self._read_hello(sock, deadline)
            if key not in expected:
                sock.close()
                raise TransportError(
                    f"rank {self.rank}: unexpected connection from rank {key.src} "
                    f"channel {key.channel}",
                    key.src,
                )
            expected.discard(key)
            tune(sock, self.socket_buffer)
            self._add(key, sock, links.get(sock.getsockname()[0], "fabric"), outgoing=False)
        return self.order[before:]

    def _connect(self, key: ConnectionKey, route: Route, deadline: float) -> socket.socket:
        last: OSError | None = None
        while time.monotonic() < deadline:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tune(sock, self.socket_buffer)
                try:
                    sock.bind((route.src.ip, route.src.port))
                except OSError as error:
                    if route.src.port and error.errno == errno.EADDRINUSE:
                        raise TransportError(
                            f"rank {self.rank}: source port {route.src.ip}:{route.src.port} "
                            f"for rank {key.dst} channel {key.channel} is in use",
                            key.dst,
                        ) from error
                    raise
                sock.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
                sock.connect((route.dst.ip, route.dst.port))
                sock.settimeout(None)
                sock.sendall(HELLO.pack(MAGIC, key.src, key.dst, key.channel))
                return sock
            except TransportError:
                sock.close()
                raise
            except OSError as error:  # refused, unreachable, timed out: the fabric may
                sock.close()  # still be converging; retry until the deadline
                last = error
                time.sleep(0.05)
        raise TransportError(
            f"rank {self.rank}: cannot connect to rank {key.dst} at "
            f"{route.dst.ip}:{route.dst.port} ({route.link}): {last}",
            key.dst,
        )

    def _read_hello(self, sock: socket.socket, deadline: float) -> ConnectionKey:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        data = bytearray()
        try:
            while len(data) < HELLO.size:
                chunk = sock.recv(HELLO.size - len(data))
                if not chunk:
                    break
                data += chunk
        except OSError as error:
            sock.close()
            raise TransportError(f"rank {self.rank}: bad connection hello: {error}") from error
        sock.settimeout(None)
        if len(data) < HELLO.size:
            sock.close()
            raise TransportError(f"rank {self.rank}: a connection closed before its hello")
        magic, src, dst, channel = HELLO.unpack(bytes(data))
        if magic != MAGIC or dst != self.rank:
            sock.close()
            raise TransportError(f"rank {self.rank}: a connection sent a bad hello")
        return ConnectionKey(src, dst, channel)

    def close(self) -> None:
        for conn in self.order:
            conn.close()


@dataclass(frozen=True)
class Sample:
    """Bytes connection ``index`` carried in (the previous sample's t, t]; t in epoch s;
    ``view``: the sender kernel's TCP_INFO at t (full monitor detail, sending end only)."""

    t: float
    index: int
    bytes: int
    view: TcpView | None = None


class Sampler:
    """Reads every connection's kernel byte counter every ``interval`` seconds.

    Counts start when the connection opens, so a connection's first sample includes its
    handshake: one byte for the SYN and the 16-byte hello on the sender's side, the hello on
    the receiver's (and a closing FIN adds one). A connection that stays idle produces no
    samples; a burst is bracketed by zero-byte samples (the tick before it and the tick
    after it), so each sample's interval (from the connection's previous sample) is exact
    and rates can be computed from consecutive samples alone. A connection is read only
    while it has work queued or its kernel count differs from the application's (bytes
    still moving), so idle connections cost no system call (all-to-all ranks have many).
    With ``tcp_info`` (seconds, 0: never), a sample of a sending end carries the kernel's
    :class:`TcpView` from the same read when the connection's previous view is at least
    that old: the kernel's RTT estimate moves slower than the byte counts, and every view
    is a row the launcher must parse while the collective runs. A connection with work
    queued that moves nothing (stalled: a timeout, a hole) carries on sending its views at
    that pace in zero-byte samples: its retransmissions while it stalls are the evidence
    of a hole, and a run still going has no other way to see them.
    """

    def __init__(self, pool: ConnectionPool, interval: float = 0.01, tcp_info: float = 0.0):
        self.pool = pool
        self.interval = interval
        self.tcp_info = tcp_info
        self._viewed: dict[int, float] = {}  # index -> time of its last TcpView
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._last: dict[int, int] = {}  # index -> counter at the previous tick
        self._active: dict[int, bool] = {}  # index -> the previous tick had bytes
        self._held: dict[int, float] = {}  # index -> its last zero-byte view's tick
        self._prev_t = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.tick(force=True)

    def drain(self) -> list[Sample]:
        with self._lock:
            samples, self._samples = self._samples, []
        return samples

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            next_tick += self.interval
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (a loaded machine): skip, do not burst
                next_tick = time.monotonic()
                delay = 0.0
            if self._stop.wait(delay):
                break
            self.tick()

    def _moving(self, conn: Connection) -> bool:
        """Bytes still on their way: the kernel's count differs from the application's."""
        if self._active.get(conn.index):
            return True
        if conn.outgoing:
            return self._last.get(conn.index, 0) != conn.sent + HANDSHAKE_SENT
        return self._last.get(conn.index, 0) != conn.received + HANDSHAKE_RECEIVED

    def tick(self, force: bool = False) -> None:
        now = time.time()
        out: list[Sample] = []
        for conn in list(self.pool.order):
            if not (force or conn.busy or self._moving(conn)):
                continue  # idle and settled: no system call
            try:
                value, view = conn.kernel_view()
            except OSError:
                continue
            if view is not None:
                if self.tcp_info and now - self._viewed.get(conn.index, 0.0) >= self.tcp_info:
                    self._viewed[conn.index] = now
                else:
                    view = None
            delta = value - self._last.get(conn.index, 0)
            self._last[conn.index] = value
            was_active = self._active.get(conn.index, False)
            if delta:
                if not was_active and self._held.get(conn.index) != self._prev_t:
                    out.append(Sample(self._prev_t, conn.index, 0))
                out.append(Sample(now, conn.index, delta, view))
            elif was_active:
                out.append(Sample(now, conn.index, 0, view))
            elif view is not None:
                # work queued and nothing moving: a stall (a hole, a timeout); its kernel
                # view (retransmissions, data outstanding) is what tells it, live
                out.append(Sample(now, conn.index, 0, view))
                self._held[conn.index] = now
            self._active[conn.index] = bool(delta)
        self._prev_t = now
        if out:
            with self._lock:
                self._samples.extend(out)
