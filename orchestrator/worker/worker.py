"""The worker process: ``python -m orchestrator.worker --rank R --socket PATH ...``.

One per emulated GPU, started by the launcher (``host.popen`` in Mininet, ``Popen`` on
loopback). It listens on its fabric and NVLink addresses, reports them, takes the peer
table and the schedule, opens its connections, then runs a batch of operations back to
back per ``start`` (from the common instant it names) and answers ``done`` for each with
its time, timeline, bytes and #wrong (protocol.py has the sequence).

Threads: the main thread runs the operations; a control reader turns launcher messages
into a queue (and exits the process on ``abort`` or when the launcher goes away); a
heartbeat thread reports progress and ships the sampler's byte counts; the sampler reads
the kernel counters every 10 ms; each connection has its own sender or receiver thread.

Fault injection, for tests only: ``--corrupt-rank R`` makes rank R corrupt the first region
it sends in an operation (``--corrupt-iteration`` limits it to one global iteration index);
``--hang-rank R --hang-at-iteration I`` makes rank R stop working at global iteration I
(default 0) while its heartbeat goes on, as a stuck GPU kernel would. Every worker gets
the same flags; only the named rank acts on them.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.collectives.latency import LatencyTable
from orchestrator.collectives.operations import Result
from orchestrator.collectives.plans import AlgorithmRegistry, Layout, Plan, default_registry
from orchestrator.collectives.program import Program, compose, expected
from orchestrator.worker import protocol, rto
from orchestrator.worker.buffers import Buffers, Pattern, salt
from orchestrator.worker.executor import Executor, Progress, StepFailed
from orchestrator.worker.protocol import Channel, Message, ProtocolError
from orchestrator.worker.transport import (
    ConnectionKey,
    ConnectionPool,
    Endpoint,
    Listener,
    Route,
    Sampler,
    TransportError,
)

EXIT_ABORTED = 3
EXIT_FAILED = 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--socket", required=True, help="the launcher's Unix socket")
    parser.add_argument("--host", default="", help="this GPU's host name (for reports)")
    parser.add_argument("--fabric-ip", default="127.0.0.1")
    parser.add_argument("--nvlink-ip", default="", help="default: the fabric address")
    parser.add_argument("--port", type=int, default=0, help="listening port (0: any)")
    parser.add_argument("--corrupt-rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--corrupt-iteration", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--hang-rank", type=int, default=-1, help=argparse.SUPPRESS)
    parser.add_argument("--hang-at-iteration", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@dataclass
class Test:
    id: int
    plan: Plan
    warmup: int
    iterations: int
    result: Result | None = None  # what a program's buffers hold; None: the plan's operation's

    @property
    def total(self) -> int:
        return self.warmup + self.iterations


class Peers:
    """The peer table from ``setup``: where every rank listens, and its place."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        rows = sorted(rows, key=lambda row: row["rank"])
        if [row["rank"] for row in rows] != list(range(len(rows))):
            raise ProtocolError("peer table: ranks must be 0..n-1")
        self.rows = rows
        self.layout = Layout(
            tuple(str(row["server"]) for row in rows), tuple(int(row["local_rank"]) for row in rows)
        )

    def endpoint(self, rank: int, link: str) -> Endpoint:
        ip, port = self.rows[rank]["listen"][link]
        return Endpoint(str(ip), int(port))


class Worker:
    def __init__(self, args: argparse.Namespace, channel: Channel, listener: Listener) -> None:
        self.args = args
        self.rank: int = args.rank
        self.channel = channel
        self.listener = listener
        self.inbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self.progress = Progress()
        self.registry: AlgorithmRegistry = default_registry()
        self.pattern = Pattern()
        self.options: dict[str, Any] = {}
        self.peers: Peers | None = None
        self.pool: ConnectionPool | None = None
        self.executor: Executor | None = None
        self.sampler: Sampler | None = None
        self.tests: list[Test] = []
        self.position = (0, 0)  # (index into tests, iteration) of the next operation
        self.buffers: Buffers | None = None
        self.global_iteration = 0
        # (start, end) of the check and fill that ran between the previous operation of a
        # batch and the next; None at a batch's start
        self._verify_phase: tuple[float, float] | None = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.reading = False
        self.late = 0.0  # seconds every operation begins late (protocol.LATE: a straggler)

    # --- threads -----------------------------------------------------------------------------

    def start_reader(self) -> None:
        self.reading = True
        threading.Thread(target=self._read_control, name="control", daemon=True).start()

    def _read_control(self) -> None:
        try:
            while True:
                message = self.channel.receive()
                if message is None:
                    break
                if message["type"] == protocol.ABORT:
                    os._exit(EXIT_ABORTED)
                if message["type"] == protocol.LATE:  # now, not after the current batch
                    self.late = max(0.0, float(message["seconds"]))
                    if self.executor is not None:
                        self.executor.late = self.late
                    continue
                self.inbox.put(message)
                if message["type"] == protocol.FINISH:
                    return
        except (OSError, ProtocolError):
            pass
        # The launcher is gone: no worker outlives its run.
        os._exit(EXIT_ABORTED)

    def _heartbeat(self, interval: float) -> None:
        p = self.progress
        while not self._stop.wait(interval):
            try:
                self._ship_samples()
                self.channel.send(
                    protocol.heartbeat(
                        self.rank,
                        busy=p.busy,
                        test=p.test,
                        iteration=p.iteration,
                        step=p.step,
                        phase=p.phase,
                        elapsed=p.elapsed(),
                        waiting_on=p.waiting_on(),
                        entered=p.entered if p.busy else None,
                    )
                )
            except OSError:
                return

    def _ship_samples(self) -> None:
        if self.sampler is None:
            return
        drained = self.sampler.drain()
        rows = [[s.t, s.index, s.bytes] for s in drained]
        tcp = [[s.t, s.index, *s.view.row()] for s in drained if s.view is not None]
        if rows:
            self.channel.send(protocol.samples(self.rank, rows, tcp))

    # --- protocol ----------------------------------------------------------------------------

    def next_message(self) -> Message:
        message = self.inbox.get()
        if message is None:
            raise ProtocolError("control channel closed")
        return message

    def run(self) -> int:
        endpoints = {link: (e.ip, e.port) for link, e in self.listener.endpoints.items()}
        self.channel.send(protocol.hello(self.rank, self.args.host, os.getpid(), endpoints))
        self.start_reader()
        message = self.next_message()
        if message["type"] != protocol.SETUP:
            raise ProtocolError(f"expected setup, got {message['type']}")
        self.configure(message)
        while True:
            message = self.next_message()
            kind = message["type"]
            if kind == protocol.SCHEDULE:
                self.prepare_schedule(message["tests"])
            elif kind == protocol.START:
                self._verify_phase = None
                at = message.get("at")
                self.operate(
                    int(message["test"]),
                    int(message["iteration"]),
                    int(message.get("count", 1)),
                    None if at is None else float(at),
                )
            elif kind == protocol.FINISH:
                self.finish()
                return 0
            else:
                raise ProtocolError(f"unexpected message {kind}")

    def configure(self, message: Message) -> None:
        self.options = dict(message["options"])
        self.peers = Peers(message["peers"])
        if not 0 <= self.rank < self.peers.layout.size:
            raise ProtocolError(f"rank {self.rank} is not in the peer table")
        self.pool = ConnectionPool(self.rank, int(self.options.get("socket_buffer", 0)))
        latency = LatencyTable.from_message(self.options.get("latency")).row(self.rank)
        self.executor = Executor(self.pool, int(self.options.get("channels", 1)), latency)
        self.executor.late = self.late
        self.sampler = Sampler(
            self.pool,
            float(self.options.get("sample_interval", 0.01)),
            tcp_info=float(self.options.get("tcp_info", 0.0) or 0.0),
        )
        self.sampler.start()
        interval = float(self.options.get("heartbeat_interval", 0.2))
        self._beat = threading.Thread(
            target=self._heartbeat, args=(interval,), name="heartbeat", daemon=True
        )
        self._beat.start()

    def prepare_schedule(self, tests: list[dict[str, Any]]) -> None:
        assert self.peers is not None and self.pool is not None
        self.tests = [self._test(t) for t in tests]
        self.connect([t.plan for t in self.tests])
        self.position = (0, 0)
        self.buffers = None
        self._prepare_next()
        self.channel.send(protocol.ready(self.rank, self.describe_connections()))

    def _test(self, message: dict[str, Any]) -> Test:
        """One test of the schedule: this rank's plan of its collective, or of its program
        (composed here, each rank its own, as the launcher checked they compose)."""
        assert self.peers is not None
        layout = self.peers.layout
        result = None
        if "program" in message:
            program = Program.from_message(message["program"])
            plan = compose(program, layout, self.rank, self.registry)
            result = expected(program, layout, self.rank)
        else:
            algorithm = self.registry.get(message["collective"], message["algorithm"])
            plan = algorithm.plan(layout, self.rank, int(message["count"]))
        return Test(
            int(message["id"]), plan, int(message["warmup"]), int(message["iterations"]), result
        )

    def connect(self, plans: list[Plan]) -> None:
        """Open every connection the plans need (those already open are kept)."""
        assert self.peers is not None and self.pool is not None
        channels = int(self.options.get("channels", 1))
        pinned = {
            ConnectionKey(int(s), int(d), int(c)): int(port)
            for s, d, c, port in self.options.get("source_ports", [])
        }
        layout = self.peers.layout
        outgoing: dict[ConnectionKey, Route] = {}
        incoming: set[ConnectionKey] = set()
        for plan in plans:
            for peer in plan.send_peers():
                link = "nvlink" if layout.same_server(self.rank, peer) else "fabric"
                src_ip = self.listener.endpoints[link].ip
                for c in range(channels):
                    key = ConnectionKey(self.rank, peer, c)
                    outgoing[key] = Route(
                        link, Endpoint(src_ip, pinned.get(key, 0)), self.peers.endpoint(peer, link)
                    )
            for peer in plan.recv_peers():
                incoming.update(ConnectionKey(peer, self.rank, c) for c in range(channels))
        timeout = float(self.options.get("connect_timeout", 30.0))
        self.pool.establish(self.listener, outgoing, incoming, timeout)

    def describe_connections(self) -> list[dict[str, Any]]:
        assert self.pool is not None
        return [
            {
                "index": c.index,
                "src": c.key.src,
                "dst": c.key.dst,
                "channel": c.key.channel,
                "link": c.link,
                "outgoing": c.outgoing,
                "five_tuple": [
                    c.src_address.ip,
                    c.src_address.port,
                    c.dst_address.ip,
                    c.dst_address.port,
                ],
                "rto_min_us": rto.granted_us(c.sock),
            }
            for c in self.pool.order
        ]

    def _prepare_next(self) -> None:
        """Allocate and fill the buffers of the next operation (outside any timing)."""
        index, iteration = self.position
        if index >= len(self.tests):
            self.buffers = None
            return
        test = self.tests[index]
        if self.buffers is None or self.buffers.plan is not test.plan:
            self.buffers = None  # free the previous test's arrays first
            ranks = self.peers.layout.size if self.peers else 1
            self.buffers = Buffers(test.plan, ranks, self.pattern, test.result)
        elif not self.options.get("verify", True):
            return  # unchecked runs fill once per test (touching the pages before timing)
        self.buffers.fill(salt(test.id, iteration))

    def operate(
        self, test_id: int, iteration: int, count: int = 1, at: float | None = None
    ) -> None:
        """Run ``count`` operations of a test back to back from ``iteration`` on, as
        nccl-tests times its ``-n`` iterations: one barrier (the launcher's ``start``,
        which names the common instant ``at`` every rank begins at), then no other.

        Iteration i counts from the end of iteration i - 1 on this rank (the first from
        ``at``), so the times of a batch add up to its whole duration, from the common
        start to this rank's last delivery. Between two operations the rank checks the
        one that ended and fills the next (in-place algorithms overwrite their input);
        that time falls into the next iteration, is recorded as its ``verify`` phase, and
        only ever makes a time longer. A rank that gets ``start`` after ``at`` still
        counts from ``at``. A batch that reaches beyond the test's scheduled iterations
        lengthens the test (Launcher._timed_count: a short operation runs more often).
        """
        index, _ = self.position
        if index < len(self.tests):  # the launcher may lengthen a test's timed batch
            test = self.tests[index]
            test.iterations = max(test.iterations, iteration + count - test.warmup)
        if at is not None:
            delay = at - time.time()
            if delay > 0:
                time.sleep(delay)
        begin = at
        for k in range(count):
            begin = self._operate_one(test_id, iteration + k, begin)

    def _operate_one(self, test_id: int, iteration: int, begin: float | None) -> float:
        """One operation from ``begin`` (epoch seconds; None: now); returns when it ended."""
        index, expected_iteration = self.position
        if index >= len(self.tests) or (self.tests[index].id, expected_iteration) != (
            test_id,
            iteration,
        ):
            raise ProtocolError(f"start of test {test_id} iteration {iteration} out of order")
        test, buffers, executor = self.tests[index], self.buffers, self.executor
        assert buffers is not None and executor is not None
        self.progress.begin(test_id, iteration)
        args = self.args
        if args.hang_rank == self.rank and self.global_iteration == args.hang_at_iteration:
            while True:  # a stuck kernel: the heartbeat goes on, the work does not
                time.sleep(3600)
        corrupt = args.corrupt_rank == self.rank and args.corrupt_iteration in (
            -1,
            self.global_iteration,
        )
        outcome = executor.run(test.plan, buffers, self.progress, start=begin, corrupt=corrupt)
        end = outcome.start + outcome.time_us / 1e6
        if self._verify_phase is not None:  # the gap before this operation's first step
            outcome.phases.insert(0, ["verify", -1, *self._verify_phase])
        check0 = time.time()
        wrong = buffers.check(salt(test_id, iteration)) if self.options.get("verify", True) else -1
        self.global_iteration += 1
        iteration += 1
        self.position = (index, iteration) if iteration < test.total else (index + 1, 0)
        self._prepare_next()
        self._verify_phase = (check0, time.time())
        self.progress.end()
        self.channel.send(
            protocol.done(
                self.rank,
                test_id,
                iteration - 1,
                start=outcome.start,
                time_us=outcome.time_us,
                phases=outcome.phases,
                traffic=outcome.traffic,
                wrong=wrong,
            )
        )
        return end

    def finish(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()  # it may hold samples it has drained but not sent yet
        if self.sampler is not None:
            self.sampler.stop()
            self._ship_samples()
        self.channel.send(protocol.simple(protocol.BYE, rank=self.rank))
        if self.pool is not None:
            self.pool.close()
        self.listener.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.nvlink_ip:
        args.nvlink_ip = args.fabric_ip
    try:
        channel = Channel.connect(args.socket)
    except OSError as error:
        print(
            f"worker {args.rank}: cannot reach the launcher at {args.socket}: {error}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        listener = Listener({"fabric": args.fabric_ip, "nvlink": args.nvlink_ip}, args.port)
    except OSError as error:
        channel.send(protocol.failed(args.rank, f"cannot listen: {error}"))
        return EXIT_FAILED
    worker = Worker(args, channel, listener)
    try:
        return worker.run()
    except (TransportError, StepFailed) as error:
        return _report_and_wait(worker, str(error), error.peer)
    except (ProtocolError, ValueError, KeyError, OSError) as error:
        return _report_and_wait(worker, f"{type(error).__name__}: {error}", None)


def _report_and_wait(worker: Worker, error: str, peer: int | None) -> int:
    """Tell the launcher, then wait for its abort (the control reader exits the process):
    staying alive keeps a dead process meaning 'this rank died', not 'it saw a failure'."""
    print(f"worker {worker.rank}: {error}", file=sys.stderr, flush=True)
    if not worker.reading:
        return EXIT_FAILED
    try:
        worker.channel.send(protocol.failed(worker.rank, error, peer))
    except OSError:
        return EXIT_FAILED
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        try:
            message = worker.inbox.get(timeout=1.0)
        except queue.Empty:
            continue
        if message is None or message["type"] == protocol.FINISH:
            break
    return EXIT_FAILED
