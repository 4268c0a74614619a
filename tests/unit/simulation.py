"""Plans executed in memory, without sockets: every rank's buffers as numpy arrays, the
regions of each step moved between them as the executor would move them over TCP."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from orchestrator.collectives.operations import Result
from orchestrator.collectives.plans import Plan
from orchestrator.worker.buffers import Buffers, Pattern, salt


def simulate(
    plans: Sequence[Plan],
    test: int = 0,
    iteration: int = 0,
    corrupt: int = -1,
    results: Sequence[Result] | None = None,
) -> list[int]:
    """Run the plans of every rank in memory, step by step; returns #wrong per rank.

    Within a step, everything sent is read before anything received is written (the
    steps' transfers are concurrent), so the check also asserts that no step reads and
    writes the same elements. ``corrupt``: that rank's first sent element is off by one.
    ``results``: what each rank's buffers hold (default: its plan's operation's).
    """
    n = len(plans)
    pattern = Pattern()
    h = salt(test, iteration)
    buffers = [
        Buffers(plan, n, pattern, None if results is None else results[plan.rank]) for plan in plans
    ]
    for b in buffers:
        b.fill(h)
    steps = max(len(p.steps) for p in plans)
    # Ranks run their k-th steps "together" only as far as data dependencies go; here every
    # step's sends to a peer are matched, in order, with that peer's receives from us,
    # whichever step index the peer lists them under.
    streams: dict[tuple[int, int], list[np.ndarray]] = {}
    for k in range(steps):
        for plan, b in zip(plans, buffers, strict=True):
            if k >= len(plan.steps):
                continue
            step = plan.steps[k]
            written = [t.region for t in step.recvs] + [c.dst for c in step.copies]
            read = [t.region for t in step.sends] + [c.src for c in step.copies]
            for w, r in itertools.product(written, read):
                assert not (
                    w.buffer == r.buffer
                    and w.offset < r.offset + r.count
                    and r.offset < w.offset + w.count
                ), f"rank {plan.rank} step {k} reads elements it also writes"
            for t in step.sends:
                r = t.region
                data = b.arrays[r.buffer][r.offset : r.offset + r.count].copy()
                if plan.rank == corrupt and len(data):
                    data[0] += np.uint32(1)
                    corrupt = -1
                streams.setdefault((plan.rank, t.peer), []).append(data)
        for plan, b in zip(plans, buffers, strict=True):
            if k >= len(plan.steps):
                continue
            step = plan.steps[k]
            for c in step.copies:
                src = b.arrays[c.src.buffer][c.src.offset : c.src.offset + c.src.count]
                b.arrays[c.dst.buffer][c.dst.offset : c.dst.offset + c.dst.count] = src
            for t in step.recvs:
                queue = streams.get((t.peer, plan.rank), [])
                stream = np.concatenate(queue) if queue else np.empty(0, np.uint32)
                r = t.region
                assert len(stream) >= r.count, f"rank {plan.rank} step {k}: short stream"
                data, rest = stream[: r.count], stream[r.count :]
                streams[(t.peer, plan.rank)] = [rest] if len(rest) else []
                target = b.arrays[r.buffer][r.offset : r.offset + r.count]
                if t.reduce:
                    target += data
                else:
                    target[:] = data
    assert all(len(s) == 0 for q in streams.values() for s in q), "bytes sent, never received"
    return [b.check(h) for b in buffers]
