"""How fast a collective can possibly go on a fabric: busbw ceilings from the plans.

nccl-tests' busbw (``algbw x factor``) is comparable to one GPU's link rate for flat
algorithms, where every byte the formula counts crosses the network. Algorithms that move
part of the data over NVLink inside a server (hierarchical all-reduce, PXN all-to-all, and
even direct all-to-all, whose server-mate's block stays on NVLink) can exceed the NIC rate
in busbw. The physical ceiling follows from the plans, which say exactly which bytes go
to which peer (orchestrator/collectives/plans.py)::

    fabric share = max over ranks of max(bytes sent, bytes received) to/from peers on
                   other servers, per operation, divided by S x factor(collective, n)
    ceiling      = NIC ports x emulated NIC rate / fabric share      (NVLink taken as free)

Shares with n ranks on k servers of g GPUs: ring all-reduce, all-gather, reduce-scatter 1
(some rank sends all of its ring traffic on the fabric); direct, shifted and PXN all-to-all
(n - g) / (n - 1); hierarchical all-reduce (2(k-1)/k x S/g) / (2(n-1)/n x S). On
astral-small (k = 4, g = 2): 1, 0.857 and 0.429. Pure: no root needed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from orchestrator.collectives.nccl import bus_factor
from orchestrator.collectives.plans import (
    ELEMENT_BYTES,
    Layout,
    default_registry,
    element_count,
)

REFERENCE_SIZE = 1 << 22  # large enough that rounding to elements does not matter


class WorkerSpec(Protocol):
    """Where a rank sits: all a ceiling needs of a worker (the launcher's WorkerSpec)."""

    @property
    def rank(self) -> int: ...

    @property
    def server(self) -> str: ...

    @property
    def local_rank(self) -> int: ...


def layout_of(workers: Sequence[WorkerSpec]) -> Layout:
    ordered = sorted(workers, key=lambda w: w.rank)
    return Layout(tuple(w.server for w in ordered), tuple(w.local_rank for w in ordered))


def fabric_share(
    workers: Sequence[WorkerSpec], collective: str, algorithm: str, size: int = REFERENCE_SIZE
) -> float:
    """The busiest rank's fabric bytes per operation over S x factor (see the module doc)."""
    layout = layout_of(workers)
    n = layout.size
    algo = default_registry().get(collective, algorithm)
    count = element_count(collective, size, n)
    busiest = 0
    for rank in range(n):
        plan = algo.plan(layout, rank, count)
        sent = sum(b for p, b in plan.bytes_sent().items() if not layout.same_server(rank, p))
        received = sum(
            b for p, b in plan.bytes_received().items() if not layout.same_server(rank, p)
        )
        busiest = max(busiest, sent, received)
    counted = count * ELEMENT_BYTES * bus_factor(collective, n)
    return busiest / counted if counted else 1.0


def busbw_ceiling(
    workers: Sequence[WorkerSpec], collective: str, algorithm: str, rail_bandwidth: float
) -> float:
    """busbw (same unit as ``rail_bandwidth``) at which the busiest rank's fabric bytes
    move at ``rail_bandwidth``; infinite when nothing crosses the fabric."""
    share = fabric_share(workers, collective, algorithm)
    return rail_bandwidth / share if share > 0 else float("inf")


def fabric_peers(workers: Sequence[WorkerSpec], collective: str, algorithm: str) -> int:
    """The most peers on other servers any rank sends to in one operation."""
    layout = layout_of(workers)
    n = layout.size
    algo = default_registry().get(collective, algorithm)
    count = element_count(collective, REFERENCE_SIZE, n)
    return max(
        len(
            [
                p
                for p in algo.plan(layout, rank, count).send_peers()
                if not layout.same_server(rank, p)
            ]
        )
        for rank in range(n)
    )


def default_channels(
    workers: Sequence[WorkerSpec], collective: str, algorithm: str, nic_ports: int
) -> int:
    """Connections per peer pair: the fewest that let a rank's fabric connections spread
    evenly over its NIC ports (peers x channels a multiple of the ports). A ring's one peer
    needs one connection per port; an all-to-all's six peers need one each.

    More would not add bandwidth and cost some: every extra connection into a receiver is
    another flow contending for the same shallow switch queue (all-to-all incast), and
    measured once on astral-small (path-pinned, 4 MiB, a shared 2-core machine), direct
    all-to-all reached 0.72 of the rail with 1 connection per peer, 0.57 with 2, 0.41 with 4.
    """
    peers = fabric_peers(workers, collective, algorithm)
    if peers == 0:
        return 1
    return nic_ports // math.gcd(peers, nic_ports)
