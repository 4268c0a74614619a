"""The coordination protocol between the launcher and its workers.

One Unix stream socket (on the file system every emulated host shares; the launcher
listens, each worker connects), carrying one JSON object per line, each with a ``type``.
A worker's lifetime::

    worker                                   launcher
      | -- hello {rank, host, pid, listen} -->  |  rendezvous: every rank's listening
      | <-- setup {peers, options} ------------ |  addresses; peer table for everyone
      | <-- schedule {tests} ------------------ |  the collectives to run (repeatable)
      |    (opens its connections, fills the    |
      |     first iteration's buffers)          |
      | -- ready {connections} ---------------> |  five-tuples of every connection
      | <-- start {test, iteration, count, at}  |  barrier: sent when all are done/ready;
      |    (waits until the instant ``at``,     |  ``count`` operations back to back from
      |     then runs ``count`` operations)     |  the common start ``at`` (epoch s)
      | -- done {time_us, phases, bytes, wrong} |  one per operation (after checking it
      |    ... done per operation ...           |  and filling the next)
      |    ... start/done per batch ...         |
      | <-- finish ---------------------------- |  flush the last samples, say bye, exit
      | -- bye -------------------------------> |
    any time:
      | -- heartbeat {state, waiting_on} -----> |  every heartbeat interval, from a thread
      | -- samples {samples, tcp} ------------> |  per-connection byte counts, 10 ms apart
      |                                         |  (tcp: the senders' TCP_INFO, if asked)
      | -- failed {error, peer} --------------> |  then waits to be told to abort
      | <-- abort ----------------------------- |  exit now, whatever the worker is doing
      | <-- late {seconds} -------------------- |  from now on enter every operation this
      |                                         |  late (a straggler fault; 0: on time)

A worker whose socket to the launcher closes exits at once: no worker outlives its run.
Messages are plain dicts (JSON); the builders below are the reference for their fields.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

VERSION = 2  # 2: a schedule's test may be a program

# worker -> launcher
HELLO = "hello"
READY = "ready"
DONE = "done"
HEARTBEAT = "heartbeat"
SAMPLES = "samples"
FAILED = "failed"
BYE = "bye"
# launcher -> worker
SETUP = "setup"
SCHEDULE = "schedule"
START = "start"
FINISH = "finish"
ABORT = "abort"
LATE = "late"

Message = dict[str, Any]
MAX_LINE = 64 << 20  # a sane bound on one message


class ProtocolError(Exception):
    """A malformed or unexpected message."""


def encode(message: Message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> Message:
    try:
        message = json.loads(line)
    except ValueError as error:
        raise ProtocolError(f"not JSON: {line[:80]!r}") from error
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ProtocolError(f"not a message: {line[:80]!r}")
    return message


class LineBuffer:
    """Splits a byte stream into messages."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> Iterator[Message]:
        self._data += data
        while True:
            end = self._data.find(b"\n")
            if end < 0:
                if len(self._data) > MAX_LINE:
                    raise ProtocolError("message too long")
                return
            line = bytes(self._data[:end])
            del self._data[: end + 1]
            if line.strip():
                yield decode(line)


class Channel:
    """A blocking message channel over a connected stream socket, safe for many senders."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()
        self._buffer = LineBuffer()
        self._ready: list[Message] = []

    @classmethod
    def connect(cls, path: str) -> Channel:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return cls(sock)

    def send(self, message: Message) -> None:
        data = encode(message)
        with self._send_lock:
            self.sock.sendall(data)

    def receive(self) -> Message | None:
        """The next message, or None at end of stream."""
        while not self._ready:
            data = self.sock.recv(1 << 16)
            if not data:
                return None
            self._ready.extend(self._buffer.feed(data))
        return self._ready.pop(0)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# --- message builders (the field reference) -------------------------------------------------


def hello(rank: int, host: str, pid: int, listen: dict[str, tuple[str, int]]) -> Message:
    """``listen``: link ("fabric", "nvlink") -> (ip, port) the worker accepts on."""
    return {
        "type": HELLO,
        "version": VERSION,
        "rank": rank,
        "host": host,
        "pid": pid,
        "listen": {link: list(ep) for link, ep in listen.items()},
    }


def setup(peers: list[dict[str, Any]], options: dict[str, Any]) -> Message:
    """``peers[r]``: {rank, host, server, local_rank, listen: {link: [ip, port]}};
    ``options``: channels, socket_buffer, verify, heartbeat_interval, sample_interval,
    connect_timeout, source_ports ([[src, dst, channel, port], ...]), tcp_info (send the
    senders' TCP_INFO with the samples, at most this often per connection, seconds; 0:
    never)."""
    return {"type": SETUP, "version": VERSION, "peers": peers, "options": options}


def schedule(tests: list[dict[str, Any]]) -> Message:
    """``tests``: [{id, collective, algorithm, count, warmup, iterations}, ...]; ids are
    unique over the run (they salt the fill pattern). A program's test (collective
    ``program``) also has ``program``: the program itself, as
    ``orchestrator.collectives.program.Program.to_message`` writes it."""
    return {"type": SCHEDULE, "tests": tests}


def ready(rank: int, connections: list[dict[str, Any]]) -> Message:
    """``connections``: every connection of the rank so far: {index, src, dst, channel,
    link, outgoing, five_tuple: [src_ip, src_port, dst_ip, dst_port], rto_min_us: the
    minimum RTO the kernel granted it, null if none (orchestrator.worker.rto)}."""
    return {"type": READY, "rank": rank, "connections": connections}


def start(test: int, iteration: int, count: int = 1, at: float | None = None) -> Message:
    """Run operations ``iteration`` .. ``iteration + count - 1`` of ``test`` back to back,
    the first counted from ``at`` (epoch seconds; None: when the message arrives)."""
    message: Message = {"type": START, "test": test, "iteration": iteration, "count": count}
    if at is not None:
        message["at"] = at
    return message


def done(
    rank: int,
    test: int,
    iteration: int,
    *,
    start: float,
    time_us: float,
    phases: list[list[Any]],
    traffic: list[list[int]],
    wrong: int,
) -> Message:
    """``start``: epoch seconds; ``phases``: [[phase, step, start, end], ...] in epoch
    seconds; ``traffic``: [[connection index, bytes sent, bytes received], ...] for this
    iteration; ``wrong``: elements that failed the check (-1: not checked)."""
    return {
        "type": DONE,
        "rank": rank,
        "test": test,
        "iteration": iteration,
        "start": start,
        "time_us": time_us,
        "phases": phases,
        "traffic": traffic,
        "wrong": wrong,
    }


def heartbeat(
    rank: int,
    *,
    busy: bool,
    test: int,
    iteration: int,
    step: int,
    phase: str,
    elapsed: float,
    waiting_on: list[int],
    entered: float | None = None,
) -> Message:
    """The worker's position: ``busy`` between start and done; ``step`` -1 before the
    first step and after the last; ``elapsed``: seconds in the current step (or state);
    ``waiting_on``: peers whose transfers of this step have not completed; ``entered``:
    when the operation's step 0 began (epoch s), once it has."""
    message: Message = {
        "type": HEARTBEAT,
        "rank": rank,
        "busy": busy,
        "test": test,
        "iteration": iteration,
        "step": step,
        "phase": phase,
        "elapsed": elapsed,
        "waiting_on": waiting_on,
    }
    if entered is not None:
        message["entered"] = entered
    return message


def samples(rank: int, rows: list[list[float]], tcp: list[list[float]] | None = None) -> Message:
    """``rows``: [[t (epoch s), connection index, bytes], ...]; ``tcp``: [[t, connection
    index, rtt_us, rttvar_us, cwnd, ssthresh, retrans, lost, unacked], ...] of the rank's
    sending ends (orchestrator.worker.transport.TcpView), when asked for."""
    message: Message = {"type": SAMPLES, "rank": rank, "samples": rows}
    if tcp:
        message["tcp"] = tcp
    return message


def late(seconds: float) -> Message:
    """Enter every following operation ``seconds`` late (handled by the worker's control
    thread at once, also in the middle of a batch: the next operation to begin waits)."""
    return {"type": LATE, "seconds": seconds}


def failed(rank: int, error: str, peer: int | None = None) -> Message:
    return {"type": FAILED, "rank": rank, "error": error, "peer": peer}


def simple(kind: str, **fields: Any) -> Message:
    return {"type": kind, **fields}


def shift_clock(message: Message, seconds: float) -> Message:
    """``message`` with every epoch time it carries moved by ``seconds``: a worker on
    another machine (orchestrator.cluster) keeps its own clock, whose offset from the
    launcher's was measured at bring-up. The launcher shifts ``start``'s ``at`` into the
    worker's clock (+offset) and a worker's ``done`` and ``samples`` into its own
    (-offset), so that every rank's timeline is on one clock. 0: the message itself."""
    if not seconds:
        return message
    kind = message.get("type")
    shifted = dict(message)
    if kind == START and message.get("at") is not None:
        shifted["at"] = float(message["at"]) + seconds
    elif kind == DONE:
        shifted["start"] = float(message["start"]) + seconds
        shifted["phases"] = [
            [p[0], p[1], p[2] + seconds, p[3] + seconds] for p in message["phases"]
        ]
    elif kind == HEARTBEAT and message.get("entered") is not None:
        shifted["entered"] = float(message["entered"]) + seconds
    elif kind == SAMPLES:
        shifted["samples"] = [[r[0] + seconds, *r[1:]] for r in message["samples"]]
        if "tcp" in message:
            shifted["tcp"] = [[r[0] + seconds, *r[1:]] for r in message["tcp"]]
    return shifted
