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

A configuration's own ceiling (:class:`Ceiling`, what every table, summary, plot and
benchmark compares against) is that rate times TCP's payload share: the emulated links are
shaped in Ethernet frames, and TCP over 1500-byte frames carries at most 1460/1514 of them
as payload (topologies.units.TCP_PAYLOAD_SHARE)::

    ceiling = NIC ports x emulated NIC rate x 1460/1514 / fabric share

No measured busbw may exceed it. The one emulation artefact that could push a short
operation past it is the shapers' token bucket: after an idle spell (the barrier before a
batch) every shaper holds ``burst_s`` of tokens, so a batch of duration T can move at most
``burst_s / T`` more than the rate allows. :meth:`Ceiling.bucket_share` gives that bound
and tables flag the cells where it exceeds :data:`BUCKET_FLAG_SHARE`, or where a figure
is over the ceiling by no more than it; only a figure over the ceiling by more than the
buckets allow is marked ``ABOVE CEILING``. To keep cells from
getting there, the launcher lengthens a short operation's timed batch to
:func:`min_batch_seconds` (more iterations, judged by the warm-up's time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.collectives.nccl import bus_factor
from orchestrator.collectives.plans import (
    ELEMENT_BYTES,
    Layout,
    default_registry,
    element_count,
)
from topologies.units import TCP_PAYLOAD_SHARE

REFERENCE_SIZE = 1 << 22  # large enough that rounding to elements does not matter
#: Flag a cell when the shapers' buckets could have inflated its busbw by more than this.
BUCKET_FLAG_SHARE = 0.01
#: What the timed batch is sized for: the buckets may add at most this share to it.
BUCKET_TARGET_SHARE = 0.005
#: A figure this close to its ceiling (relative) is equal to it: float rounding of the
#: rates and the fluid play-out's arithmetic, not a measurement or a forecast above it.
ROUNDING = 1e-9
#: The least excess over the bare ceiling a table explains with the buckets' mark (less
#: prints as x1.000, the ceiling itself).
SHOWN_SHARE = 0.0005


def min_batch_seconds(burst_s: float) -> float:
    """How long a timed batch must last for shapers with ``burst_s`` buckets to add at
    most :data:`BUCKET_TARGET_SHARE` to it (10 ms buckets: 2 s). The launcher repeats a
    short operation until its batch lasts that long, instead of reporting a figure the
    buckets inflated."""
    return burst_s / BUCKET_TARGET_SHARE


def timed_count(asked: int, per_operation_s: float, min_batch_s: float, most: int) -> int:
    """How many operations a timed batch runs: ``asked``, or more where one operation
    (``per_operation_s``, the warm-up's; 0: not known) is so short that the batch would
    last under ``min_batch_s`` (0: no floor), at most ``most``. The launcher sizes its
    batches so, and the forecast sizes the batches it predicts as the launcher will."""
    if not min_batch_s or per_operation_s <= 0:
        return asked
    return max(asked, min(math.ceil(min_batch_s / per_operation_s), most))


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


@dataclass(frozen=True)
class Ceiling:
    """The busbw one configuration (collective, algorithm, placement) can reach on its
    fabric, and what it is made of. Bandwidths in GB/s (10**9 B/s), emulated."""

    #: one GPU's NIC ports x their emulated rate
    rail: float
    #: the busiest rank's fabric bytes over S x factor (:func:`fabric_share`); 0 when
    #: nothing crosses the fabric
    fabric_share: float
    #: TCP payload per byte the shapers count
    payload_share: float = TCP_PAYLOAD_SHARE
    #: the shapers' bucket depth, seconds at the link rate (0: unknown or none)
    burst_s: float = 0.0

    @property
    def busbw(self) -> float:
        """The ceiling itself: rail x payload share / fabric share."""
        if self.fabric_share <= 0:
            return math.inf
        return self.rail * self.payload_share / self.fabric_share

    def share(self, busbw: float) -> float:
        """``busbw`` as a share of the ceiling (the ratio every benchmark reports)."""
        return busbw / self.busbw if math.isfinite(self.busbw) else math.nan

    def bucket_share(self, batch_seconds: float) -> float:
        """The most the shapers' full buckets can have added to a batch that lasted
        ``batch_seconds``, as a share of its busbw."""
        return self.burst_s / batch_seconds if batch_seconds > 0 else math.inf

    def marks(self, busbw: float, batch_seconds: float) -> list[str]:
        """What a table says beside a cell: above the ceiling by more than the shapers'
        buckets can add to its batch (a bug to find, printed, never hidden), or short
        enough that the buckets could inflate it, or over the bare ceiling by what they
        could add (which the mark then names).

        Why the buckets count: a batch begins after an idle spell longer than the buckets
        (the launcher's start lead), so every link may carry its rate over the batch plus
        one bucket, as the run's own links do; a figure within that is physics, not a
        fault. A figure equal to the ceiling but for float rounding is not above it."""
        out = []
        bucket = self.bucket_share(batch_seconds)
        over = math.isfinite(self.busbw) and busbw > self.busbw * (1 + ROUNDING)
        above = over and busbw > self.busbw * (1 + bucket) * (1 + ROUNDING)
        if above:
            out.append(f"ABOVE CEILING x{busbw / self.busbw:.3f}")
        if bucket > BUCKET_FLAG_SHARE:
            out.append(f"bucket <= {bucket:.0%}")
        elif over and not above and busbw >= self.busbw * (1 + SHOWN_SHARE):
            out.append(f"bucket <= {bucket:.1%}")
        return out

    def describe(self, scale: float | None = None) -> str:
        """One line for a table's header."""
        if not math.isfinite(self.busbw):
            return "busbw ceiling: none (no byte crosses the fabric)"

        def rate(value: float) -> str:
            text = f"{value:.6f} GB/s emulated"
            return text + (f" ({value / scale:.2f} real)" if scale else "")

        return (
            f"busbw ceiling {rate(self.busbw)} = rail {rate(self.rail)} x TCP payload "
            f"{self.payload_share:.3f} / fabric share {self.fabric_share:.3f}"
        )

    def to_dict(self) -> dict[str, float | None]:
        busbw = self.busbw
        return {
            "busbw": busbw if math.isfinite(busbw) else None,
            "rail": self.rail,
            "fabric_share": self.fabric_share,
            "payload_share": self.payload_share,
            "burst_s": self.burst_s,
        }


def configuration_ceiling(
    workers: Sequence[WorkerSpec],
    collective: str,
    algorithm: str,
    rail_bandwidth: float,
    burst_s: float = 0.0,
    payload_share: float = TCP_PAYLOAD_SHARE,
) -> Ceiling:
    """The :class:`Ceiling` of ``collective``/``algorithm`` on ``workers``; ``rail_bandwidth``
    in bytes/s, emulated; ``payload_share`` of the emulator recipe's frames."""
    return Ceiling(
        rail=rail_bandwidth / 1e9,
        fabric_share=fabric_share(workers, collective, algorithm),
        payload_share=payload_share,
        burst_s=burst_s,
    )
