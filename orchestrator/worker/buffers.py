"""Buffer contents: a deterministic fill per (rank, iteration), the reduction, and the check.

Elements are ``uint32`` and the reduction is their sum modulo 2**32 (nccl-tests'
``uint32``/``sum``), done by numpy in place, so reducing costs one vectorized pass.

Rank r's value at global element index i of iteration salt h is::

    v(r, h, i) = g(i) * (r + 1) + h        (mod 2**32)

where g is a fixed, odd, hash-like sequence (computed once per process and cached). Every
expected result then has a closed form: a sum over ranks is ``g(i) * n(n+1)/2 + n*h``,
a gathered or exchanged block is the sender's ``v``. What the check catches:

- a block from the wrong rank: differs by ``g(i) * (r - r')``, never 0 (g odd, |r - r'| small);
- a block from the wrong offset: g is hash-like, so g(i + d) != g(i) almost everywhere;
- stale data (last iteration's, last test's): h changes every iteration;
- a contribution missing or added twice: off by v(q, h, i), which is 0 for about one
  element in 2**32;
- any corruption on the wire.

Mismatching elements are counted (nccl-tests' #wrong). Checking runs in blocks so it needs
no second full-size buffer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from orchestrator.collectives.operations import Result, operation
from orchestrator.collectives.plans import Plan

DTYPE = np.uint32  # plans.ELEMENT_TYPE
Array = npt.NDArray[np.uint32]

_MASK = 0xFFFFFFFF
_CHECK_BLOCK = 1 << 18  # elements per verification block (1 MiB)


def salt(test: int, iteration: int) -> int:
    """The per-iteration constant h: distinct for every (test, iteration) of a run."""
    x = (0x27D4EB2F * (test + 1) + 0x165667B1 * (iteration + 1)) & _MASK
    x ^= x >> 15
    return (x * 0x2C1B3C6D) & _MASK


def byte_view(array: Array) -> memoryview:
    """The array's memory as bytes, without a copy."""
    return array.data.cast("B")


def reduce_into(dst: Array, src: Array) -> None:
    """dst += src, element-wise, modulo 2**32 (the collective's reduction)."""
    np.add(dst, src, out=dst)


class Pattern:
    """The sequence g, grown on demand and shared by every buffer of the process."""

    def __init__(self) -> None:
        self._g: Array = np.empty(0, dtype=DTYPE)

    def g(self, count: int) -> Array:
        if count > len(self._g):
            size = max(count, 2 * len(self._g))
            x = np.arange(size, dtype=DTYPE)
            x *= DTYPE(0x9E3779B1)
            x ^= x >> DTYPE(16)
            x *= DTYPE(0x85EBCA6B)
            x ^= x >> DTYPE(13)
            x |= DTYPE(1)
            self._g = x
        return self._g[:count]

    def fill(self, out: Array, rank: int, h: int, start: int = 0) -> None:
        """out[k] = v(rank, h, start + k)."""
        np.multiply(self.g(start + len(out))[start:], DTYPE(rank + 1), out=out)
        out += DTYPE(h)

    def count_wrong(self, actual: Array, start: int, factor: int, add: int, scratch: Array) -> int:
        """Elements k of ``actual`` != g(start + k) * factor + add (mod 2**32)."""
        g = self.g(start + len(actual))
        factor_, add_ = DTYPE(factor & _MASK), DTYPE(add & _MASK)
        wrong = 0
        for a in range(0, len(actual), _CHECK_BLOCK):
            b = min(a + _CHECK_BLOCK, len(actual))
            expected = scratch[: b - a]
            np.multiply(g[start + a : start + b], factor_, out=expected)
            expected += add_
            wrong += int(np.count_nonzero(actual[a:b] != expected))
        return wrong


class Buffers:
    """The arrays one plan works on, filled for an iteration and checked after it.

    What to fill and what to expect is the operation's :class:`Result`
    (orchestrator/collectives/operations.py); this class only applies it.
    """

    def __init__(
        self, plan: Plan, ranks: int, pattern: Pattern, result: Result | None = None
    ) -> None:
        """``result``: what to fill and expect; default the plan's operation's (a program
        brings its own, orchestrator/collectives/program.py)."""
        self.plan = plan
        self.ranks = ranks
        self.pattern = pattern
        if result is None:
            result = operation(plan.collective).result(plan.rank, ranks, plan.count)
        self.result = result
        self.arrays: dict[str, Array] = {
            name: np.empty(count, dtype=DTYPE) for name, count in plan.buffers
        }
        self._scratch = np.empty(min(_CHECK_BLOCK, max(plan.count, 1)), dtype=DTYPE)

    def views(self) -> dict[str, memoryview]:
        return {name: byte_view(array) for name, array in self.arrays.items()}

    def fill(self, h: int) -> None:
        """Contents before the operation (outside the timed region)."""
        for name in self.result.inputs:
            self.pattern.fill(self.arrays[name], self.plan.rank, h, self.result.start(name))
        for name in self.result.outputs:
            self.arrays[name].fill(DTYPE((h ^ 0xA5A5A5A5) & _MASK))

    def check(self, h: int) -> int:
        """#wrong: elements of this rank's result that differ from the expected ones.

        A sum over ranks S of v(r, h, i) is ``g(i) * sum(r + 1 for r in S) + len(S) * h``.
        """
        wrong = 0
        for e in self.result.expected:
            wrong += self.pattern.count_wrong(
                self.arrays[e.buffer][e.offset : e.offset + e.count],
                e.start,
                sum(r + 1 for r in e.sources),
                len(e.sources) * h,
                self._scratch,
            )
        return wrong


def corrupted(view: memoryview) -> Any:
    """A copy of ``view`` (uint32 elements) with every element off by one: fault injection."""
    copy = np.frombuffer(view, dtype=DTYPE).copy()
    copy += DTYPE(1)
    return byte_view(copy)
