"""The fill pattern and the check: right results pass, each kind of wrong result is counted."""

from __future__ import annotations

import numpy as np

from orchestrator.collectives.plans import Layout, default_registry, split
from orchestrator.worker.buffers import DTYPE, Buffers, Pattern, reduce_into, salt
from orchestrator.worker.protocol import LineBuffer, decode, encode

N, COUNT = 4, 4096
LAYOUT = Layout.regular(N, 2)
REGISTRY = default_registry()


def buffers(collective: str, algorithm: str, rank: int) -> Buffers:
    plan = REGISTRY.get(collective, algorithm).plan(LAYOUT, rank, COUNT)
    return Buffers(plan, N, Pattern())


def rank_values(rank: int, h: int, start: int = 0, count: int = COUNT) -> np.ndarray:
    out = np.empty(count, DTYPE)
    Pattern().fill(out, rank, h, start)
    return out


def all_reduce_result(h: int) -> np.ndarray:
    total = np.zeros(COUNT, DTYPE)
    for r in range(N):
        reduce_into(total, rank_values(r, h))
    return total


def test_correct_all_reduce_passes_and_each_fault_is_counted() -> None:
    h = salt(0, 0)
    b = buffers("all-reduce", "ring", 0)
    data = b.arrays["data"]
    data[:] = all_reduce_result(h)
    assert b.check(h) == 0
    # a contribution missing in one chunk
    lo, n = split(COUNT, N)[1]
    data[lo : lo + n] -= rank_values(2, h)[lo : lo + n]
    assert b.check(h) == n
    # stale: last iteration's result
    data[:] = all_reduce_result(salt(0, 1))
    assert b.check(h) == COUNT
    # a chunk taken from the wrong offset
    data[:] = all_reduce_result(h)
    data[0:100] = data[100:200]
    assert b.check(h) == 100


def test_all_gather_detects_a_block_from_the_wrong_rank_or_never_received() -> None:
    h = salt(1, 0)
    b = buffers("all-gather", "ring", 1)
    b.fill(h)
    assert b.check(h) == COUNT - COUNT // N  # only its own chunk is right before the op
    data = b.arrays["data"]
    for owner, (lo, n) in enumerate(split(COUNT, N)):
        data[lo : lo + n] = rank_values(owner, h, lo, n)
    assert b.check(h) == 0
    lo, n = split(COUNT, N)[3]
    data[lo : lo + n] = rank_values(2, h, lo, n)  # rank 2's values where rank 3's belong
    assert b.check(h) == n


def test_all_to_all_expects_each_senders_block() -> None:
    h = salt(2, 5)
    rank, block = 2, COUNT // N
    b = buffers("all-to-all", "direct", rank)
    b.fill(h)
    recv = b.arrays["recv"]
    for src in range(N):
        recv[src * block : (src + 1) * block] = rank_values(src, h, rank * block, block)
    assert b.check(h) == 0
    recv[0:block] = rank_values(0, h, (rank + 1) * block, block)  # block meant for rank 3
    assert b.check(h) == block


def test_pattern_is_odd_and_rank_dependent() -> None:
    g = Pattern().g(1 << 16)
    assert np.all(g & 1)
    assert len(np.unique(g)) > 0.99 * len(g)
    assert not np.any(rank_values(0, 7) == rank_values(1, 7))


def test_reduce_wraps_around() -> None:
    a = np.array([0xFFFFFFFF, 5], DTYPE)
    reduce_into(a, np.array([2, 1], DTYPE))
    assert a.tolist() == [1, 6]


def test_messages_split_on_newlines_across_reads() -> None:
    data = encode({"type": "a", "x": 1}) + encode({"type": "b"})
    buffer = LineBuffer()
    got = [m for i in range(len(data)) for m in buffer.feed(data[i : i + 1])]
    assert got == [{"type": "a", "x": 1}, {"type": "b"}]
    assert decode(b'{"type": "c"}') == {"type": "c"}
