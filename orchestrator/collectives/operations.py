"""Collective operations: what each one computes and how nccl-tests reports it, in one place.

An operation (all-reduce, all-to-all, ...) is *what* a collective does; its algorithms
(plans.py, registered in ``default_registry``) are *how*, several per operation. Everything
else asks :data:`OPERATIONS` (through :func:`operation`) instead of keeping its own list:

- ``factor``: nccl-tests' busbw / algbw as a function of the number of ranks n (its
  doc/PERFORMANCE.md; nccl.py defines the table's columns);
- ``redop``: what nccl-tests prints in the redop column (its default ``-o sum``; "none"
  where the operation does not reduce);
- ``rooted``: whether the operation has a root (the others print root -1);
- ``per_rank``: whether the buffer is n equal per-rank pieces: nccl-tests then rounds a
  size down to whole elements per rank (its getCollByteCount) and prints the per-rank
  element count in the "count" column;
- ``nccl_tests``: whether it is an nccl-tests operation, which experiments may name. p2p
  (rank 0 sends to rank 1: the workers' transfer that iperf3 is compared against) is not;
  its table row has busbw = algbw;
- ``result``: what a rank's buffers hold before and after one operation, which the workers
  check (:class:`Result`). Buffers are named as the plans name them (plans.py lists them);
  rooted operations have their root at rank 0.

Broadcast and reduce have no algorithm yet; they are described here in full, so adding one
means adding its algorithm to plans.py only. Pure and small: the worker imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

ROOT = 0  # of the rooted operations (nccl-tests' default -r 0)


class UnknownOperation(ValueError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"unknown collective {name!r}; known: {', '.join(self.known)}")


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """``count`` elements in ``parts`` contiguous (offset, length) pieces, sizes differing
    by at most one (the first ``count % parts`` pieces get the extra element). Piece r is
    rank r's chunk of a per-rank buffer."""
    base, extra = divmod(count, parts)
    pieces, offset = [], 0
    for i in range(parts):
        length = base + (1 if i < extra else 0)
        pieces.append((offset, length))
        offset += length
    return pieces


@dataclass(frozen=True)
class Expected:
    """After the operation, ``count`` elements of ``buffer`` from ``offset`` hold, element
    for element, the sum over the ``sources`` ranks of their inputs from element ``start``."""

    buffer: str
    offset: int
    count: int
    start: int
    sources: tuple[int, ...]


@dataclass(frozen=True)
class Result:
    """One rank's buffers around one operation. Before it, ``inputs`` hold the rank's own
    values (an output written in place starts with them, which are wrong there, so a chunk
    that never arrives is counted) and ``outputs`` a value no rank sends; after it,
    ``expected`` holds. Other buffers (an algorithm's scratch) are neither filled nor
    checked. ``starts``: where an input's values begin in the fill pattern (the element
    index of its first element, 0 for an input not listed): a program's operations start
    apart, so that one operation's data found in another's buffer is counted wrong."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    expected: tuple[Expected, ...] = ()
    starts: tuple[tuple[str, int], ...] = ()

    def start(self, buffer: str) -> int:
        """Where input ``buffer``'s values begin in the fill pattern."""
        return dict(self.starts).get(buffer, 0)


def _everyone_sums(rank: int, n: int, count: int) -> Result:
    """all-reduce, in place: every rank ends with the sum."""
    return Result(("data",), expected=(Expected("data", 0, count, 0, tuple(range(n))),))


def _own_chunk_sums(rank: int, n: int, count: int) -> Result:
    """reduce-scatter, in place: rank r's chunk ends with the sum."""
    offset, length = split(count, n)[rank]
    return Result(("data",), expected=(Expected("data", offset, length, offset, tuple(range(n))),))


def _chunks_gathered(rank: int, n: int, count: int) -> Result:
    """all-gather, in place: chunk r ends with rank r's values, on every rank."""
    chunks = split(count, n)
    return Result(
        ("data",),
        expected=tuple(Expected("data", o, c, o, (owner,)) for owner, (o, c) in enumerate(chunks)),
    )


def _blocks_exchanged(rank: int, n: int, count: int) -> Result:
    """all-to-all: block i of ``recv`` ends with block ``rank`` of rank i's ``send``."""
    block = count // n
    return Result(
        ("send",),
        ("recv",),
        tuple(Expected("recv", i * block, block, rank * block, (i,)) for i in range(n)),
    )


def _root_copied(rank: int, n: int, count: int) -> Result:
    """broadcast, in place: every rank ends with the root's values."""
    return Result(("data",), expected=(Expected("data", 0, count, 0, (ROOT,)),))


def _root_sums(rank: int, n: int, count: int) -> Result:
    """reduce, in place: the root ends with the sum (the others' data is the algorithm's)."""
    if rank != ROOT:
        return Result(("data",))
    return _everyone_sums(rank, n, count)


def _sent_to_rank_1(rank: int, n: int, count: int) -> Result:
    """p2p: rank 1 ends with rank 0's values; other ranks take no part."""
    if rank > 1:
        return Result()
    if rank == 0:
        return Result(("data",))
    return Result(("data",), expected=(Expected("data", 0, count, 0, (0,)),))


@dataclass(frozen=True)
class Operation:
    """One collective operation (see the module docstring for the fields)."""

    name: str
    factor: Callable[[int], float]
    result: Callable[[int, int, int], Result]  # (rank, ranks, count) -> Result
    redop: str = "none"
    rooted: bool = False
    per_rank: bool = False
    nccl_tests: bool = True

    def elements(self, size: int, element_bytes: int, ranks: int) -> int:
        """Elements of the full buffer that a requested ``size`` (bytes) runs with: whole
        elements, and whole elements per rank where the buffer is per rank (nccl-tests'
        rounding). The one place this rounding is done, for the workers and the tables."""
        per = ranks if self.per_rank else 1
        return size // (element_bytes * per) * per

    def table_count(self, elements: int, ranks: int) -> int:
        """nccl-tests' "count (elements)" for a buffer of ``elements``: per rank where the
        buffer is per rank, else all of them."""
        return elements // ranks if self.per_rank else elements


OPERATIONS: Mapping[str, Operation] = MappingProxyType(
    {
        op.name: op
        for op in (
            Operation("all-reduce", lambda n: 2 * (n - 1) / n, _everyone_sums, redop="sum"),
            Operation("all-gather", lambda n: (n - 1) / n, _chunks_gathered, per_rank=True),
            Operation(
                "reduce-scatter",
                lambda n: (n - 1) / n,
                _own_chunk_sums,
                redop="sum",
                per_rank=True,
            ),
            Operation("all-to-all", lambda n: (n - 1) / n, _blocks_exchanged, per_rank=True),
            Operation("broadcast", lambda n: 1.0, _root_copied, rooted=True),
            Operation("reduce", lambda n: 1.0, _root_sums, redop="sum", rooted=True),
            Operation("p2p", lambda n: 1.0, _sent_to_rank_1, nccl_tests=False),
        )
    }
)


def operation(name: str) -> Operation:
    """The operation called ``name``; :class:`UnknownOperation` names the known ones."""
    try:
        return OPERATIONS[name]
    except KeyError:
        raise UnknownOperation(name, OPERATIONS) from None
