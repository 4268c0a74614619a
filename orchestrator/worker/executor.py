"""Runs a plan over the rank's connections: one step at a time, each step's transfers at once.

A step's sends and receives go to the connections' own threads; local copies, then the
step's compute time (a sleep: emulated computation, PlanStep.compute), run meanwhile in the
calling thread; the step ends when every transfer has completed and the compute is over,
so it lasts the longer of the two, not their sum. The operation ends
when, after its last step, every connection it sent on has drained (the peer acknowledged
every byte): completion means the data arrived, not that the kernel took it. With C channels,
the bytes one step exchanges with one peer (its regions, concatenated in plan order) are
cut into C contiguous ranges, one per channel's connection; sender and receiver cut the
same way, whatever regions each side lists.

:class:`Progress` is what the heartbeat reports: the current step, how long it has run and
which peers it still waits for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from orchestrator.collectives.latency import NO_LATENCY, StepLatency
from orchestrator.collectives.plans import ELEMENT_BYTES, Plan, Region, Transfer, split
from orchestrator.worker.buffers import DTYPE, Array, Buffers, byte_view, corrupted, reduce_into
from orchestrator.worker.transport import Completion, Connection, ConnectionPool, RecvTarget

SCRATCH_BYTES = 1 << 18  # reduction slice: received, then added, while more arrives


class Progress:
    """Where the worker is, for the heartbeat thread (plain attributes; GIL-atomic)."""

    def __init__(self) -> None:
        self.busy = False
        self.test = -1
        self.iteration = -1
        self.step = -1
        self.phase = "idle"
        self.since = time.monotonic()
        self.completion: Completion | None = None
        # when the operation's step 0 began (epoch s; None before it): the heartbeat tells
        # the live diagnosis, which reads a rank's entry before the operation ends
        self.entered: float | None = None

    def enter(self, step: int, phase: str, completion: Completion | None = None) -> None:
        self.completion = completion
        self.step, self.phase, self.since = step, phase, time.monotonic()

    def begin(self, test: int, iteration: int) -> None:
        self.entered = None  # first: a heartbeat between the two lines sees no stale entry
        self.test, self.iteration, self.busy = test, iteration, True
        self.enter(-1, "starting")

    def end(self) -> None:
        self.busy = False
        self.enter(-1, "idle")

    def waiting_on(self) -> list[int]:
        completion = self.completion
        return completion.pending_peers() if completion is not None else []

    def elapsed(self) -> float:
        return time.monotonic() - self.since


@dataclass
class Outcome:
    """One operation on one rank: its time, its timeline and what it moved."""

    start: float  # epoch seconds
    time_us: float
    phases: list[list[Any]] = field(default_factory=list)  # [phase, step, start, end]
    traffic: list[list[int]] = field(default_factory=list)  # [conn index, sent, received]


class StepFailed(Exception):
    def __init__(self, message: str, peer: int | None) -> None:
        super().__init__(message)
        self.peer = peer


def _group(transfers: Iterable[Transfer]) -> dict[int, list[Transfer]]:
    by_peer: dict[int, list[Transfer]] = {}
    for t in transfers:
        by_peer.setdefault(t.peer, []).append(t)
    return by_peer


def _cut(transfers: Sequence[Transfer], start: int, count: int) -> list[Transfer]:
    """Elements [start, start + count) of the transfers' concatenated regions."""
    out: list[Transfer] = []
    position = 0
    for t in transfers:
        size = t.region.count
        lo, hi = max(start, position), min(start + count, position + size)
        if lo < hi:
            out.append(Transfer(t.peer, t.region.sub(lo - position, hi - lo), t.reduce))
        position += size
        if position >= start + count:
            break
    return out


class Executor:
    def __init__(
        self, pool: ConnectionPool, channels: int = 1, latency: StepLatency = NO_LATENCY
    ) -> None:
        self.pool = pool
        self.channels = channels
        self.latency = latency  # what each step waits before its sends (docs/latency.md)
        # seconds this rank enters every operation late, before its first step's sends (a
        # straggler fault; set by the worker's control thread, read in each operation's
        # step 0 after its latency: see run)
        self.late = 0.0
        self._scratch: dict[int, Array] = {}  # connection index -> reduction slice

    def _scratch_of(self, conn: Connection) -> Array:
        array = self._scratch.get(conn.index)
        if array is None:
            array = np.empty(SCRATCH_BYTES // ELEMENT_BYTES, dtype=DTYPE)
            self._scratch[conn.index] = array
        return array

    def run(
        self,
        plan: Plan,
        buffers: Buffers,
        progress: Progress,
        *,
        start: float | None = None,
        corrupt: bool = False,
        poll: float = 0.25,
    ) -> Outcome:
        """Run ``plan`` once. ``start`` (epoch seconds, default now) is when the operation
        counts as begun: the batch's common start for its first operation, the previous
        operation's end for the others (worker.py), so that the times of a batch add up
        to its whole duration."""
        arrays = buffers.arrays
        views = buffers.views()
        before = [(c.sent, c.received) for c in self.pool.order]
        wall0, t0 = time.time(), time.perf_counter()
        if start is not None:  # the same instant on the perf_counter clock
            t0 -= wall0 - start
            wall0 = start
        outcome = Outcome(start=wall0, time_us=0.0)
        sent_on: dict[int, Connection] = {}
        for k, step in enumerate(plan.steps):
            done = Completion()
            progress.enter(k, step.phase, done)
            s0 = time.perf_counter()
            began = wall0 + (s0 - t0)  # the step's start on the wall clock, as recorded
            if k == 0:
                progress.entered = began
            self.latency.wait(k, step)
            # inside step 0, as a latency is (emulated time), and read after the latency,
            # not as the operation begins: a straggler that comes before this rank sent
            # makes it late in this operation too (the fault scheduler's message reaches
            # the worker a moment after the batch's common start, which it names)
            if k == 0 and (late := self.late) > 0:
                time.sleep(late)
            for peer, transfers in _group(step.sends).items():
                for channel, piece in self._per_channel(transfers):
                    conn = self.pool.outgoing(peer, channel)
                    out = [views[t.region.buffer][_bytes(t.region)] for t in piece]
                    if corrupt:
                        out[0] = corrupted(out[0])
                        corrupt = False
                    conn.send(out, done)
                    sent_on[conn.index] = conn
            for peer, transfers in _group(step.recvs).items():
                for channel, piece in self._per_channel(transfers):
                    conn = self.pool.incoming(peer, channel)
                    targets = []
                    for t in piece:
                        r = t.region
                        view = views[r.buffer][_bytes(r)]
                        if t.reduce:
                            targets.append(self._reducing(conn, view, arrays[r.buffer], r))
                        else:
                            targets.append(RecvTarget(view))
                    conn.recv(targets, done)
            for copy in step.copies:
                src, dst = copy.src, copy.dst
                np.copyto(
                    arrays[dst.buffer][dst.offset : dst.offset + dst.count],
                    arrays[src.buffer][src.offset : src.offset + src.count],
                )
            if step.compute > 0:  # after posting the transfers: it overlaps them
                time.sleep(step.compute)
            _wait(done, poll, f"step {k} ({step.phase})")
            s1 = time.perf_counter()
            outcome.phases.append([step.phase, k, began, wall0 + (s1 - t0)])
        if sent_on:
            done = Completion()
            progress.enter(len(plan.steps), "delivery", done)
            s0 = time.perf_counter()
            for conn in sent_on.values():
                conn.drain(done)
            _wait(done, poll, "delivery of the last sends")
            s1 = time.perf_counter()
            outcome.phases.append(
                ["delivery", len(plan.steps), wall0 + (s0 - t0), wall0 + (s1 - t0)]
            )
        progress.enter(-1, "checking")
        outcome.time_us = (time.perf_counter() - t0) * 1e6
        for conn, (sent, received) in zip(self.pool.order, before, strict=False):
            ds, dr = conn.sent - sent, conn.received - received
            if ds or dr:
                outcome.traffic.append([conn.index, ds, dr])
        return outcome

    def _per_channel(self, transfers: list[Transfer]) -> list[tuple[int, list[Transfer]]]:
        if self.channels == 1:
            return [(0, transfers)]
        total = sum(t.region.count for t in transfers)
        return [
            (channel, _cut(transfers, start, count))
            for channel, (start, count) in enumerate(split(total, self.channels))
            if count
        ]

    def _reducing(self, conn: Connection, view: memoryview, array: Array, r: Region) -> RecvTarget:
        scratch = self._scratch_of(conn)
        dst = array[r.offset : r.offset + r.count]

        def combine(offset: int, nbytes: int) -> None:
            i, n = offset // ELEMENT_BYTES, nbytes // ELEMENT_BYTES
            reduce_into(dst[i : i + n], scratch[:n])

        return RecvTarget(view, byte_view(scratch), combine)


def _wait(done: Completion, poll: float, what: str) -> None:
    while not done.wait(poll):
        pass
    if done.error is not None:
        culprit = getattr(done.error, "peer", None)
        raise StepFailed(f"{what}: {done.error}", culprit)


def _bytes(r: Region) -> slice:
    return slice(r.offset * ELEMENT_BYTES, (r.offset + r.count) * ELEMENT_BYTES)
