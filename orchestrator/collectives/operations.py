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
  its table row has busbw = algbw.

Broadcast and reduce have no algorithm yet: they are here for the tables, so adding one
means adding its algorithm to plans.py only. Pure and small: the worker imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType


class UnknownOperation(ValueError):
    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = list(known)
        super().__init__(f"unknown collective {name!r}; known: {', '.join(self.known)}")


@dataclass(frozen=True)
class Operation:
    """One collective operation (see the module docstring for the fields)."""

    name: str
    factor: Callable[[int], float]
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
            Operation("all-reduce", lambda n: 2 * (n - 1) / n, redop="sum"),
            Operation("all-gather", lambda n: (n - 1) / n, per_rank=True),
            Operation("reduce-scatter", lambda n: (n - 1) / n, redop="sum", per_rank=True),
            Operation("all-to-all", lambda n: (n - 1) / n, per_rank=True),
            Operation("broadcast", lambda n: 1.0, rooted=True),
            Operation("reduce", lambda n: 1.0, redop="sum", rooted=True),
            Operation("p2p", lambda n: 1.0, nccl_tests=False),
        )
    }
)


def operation(name: str) -> Operation:
    """The operation called ``name``; :class:`UnknownOperation` names the known ones."""
    try:
        return OPERATIONS[name]
    except KeyError:
        raise UnknownOperation(name, OPERATIONS) from None
