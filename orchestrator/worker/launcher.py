"""The orchestrator's side of the workers: start them, coordinate them, watch them, report.

:class:`Launcher` owns a Unix socket on the shared file system and the worker processes it
spawned; nothing else. It does the rendezvous (each worker reports its rank and listening
addresses), hands out the peer table, runs collectives as nccl-tests does (the warm-up
iterations, then the timed ones, each a batch run back to back after one barrier from a
common start instant), collects timings, timelines, per-connection byte counts and #wrong,
and turns them into nccl-tests rows. Usage::

    workers = workers_from_description(description)      # or loopback_workers(4, 2)
    spawn = lambda worker, argv, log: net[worker.host].popen(argv, stdout=log, stderr=STDOUT)
    with Launcher(workers, spawn=spawn, options=LaunchOptions(iterations=5)) as launcher:
        result = launcher.run([CollectiveTest("all-reduce", "ring", 1 << 20)])
    print(result.table())
    result.raise_for_failure()

What a launch is given (the ranks, the tests, the options) is plain data in
:mod:`orchestrator.worker.spec`; what it returns (timings, samples, the failure) in
:mod:`orchestrator.worker.outcome`. This module is the process machinery between them.

Failure detection (each within seconds, reported by rank and host, ending the run):

- a worker process exits (``poll()`` every 50 ms);
- a worker stops sending heartbeats for ``heartbeat_timeout`` (frozen process, lost host);
- a step runs longer than ``step_deadline``: the heartbeats say who waits for whom; a rank
  that waits for nobody is *hung*; if everyone waits for someone, the run is *stalled* and
  the report names the waits (a network problem);
- a worker reports an error (a connection reset, a protocol error).

Evidence is gathered for a short settling time before blaming, so a dead rank is named
rather than the peers that saw its connections close. Then every worker is told to abort
and any still running after ``exit_timeout`` is killed; only processes this launcher
spawned are touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import IO, Any, Protocol

from orchestrator import REPO
from orchestrator.collectives.ceilings import timed_count
from orchestrator.collectives.latency import LatencyTable
from orchestrator.collectives.plans import (
    ELEMENT_BYTES,
    Layout,
    PlanError,
    default_registry,
    element_count,
)
from orchestrator.collectives.program import Program, compose_all
from orchestrator.worker import protocol
from orchestrator.worker.outcome import (
    BLAME_ORDER,
    ERROR,
    EXITED,
    HUNG,
    STALLED,
    TIMEOUT,
    UNRESPONSIVE,
    CollectiveResult,
    ConnectionInfo,
    Failure,
    IterationResult,
    PhaseRecord,
    Problem,
    RankIteration,
    RunResult,
    TcpInfoRecord,
    ThroughputSample,
)
from orchestrator.worker.protocol import LineBuffer, Message, ProtocolError
from orchestrator.worker.spec import CollectiveTest, LaunchOptions, WorkerSpec
from orchestrator.worker.transport import TCP_VIEW_FIELDS, TcpView
from topologies.errors import EmulationError, ExperimentError
from topologies.fivetuple import FiveTuple

SOCKET_NAME = "workers.sock"
_UNIX_PATH_MAX = 107
#: How far ahead of ``start`` a batch begins (Launcher._start_at). Measured: a worker on a
#: loaded 2-core machine takes up to a few milliseconds to wake for a message.
START_LEAD_S = 0.02
START_LEAD_PER_RANK_S = 0.001
#: How often the ranks' progress is written for the live view (it redraws twice a second)
LIVE_INTERVAL_S = 0.2
#: Chunks of 64 KiB read from one worker before the launcher looks elsewhere (Launcher._read)
READS_PER_TURN = 4


# --- spawning workers -------------------------------------------------------------------------


class WorkerProcess(Protocol):
    """What ``spawn`` returns: subprocess.Popen and Mininet's ``host.popen`` both fit."""

    pid: int

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Spawn = Callable[[WorkerSpec, list[str], IO[bytes]], WorkerProcess]


def local_spawn(worker: WorkerSpec, argv: list[str], log: IO[bytes]) -> WorkerProcess:
    """Start a worker on this host (loopback runs and tests)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
    )


def worker_argv(worker: WorkerSpec, socket_path: str, options: LaunchOptions) -> list[str]:
    return [
        options.python,
        "-m",
        "orchestrator.worker",
        "--rank",
        str(worker.rank),
        "--socket",
        socket_path,
        "--host",
        worker.host,
        "--fabric-ip",
        worker.fabric_ip,
        "--nvlink-ip",
        worker.nvlink_ip,
        *options.worker_args,
    ]


# --- the launcher -----------------------------------------------------------------------------


class _Abort(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(str(failure))
        self.failure = failure


@dataclass
class _Link:
    """The launcher's end of one worker's control connection."""

    sock: socket.socket
    buffer: LineBuffer = field(default_factory=LineBuffer)
    rank: int | None = None


@dataclass
class _Rank:
    spec: WorkerSpec
    process: WorkerProcess
    log_path: Path
    log: IO[bytes]
    link: _Link | None = None
    hello: Message | None = None
    ready: Message | None = None
    # the current batch's done messages, by iteration
    dones: dict[int, Message] = field(default_factory=dict)
    # iteration -> when its step 0 began (epoch s), by the heartbeats: an operation's
    # entry before its done message (the live diagnosis reads stragglers from it)
    entering: dict[int, float] = field(default_factory=dict)
    failed: Message | None = None
    heartbeat: Message | None = None
    heartbeat_at: float = 0.0
    seen_at: float = 0.0  # any message
    closed_at: float | None = None  # control connection closed
    bye: bool = False
    connections: dict[int, ConnectionInfo] = field(default_factory=dict)
    # samples shipped before the launcher knew the rank's connections (the handshake's
    # bytes, moved while the other ranks were still connecting): kept until it does
    early: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class LiveView:
    """A copy of what a launch has produced so far (:meth:`Launcher.live_view`)."""

    connections: list[ConnectionInfo]
    samples: list[ThroughputSample]
    tcp_info: list[TcpInfoRecord]
    # rank -> iteration -> (start, seconds, when its first step began or None)
    dones: dict[int, dict[int, tuple[float, float, float | None]]]
    warmup: int
    # rank -> iteration -> when its step 0 began (epoch s), of operations still running
    entering: dict[int, dict[int, float]] = field(default_factory=dict)


class Launcher:
    def __init__(
        self,
        workers: Sequence[WorkerSpec],
        *,
        spawn: Spawn = local_spawn,
        options: LaunchOptions | None = None,
        run_dir: str | Path | None = None,
        live: str | Path | None = None,
        clock_offsets: Mapping[str, float] | None = None,
    ) -> None:
        self.workers = sorted(workers, key=lambda w: w.rank)
        # host -> its clock minus this one's, seconds (a cluster's other machines,
        # measured at bring-up): times to and from its workers are moved by it
        self.clock_offsets = dict(clock_offsets or {})
        # where the ranks' progress goes while a batch runs (the live view reads it;
        # orchestrator.monitor.live); None: nowhere
        self.live = Path(live) if live is not None else None
        self._live_at = 0.0
        self._operation: dict[str, Any] | None = None
        if [w.rank for w in self.workers] != list(range(len(self.workers))):
            raise ValueError("workers must have ranks 0..n-1, each once")
        self.layout = Layout(
            tuple(w.server for w in self.workers), tuple(w.local_rank for w in self.workers)
        )
        self.spawn = spawn
        self.options = options or LaunchOptions()
        self.registry = default_registry()  # the same algorithms the workers know
        self._own_dir = run_dir is None
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.socket_path = ""
        self._ranks: dict[int, _Rank] = {}
        self._server: socket.socket | None = None
        self._selector = selectors.DefaultSelector()
        self._next_test_id = 0
        self._setup_sent_at: float | None = None
        self._samples: list[ThroughputSample] = []
        self._tcp_info: list[TcpInfoRecord] = []
        self._awaiting_done = False
        self._batch = 0  # operations in the batch being awaited
        self.failure: Failure | None = None
        self._closed = False
        # told the common start of every batch (epoch s) and whether it is a warm-up: the
        # fault scheduler counts `at` from the first timed one (orchestrator.testbed.faults)
        self.on_batch: Callable[[float, bool], None] | None = None
        self._send_lock = threading.Lock()  # set_late may come from another thread
        self._live_connections: list[ConnectionInfo] = []
        # asked while waiting for the workers: True stops the wait with KeyboardInterrupt
        # (a Ctrl-C the runner noted, whose own KeyboardInterrupt may have been lost)
        self.interrupted: Callable[[], bool] | None = None

    def live_view(self) -> LiveView:
        """What the running batch has produced so far, copied for another thread (the live
        diagnosis): the connections, their samples and kernel view, every rank's
        completed operations (iteration -> (start, seconds, first step's start)), how
        many are warm-ups, and when the step 0 of those still running began."""
        for _ in range(3):  # a dict the main thread grows while it is copied: try again
            try:
                dones = {
                    r: {
                        i: (float(m["start"]), float(m["time_us"]) / 1e6, _first_step(m))
                        for i, m in dict(rank.dones).items()
                    }
                    for r, rank in list(self._ranks.items())
                }
                entering = {
                    r: {i: t for i, t in dict(rank.entering).items() if i not in dones[r]}
                    for r, rank in list(self._ranks.items())
                }
                break
            except RuntimeError:
                continue
        else:
            dones, entering = {}, {}
        return LiveView(
            list(self._live_connections),
            list(self._samples),
            list(self._tcp_info),
            dones,
            self.options.warmup,
            entering,
        )

    # --- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Launcher:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Spawn every worker, wait for their hellos, send the peer table."""
        if self.run_dir is None:
            self.run_dir = Path(tempfile.mkdtemp(prefix="astral-workers-"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path = str(self.run_dir.resolve() / SOCKET_NAME)
        if len(self.socket_path.encode()) > _UNIX_PATH_MAX:
            raise EmulationError(
                f"worker socket path {self.socket_path} is longer than {_UNIX_PATH_MAX} bytes; "
                "use a shorter run directory"
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(max(16, len(self.workers)))
        server.setblocking(False)
        self._server = server
        self._selector.register(server, selectors.EVENT_READ, None)
        for worker in self.workers:
            log_path = self.run_dir / f"worker-{worker.rank}.log"
            log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
            argv = worker_argv(worker, self.socket_path, self.options)
            try:
                process = self.spawn(worker, argv, log)
            except OSError as error:
                log.close()
                raise EmulationError(
                    f"cannot start the worker of rank {worker.rank} on {worker.host}: {error}"
                ) from error
            now = time.monotonic()
            self._ranks[worker.rank] = _Rank(worker, process, log_path, log, seen_at=now)
        try:
            self._await(
                "hello", lambda r: r.hello is not None, self.options.setup_timeout, "start-up"
            )
        except _Abort as abort:
            self._fail(abort.failure)
            raise EmulationError(str(abort.failure)) from None
        peers = [
            {
                "rank": w.rank,
                "host": w.host,
                "server": w.server,
                "local_rank": w.local_rank,
                "listen": self._ranks[w.rank].hello["listen"],  # type: ignore[index]
            }
            for w in self.workers
        ]
        o = self.options
        setup = protocol.setup(
            peers,
            {
                "channels": o.channels,
                "socket_buffer": o.socket_buffer,
                "verify": o.verify,
                "heartbeat_interval": o.heartbeat_interval,
                "sample_interval": o.sample_interval,
                "tcp_info": o.tcp_info_interval if o.tcp_info else 0.0,
                "connect_timeout": o.setup_timeout,
                "source_ports": [[s, d, c, p] for (s, d, c), p in o.source_ports.items()],
                "latency": (o.latency if o.latency is not None else LatencyTable()).to_message(),
            },
        )
        self._broadcast(setup)
        self._setup_sent_at = time.monotonic()
        for rank in self._ranks.values():
            rank.heartbeat_at = self._setup_sent_at

    def close(self) -> None:
        """End the run: finish (or abort) every worker, kill what is left, clean up.

        The graceful part (the farewell, the exit grace, the last messages) may be cut
        short by Ctrl-C or SIGTERM; what follows it runs anyway, so an interrupted close
        still kills every worker it started (and a second close has nothing left to do)."""
        if self._closed:
            return
        self._closed = True
        try:
            farewell = protocol.simple(protocol.FINISH if self.failure is None else protocol.ABORT)
            self._broadcast(farewell)
            grace = self.options.exit_timeout if self.failure is None else 1.0
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(
                r.process.poll() is None for r in self._ranks.values()
            ):
                self._pump(0.05)
            for rank in self._ranks.values():  # what a worker sent just before exiting
                if rank.link is not None and rank.closed_at is None:
                    self._read(rank.link)
        finally:
            self._kill_and_clean()

    def _kill_and_clean(self) -> None:
        """Kill the workers still running, close every file and socket, remove the
        control socket (and the run directory when it is the launcher's own)."""
        for rank in self._ranks.values():
            if rank.process.poll() is None:
                with contextlib.suppress(OSError):
                    rank.process.kill()
                with contextlib.suppress(Exception):
                    rank.process.wait(timeout=2.0)
            rank.log.close()
            if rank.link is not None:
                rank.link.sock.close()
        self._selector.close()
        if self._server is not None:
            self._server.close()
        if self.socket_path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        if self._own_dir and self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        """The workers' process ids (those ``spawn`` returned with one)."""
        return [
            pid
            for rank in self._ranks.values()
            if isinstance(pid := getattr(rank.process, "pid", None), int)
        ]

    def process(self, rank: int) -> WorkerProcess:
        """The process of ``rank`` (as ``spawn`` returned it)."""
        return self._ranks[rank].process

    def _fail(self, failure: Failure) -> None:
        """Abort every worker at once (they may be stuck mid-step) and remember why."""
        self.failure = failure
        self._broadcast(protocol.simple(protocol.ABORT))

    # --- running collectives --------------------------------------------------------------------

    def prepare(self, tests: Sequence[CollectiveTest]) -> list[CollectiveResult]:
        """Check the tests against the registry and the layout; no worker involved."""
        results = []
        n = self.layout.size
        for i, test in enumerate(tests):
            if test.program is not None:
                results.append(self._prepare_program(i, test, test.program))
                continue
            try:
                algorithm = self.registry.get(test.collective, test.algorithm)
            except PlanError as error:
                raise ExperimentError(
                    None,
                    f"tests[{i}]",
                    "a known collective/algorithm",
                    test.label,
                    detail=str(error),
                ) from None
            count = element_count(test.collective, test.size, n)
            if count <= 0:
                raise ExperimentError(
                    None, f"tests[{i}].size", f"at least {n * ELEMENT_BYTES} bytes", test.size
                )
            try:
                plans = [algorithm.plan(self.layout, r, count) for r in range(n)]
            except PlanError as error:
                raise ExperimentError(
                    None,
                    f"tests[{i}]",
                    "an algorithm this layout supports",
                    test.label,
                    detail=str(error),
                ) from None
            expected = {p.rank: sum(p.bytes_sent().values()) for p in plans}
            results.append(CollectiveResult(test, n, count, expected))
        return results

    def _prepare_program(self, i: int, test: CollectiveTest, program: Program) -> CollectiveResult:
        """A program's test, checked by composing every rank's plan as its worker will."""
        try:
            plans = compose_all(program, self.layout, self.registry)
        except PlanError as error:
            raise ExperimentError(
                None, f"tests[{i}]", "a program this layout runs", test.label, detail=str(error)
            ) from None
        expected = {p.rank: sum(p.bytes_sent().values()) for p in plans}
        return CollectiveResult(test, self.layout.size, program.elements(), expected)

    def run(self, tests: Sequence[CollectiveTest]) -> RunResult:
        """Run ``tests`` in order: each ``warmup`` times, then ``iterations`` times, each
        of the two a batch of back-to-back operations after one barrier (the timed ones
        in batches of ``timed_batch`` each, when the options say so). On a worker
        failure the result carries ``failure`` and what completed; the workers are then
        gone and the launcher cannot run again."""
        if self.failure is not None:
            raise EmulationError(f"the workers already failed: {self.failure}")
        if self._setup_sent_at is None:
            raise EmulationError("Launcher.run before start (use it as a context manager)")
        results = self.prepare(tests)
        result = RunResult()
        self._samples = result.samples
        self._tcp_info = result.tcp_info
        o = self.options
        ids = list(range(self._next_test_id, self._next_test_id + len(results)))
        self._next_test_id += len(results)
        stage = "connection set-up"
        try:
            for rank in self._ranks.values():
                rank.ready = None
            self._broadcast(
                protocol.schedule(
                    [
                        {
                            "id": test_id,
                            "collective": r.test.collective,
                            "algorithm": r.test.algorithm,
                            "count": r.count,
                            "warmup": o.warmup,
                            "iterations": o.iterations,
                            **_program_message(r.test),
                        }
                        for test_id, r in zip(ids, results, strict=True)
                    ]
                )
            )
            self._await("ready", lambda r: r.ready is not None, o.setup_timeout * 2, stage)
            result.connections = self._connections()
            self._live_connections = list(result.connections)
            for test_id, test_result in zip(ids, results, strict=True):
                result.tests.append(test_result)
                for first, warmup in ((0, True), (o.warmup, False)):
                    count = o.warmup if warmup else self._timed_count(test_result)
                    # the timed iterations in batches of ``timed_batch`` (0: one batch)
                    size = o.timed_batch if o.timed_batch and not warmup else count
                    for begin in range(first, first + count, max(size, 1)):
                        n = min(size, first + count - begin)
                        stage = f"{test_result.test.label} iterations {begin}-{begin + n - 1}"
                        self._operate(test_result, test_id, begin, n, warmup, stage)
            self._await_samples()
        except _Abort as abort:
            self._fail(abort.failure)
            result.failure = abort.failure
        return result

    def _operate(
        self,
        into: CollectiveResult,
        test_id: int,
        first: int,
        count: int,
        warmup: bool,
        stage: str,
    ) -> None:
        """One batch: iterations ``first`` .. ``first + count - 1`` back to back on every
        rank, after one barrier (this call starts only when every rank has answered the
        previous batch), all ranks counting from the same instant (:meth:`_start_at`).
        The iterations every rank completed are added to ``into``, also when the batch
        fails part way."""
        for rank in self._ranks.values():
            rank.dones, rank.entering = {}, {}
        self._awaiting_done, self._batch = True, count
        test = into.test
        self._operation = {
            "collective": test.collective,
            "algorithm": test.algorithm,
            "size": into.size,
            "warmup": warmup,
            "first": first,
            "count": count,
            "since": time.time(),
        }
        at = self._start_at()
        if self.on_batch is not None:
            self.on_batch(at, warmup)
        self._broadcast(protocol.start(test_id, first, count, at))
        try:
            self._await("done", lambda r: len(r.dones) >= count, None, stage)
        finally:
            self._awaiting_done = False
            self._write_live(force=True)
            into.iterations += self._completed(test_id, range(first, first + count), warmup)
        wanted = set(range(first, first + count))
        wrong = tuple(
            Problem(r, rank.spec.host, ERROR, "answered the wrong operation")
            for r, rank in self._ranks.items()
            if set(rank.dones) != wanted or any(m["test"] != test_id for m in rank.dones.values())
        )
        if wrong:
            raise _Abort(Failure(stage, wrong))

    def _completed(self, test_id: int, wanted: range, warmup: bool) -> list[IterationResult]:
        """The iterations of ``wanted`` that every rank has answered, in order, up to the
        first one some rank has not (answers for other operations are ignored)."""
        out = []
        for i in wanted:
            messages = {r: rank.dones.get(i) for r, rank in self._ranks.items()}
            if any(m is None or m["test"] != test_id for m in messages.values()):
                break
            result = IterationResult(i, warmup)
            for r, message in messages.items():
                assert message is not None
                rank = self._ranks[r]
                traffic = tuple(
                    (rank.connections[index], sent, received)
                    for index, sent, received in message["traffic"]
                    if index in rank.connections
                )
                result.ranks[r] = RankIteration(
                    rank=r,
                    start=float(message["start"]),
                    time_us=float(message["time_us"]),
                    wrong=int(message["wrong"]),
                    sent=sum(t[1] for t in traffic),
                    received=sum(t[2] for t in traffic),
                    phases=tuple(
                        PhaseRecord(p[0], int(p[1]), p[2], p[3]) for p in message["phases"]
                    ),
                    traffic=traffic,
                )
            out.append(result)
        return out

    def _timed_count(self, result: CollectiveResult) -> int:
        """How many operations the timed batch runs: ``iterations``, or more where the
        warm-up says an operation is so short that the batch would last less than
        ``min_batch_seconds`` (at most ``max_iterations``)."""
        o = self.options
        warm = [i.time_us for i in result.iterations if i.warmup and i.ranks]
        per_operation = fmean(warm) / 1e6 if warm else 0.0
        return timed_count(o.iterations, per_operation, o.min_batch_seconds, o.max_iterations)

    def _start_at(self) -> float:
        """The common instant a batch begins at (epoch seconds): far enough ahead that
        every worker has the start message and is waiting when it comes (the launcher
        writes to n sockets; each worker's control thread hands it to the main thread),
        so that no rank's data reaches a peer that has not begun counting yet. A rank
        that is late anyway counts from this instant too: lateness makes times longer,
        never shorter."""
        return time.time() + START_LEAD_S + START_LEAD_PER_RANK_S * len(self._ranks)

    def _await_samples(self) -> None:
        """Wait (briefly) for a heartbeat sent after the last operation from every rank:
        the samples of that operation travel ahead of it."""
        after = time.monotonic()
        deadline = after + 2 * self.options.heartbeat_interval + 0.5
        while time.monotonic() < deadline:
            if all(r.heartbeat_at > after for r in self._ranks.values()):
                return
            self._pump(0.02)

    def _connections(self) -> list[ConnectionInfo]:
        seen: dict[tuple[int, int, int], ConnectionInfo] = {}
        for rank in self._ranks.values():
            assert rank.ready is not None
            for c in rank.ready["connections"]:
                info = ConnectionInfo(
                    src=int(c["src"]),
                    dst=int(c["dst"]),
                    channel=int(c["channel"]),
                    link=str(c["link"]),
                    five_tuple=FiveTuple(*c["five_tuple"]),
                    rto_min_us=c.get("rto_min_us"),
                )
                rank.connections[int(c["index"])] = info
                if c["outgoing"]:
                    seen[(info.src, info.dst, info.channel)] = info
        for number, rank in self._ranks.items():
            early, rank.early = rank.early, []
            for message in early:
                self._take_samples(number, rank, message)
            rank.early = []  # still unknown: not this launch's
        return [seen[key] for key in sorted(seen)]

    def _take_samples(self, number: int, rank: _Rank, message: Message) -> None:
        """A SAMPLES message of rank ``number`` into the run's samples and kernel views;
        rows of a connection the launcher does not know yet wait in ``rank.early`` for
        :meth:`_connections` (a row still unknown then is dropped)."""
        unknown: Message = {"samples": [], "tcp": []}
        for row in message["samples"]:
            t, index, nbytes = row
            connection = rank.connections.get(int(index))
            if connection is None:
                unknown["samples"].append(row)
            else:
                self._samples.append(ThroughputSample(number, connection, t, int(nbytes)))
        for row in message.get("tcp", ()):
            t, index, *fields = row
            connection = rank.connections.get(int(index))
            if connection is None:
                unknown["tcp"].append(row)
            elif len(fields) == len(TCP_VIEW_FIELDS):
                view = TcpView(*(int(v) for v in fields))
                self._tcp_info.append(TcpInfoRecord(number, connection, t, view))
        if unknown["samples"] or unknown["tcp"]:
            rank.early.append(unknown)

    # --- the event loop -------------------------------------------------------------------------

    def _broadcast(self, message: Message) -> None:
        data = protocol.encode(message)
        for rank in list(self._ranks.values()):
            offset = self.clock_offsets.get(rank.spec.host, 0.0)
            own = protocol.encode(protocol.shift_clock(message, offset)) if offset else data
            self._send(rank, own)

    def _send(self, rank: _Rank, data: bytes) -> None:
        with self._send_lock:
            if rank.link is not None and rank.closed_at is None:
                try:
                    _send_all(rank.link.sock, data, timeout=1.0)
                except OSError:
                    rank.closed_at = time.monotonic()

    def set_late(self, rank: int, seconds: float) -> None:
        """Make ``rank`` enter every following operation ``seconds`` late (0: on time),
        a straggler; safe to call from another thread while a batch runs."""
        if rank not in self._ranks:
            raise ValueError(f"no rank {rank} in this launch")
        self._send(self._ranks[rank], protocol.encode(protocol.late(seconds)))

    def _await(
        self,
        what: str,
        arrived: Callable[[_Rank], bool],
        timeout: float | None,
        stage: str,
    ) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._pump(0.05)
            if self.interrupted is not None and self.interrupted():
                raise KeyboardInterrupt
            missing = [r for r in self._ranks.values() if not arrived(r)]
            if not missing:
                return
            if self._problems(setup_phase=self._setup_sent_at is None):
                failure = self._diagnose(stage)
                if failure is not None:
                    raise _Abort(failure)
            if deadline is not None and time.monotonic() > deadline:
                culprits = tuple(
                    Problem(r.spec.rank, r.spec.host, TIMEOUT, f"sent no {what} in {timeout} s")
                    for r in missing
                )
                raise _Abort(Failure(stage, culprits))

    def _write_live(self, force: bool = False) -> None:
        """The ranks' progress into :attr:`live` (atomically, at most every
        :data:`LIVE_INTERVAL_S`): the operation running, and per rank the operations of
        the batch it has finished and where its last heartbeat put it."""
        now = time.time()
        if self.live is None or (not force and now - self._live_at < LIVE_INTERVAL_S):
            return
        self._live_at = now
        ranks = {}
        for r, rank in self._ranks.items():
            beat = rank.heartbeat or {}
            ranks[str(r)] = {
                "host": rank.spec.host,
                "done": len(rank.dones),
                "busy": bool(beat.get("busy", False)),
                "iteration": beat.get("iteration"),
                "step": beat.get("step"),
                "phase": beat.get("phase", ""),
                "elapsed": beat.get("elapsed", 0.0),
                "waiting_on": beat.get("waiting_on", []),
                "failed": rank.failed is not None,
            }
        document = {"t": now, "pid": os.getpid(), "operation": self._operation, "ranks": ranks}
        tmp = self.live.with_name(f".{self.live.name}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(document, separators=(",", ":")))
            os.replace(tmp, self.live)

    def _pump(self, timeout: float) -> None:
        """Accept and read whatever is waiting (a bounded share of each connection: _read)."""
        self._write_live()
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                assert self._server is not None
                with contextlib.suppress(BlockingIOError):
                    sock, _ = self._server.accept()
                    sock.setblocking(False)
                    self._selector.register(sock, selectors.EVENT_READ, _Link(sock))
                continue
            self._read(key.data)

    def _read(self, link: _Link) -> None:
        """Read what ``link`` holds, at most :data:`READS_PER_TURN` chunks: a worker that
        writes faster than this thread reads (a million tiny operations, a DONE each) must
        not keep it here, where it asks neither the other ranks nor the noted Ctrl-C."""
        for _ in range(READS_PER_TURN):
            try:
                data = link.sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._selector.unregister(link.sock)
                if link.rank is not None:
                    self._ranks[link.rank].closed_at = time.monotonic()
                else:
                    link.sock.close()
                return
            try:
                for message in link.buffer.feed(data):
                    self._handle(link, message)
            except ProtocolError:
                if link.rank is not None:
                    self._ranks[link.rank].failed = protocol.failed(link.rank, "garbled messages")
                return

    def _handle(self, link: _Link, message: Message) -> None:
        kind = message["type"]
        rank_id = message.get("rank")
        if kind == protocol.HELLO:
            if not isinstance(rank_id, int) or rank_id not in self._ranks:
                return
            rank = self._ranks[rank_id]
            if rank.link is not None or message.get("version") != protocol.VERSION:
                rank.failed = protocol.failed(rank_id, "a second or incompatible hello")
                return
            link.rank, rank.link, rank.hello = rank_id, link, message
        if link.rank is None:
            return
        rank = self._ranks[link.rank]
        offset = self.clock_offsets.get(rank.spec.host, 0.0)
        message = protocol.shift_clock(message, -offset)  # onto this machine's clock
        now = time.monotonic()
        rank.seen_at = now
        if kind == protocol.HEARTBEAT:
            rank.heartbeat, rank.heartbeat_at = message, now
            if message.get("busy") and message.get("entered") is not None:
                rank.entering[int(message["iteration"])] = float(message["entered"])
        elif kind == protocol.SAMPLES:
            self._take_samples(link.rank, rank, message)
        elif kind == protocol.READY:
            rank.ready = message
        elif kind == protocol.DONE:
            rank.dones[int(message["iteration"])] = message
        elif kind == protocol.FAILED:
            rank.failed = message
        elif kind == protocol.BYE:
            rank.bye = True

    # --- failure detection ----------------------------------------------------------------------

    def _problems(self, setup_phase: bool) -> list[Problem]:
        """Everything wrong right now, by rank (empty when all is well)."""
        o, now = self.options, time.monotonic()
        problems: list[Problem] = []
        for r, rank in self._ranks.items():
            host = rank.spec.host
            status = rank.process.poll()
            if status is not None and not rank.bye:
                problems.append(Problem(r, host, EXITED, self._exit_detail(rank, status)))
                continue
            if rank.closed_at is not None and not rank.bye and now - rank.closed_at > 1.0:
                problems.append(Problem(r, host, EXITED, "closed its control connection"))
                continue
            if rank.failed is not None:
                problems.append(Problem(r, host, ERROR, f"reported: {rank.failed['error']}"))
            if setup_phase or rank.bye:
                continue
            silent = now - max(rank.heartbeat_at, rank.seen_at)
            if silent > o.heartbeat_timeout:
                problems.append(
                    Problem(r, host, UNRESPONSIVE, f"sent no heartbeat for {silent:.1f} s")
                )
        if self._awaiting_done:
            problems += self._stalls(now)
        return problems

    def _stalls(self, now: float) -> list[Problem]:
        """Ranks whose current step has outlived ``step_deadline``, by the heartbeats."""
        states = {}
        for r, rank in self._ranks.items():
            beat = rank.heartbeat
            if len(rank.dones) < self._batch and beat is not None and beat["busy"]:
                states[r] = (
                    float(beat["elapsed"]) + now - rank.heartbeat_at,
                    list(beat["waiting_on"]),
                    beat,
                )
        return diagnose_stalls(
            states, self.options.step_deadline, {r: k.spec.host for r, k in self._ranks.items()}
        )

    def _diagnose(self, stage: str) -> Failure | None:
        """Gather evidence for ``settle_time``, then blame: exited > unresponsive > hung >
        stalled > error reports. None if the problem went away (a late heartbeat)."""
        deadline = time.monotonic() + self.options.settle_time
        while time.monotonic() < deadline:
            self._pump(0.05)
        problems = self._problems(setup_phase=self._setup_sent_at is None)
        for kind in BLAME_ORDER:
            culprits = tuple(p for p in problems if p.kind == kind)
            if culprits:
                others = tuple(p for p in problems if p.kind != kind)
                return Failure(stage, culprits, others)
        return Failure(stage, tuple(problems)) if problems else None

    def _exit_detail(self, rank: _Rank, status: int) -> str:
        detail = f"exited with status {status}"
        with contextlib.suppress(OSError):
            rank.log.flush()
            tail = rank.log_path.read_bytes()[-400:].decode(errors="replace").strip()
            if tail:
                detail += f" (log: ...{tail.splitlines()[-1]})"
        return detail


def _program_message(test: CollectiveTest) -> dict[str, Any]:
    """The schedule entry's ``program`` field, for a program's test (protocol.schedule)."""
    return {} if test.program is None else {"program": test.program.to_message()}


def _first_step(done: Message) -> float | None:
    """When step 0 of a ``done`` message's operation began (its phases' first entry)."""
    starts = [float(p[2]) for p in done.get("phases", ()) if int(p[1]) == 0]
    return min(starts) if starts else None


def _send_all(sock: socket.socket, data: bytes, timeout: float) -> None:
    """sendall for a non-blocking socket: a worker that stops reading (a frozen process)
    fails the send after ``timeout`` instead of blocking the launcher."""
    view, deadline = memoryview(data), time.monotonic() + timeout
    while view:
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [sock], [], left)[1]:
                raise TimeoutError("worker control socket full") from None


def diagnose_stalls(
    states: Mapping[int, tuple[float, list[int], Message]],
    deadline: float,
    hosts: Mapping[int, str],
) -> list[Problem]:
    """Blame for steps that outlived ``deadline``. ``states[r]``: (seconds in the current
    step, peers it waits for, its heartbeat).

    A late rank that waits for nobody is hung (it stopped working). If every late rank
    waits for someone, nothing is hung: the transfers between them are stalled, and each
    late rank is reported with whom it waits for.
    """
    late = {r: s for r, s in states.items() if s[0] > deadline}
    if not late:
        return []
    hung = [
        Problem(
            r,
            hosts.get(r, "?"),
            HUNG,
            f"made no progress for {elapsed:.1f} s in iteration {beat['iteration']} "
            f"({beat['phase']}, step {beat['step']})",
        )
        for r, (elapsed, waiting, beat) in sorted(late.items())
        if not waiting
    ]
    if hung:
        return hung
    return [
        Problem(
            r,
            hosts.get(r, "?"),
            STALLED,
            f"waited {elapsed:.1f} s for rank(s) {', '.join(map(str, waiting))} in "
            f"iteration {beat['iteration']} ({beat['phase']}, step {beat['step']})",
        )
        for r, (elapsed, waiting, beat) in sorted(late.items())
    ]
