"""Collective algorithms as plans: which region goes to which peer in which step.

A plan is pure data, computed from the :class:`Layout` (who sits on which server and rail),
the rank and the element count, so every algorithm is unit-tested without a socket.
The executor runs a plan step by step: within a step every send, receive and local copy
runs concurrently; a step ends when all of them have. Several transfers to (or from) the
same peer in one step travel back to back on the same connection, in the order listed, so
a sender's regions and its receiver's regions only have to agree on the total length and
the order (TCP is a byte stream).

Buffers (elements of 4 bytes; names used in regions; what they hold before and after an
operation, which the workers check, is the operation's result in operations.py)::

    all-reduce      data[count]                 in place: every rank ends with the sum
    reduce-scatter  data[count]                 in place: rank r's sum lands in chunk r
    all-gather      data[count]                 in place: rank r contributes chunk r
    all-to-all      send[count], recv[count]    block j of send goes to rank j; block i of
                    (+ stage for pxn)           recv came from rank i; blocks = count / n
    p2p             data[count]                 rank 0 sends everything to rank 1

Algorithms (``collective/name``; registered in :func:`default_registry`, an operation's
default one first; what each operation is, and how nccl-tests reports it, is in
operations.py)::

    all-reduce/ring           reduce-scatter then all-gather around ranks 0..n-1:
                              2(n-1)/n * S sent per rank
    all-reduce/hierarchical   Astral's same-rail pattern: reduce-scatter inside each server
                              (NVLink), ring all-reduce of each GPU's chunk among the GPUs of
                              its rail across servers (fabric), all-gather inside each server
    all-gather/ring, reduce-scatter/ring    (n-1)/n * S sent per rank
    all-to-all/direct         every rank sends S/n to every other rank, all at once
    all-to-all/shifted        the same in n-1 steps: step k sends to rank r+k+1
    all-to-all/pxn            a block for a GPU on another rail first crosses NVLink to the
                              local GPU on that rail, which sends it on its own rail, so all
                              fabric traffic stays same-rail
    p2p/direct                rank 0 -> rank 1, the transfer iperf3 is compared against

Which path a transfer takes is not part of the plan: peers on the same server talk over
their NVLink addresses, others over their fabric addresses (the transport decides).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from orchestrator.collectives.operations import OPERATIONS, Operation, operation, split

# What the workers move and verify: 4-byte unsigned integers, so that sums are exact (mod
# 2**32). Tables name the type as nccl-tests would.
ELEMENT_TYPE = "uint32"
ELEMENT_BYTES = 4


class PlanError(ValueError):
    """An algorithm cannot run on this layout or count (message says why)."""


class UnknownAlgorithm(PlanError):
    def __init__(self, collective: str, name: str, known: Iterable[str]) -> None:
        self.collective = collective
        self.name = name
        self.known = sorted(known)
        super().__init__(
            f"unknown collective algorithm {collective}/{name}; known: {', '.join(self.known)}"
        )


# --- layout and plan data ------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """The server and local rank (rail) of every rank 0..n-1."""

    servers: tuple[str, ...]
    local_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.servers) != len(self.local_ranks):
            raise PlanError("layout: one server and one local rank per rank")
        if not self.servers:
            raise PlanError("layout: at least one rank")
        seen = set(zip(self.servers, self.local_ranks, strict=True))
        if len(seen) != len(self.servers):
            raise PlanError("layout: two ranks share a (server, local rank)")

    @classmethod
    def regular(cls, ranks: int, gpus_per_server: int) -> Layout:
        """Ranks filled server by server: rank r on server r // g, local rank r % g."""
        return cls(
            tuple(f"s{r // gpus_per_server}" for r in range(ranks)),
            tuple(r % gpus_per_server for r in range(ranks)),
        )

    @property
    def size(self) -> int:
        return len(self.servers)

    def same_server(self, a: int, b: int) -> bool:
        return self.servers[a] == self.servers[b]

    def groups(self) -> list[list[int]]:
        """Ranks per server, servers in order of their first rank, ranks by local rank."""
        by_server: dict[str, list[int]] = {}
        for rank, server in enumerate(self.servers):
            by_server.setdefault(server, []).append(rank)
        return [sorted(ranks, key=lambda r: self.local_ranks[r]) for ranks in by_server.values()]

    def grid(self, algorithm: str) -> list[list[int]]:
        """``grid[s][l]``: the rank on server s and rail l, for the rail-aware algorithms.

        They need every server to hold a GPU on every rail in use (same local ranks).
        """
        groups = self.groups()
        rails = [self.local_ranks[r] for r in groups[0]]
        for group in groups[1:]:
            if [self.local_ranks[r] for r in group] != rails:
                raise PlanError(
                    f"{algorithm} needs the same rails (local ranks) on every server; "
                    f"server {self.servers[groups[0][0]]} has {rails}, server "
                    f"{self.servers[group[0]]} has {[self.local_ranks[r] for r in group]}"
                )
        return groups


@dataclass(frozen=True)
class Region:
    """``count`` elements of buffer ``buffer`` from element ``offset``."""

    buffer: str
    offset: int
    count: int

    @property
    def nbytes(self) -> int:
        return self.count * ELEMENT_BYTES

    def sub(self, offset: int, count: int) -> Region:
        return Region(self.buffer, self.offset + offset, count)


@dataclass(frozen=True)
class Transfer:
    """Send ``region`` to ``peer``, or receive into it (``reduce``: add instead of store)."""

    peer: int
    region: Region
    reduce: bool = False


@dataclass(frozen=True)
class Copy:
    src: Region
    dst: Region


@dataclass(frozen=True)
class PlanStep:
    """One step of a plan: its sends, receives and local copies run concurrently.

    ``compute``: emulated seconds this rank computes during the step, alongside its
    transfers (a workload's backward pass overlapping an all-reduce, program.py), so the
    step lasts as long as the longer of the two. The algorithms here never compute.
    """

    phase: str
    sends: tuple[Transfer, ...] = ()
    recvs: tuple[Transfer, ...] = ()
    copies: tuple[Copy, ...] = ()
    compute: float = 0.0

    def __post_init__(self) -> None:
        if not self.compute >= 0:  # also refuses NaN
            raise PlanError(f"step {self.phase!r}: compute must be >= 0 s, got {self.compute}")

    def is_empty(self) -> bool:
        return not (self.sends or self.recvs or self.copies or self.compute)


@dataclass(frozen=True)
class Plan:
    """What one rank does in one operation. ``buffers``: name -> elements."""

    collective: str
    algorithm: str
    rank: int
    count: int
    buffers: tuple[tuple[str, int], ...]
    steps: tuple[PlanStep, ...] = field(default_factory=tuple)

    def bytes_sent(self) -> dict[int, int]:
        """Bytes this rank sends to each peer per operation."""
        sent: dict[int, int] = {}
        for step in self.steps:
            for t in step.sends:
                sent[t.peer] = sent.get(t.peer, 0) + t.region.nbytes
        return sent

    def bytes_received(self) -> dict[int, int]:
        received: dict[int, int] = {}
        for step in self.steps:
            for t in step.recvs:
                received[t.peer] = received.get(t.peer, 0) + t.region.nbytes
        return received

    def send_peers(self) -> set[int]:
        return {t.peer for step in self.steps for t in step.sends if t.region.count}

    def recv_peers(self) -> set[int]:
        return {t.peer for step in self.steps for t in step.recvs if t.region.count}


def _coalesce(transfers: Iterable[Transfer]) -> tuple[Transfer, ...]:
    """Merge consecutive transfers with the same peer whose regions are adjacent."""
    merged: list[Transfer] = []
    for t in transfers:
        if t.region.count == 0:
            continue
        if merged:
            last = merged[-1]
            r, q = last.region, t.region
            if (
                last.peer == t.peer
                and last.reduce == t.reduce
                and r.buffer == q.buffer
                and r.offset + r.count == q.offset
            ):
                merged[-1] = Transfer(
                    t.peer, Region(r.buffer, r.offset, r.count + q.count), t.reduce
                )
                continue
        merged.append(t)
    return tuple(merged)


def _step(
    phase: str,
    sends: Iterable[Transfer] = (),
    recvs: Iterable[Transfer] = (),
    copies: Iterable[Copy] = (),
) -> PlanStep:
    return PlanStep(
        phase,
        _coalesce(sends),
        _coalesce(recvs),
        tuple(c for c in copies if c.src.count),
    )


# --- ring building blocks -------------------------------------------------------------------


def ring_reduce_scatter(
    ring: Sequence[int], rank: int, chunks: Sequence[Region], phase: str
) -> Iterator[PlanStep]:
    """Reduce-scatter around ``ring``: afterwards ring position p holds the sum of chunk p.

    Step k: position p sends chunk p-k-1 (its own at k = 0, else what it reduced at step
    k-1) to p+1 and reduces chunk p-k-2 from p-1 into its copy.
    """
    n = len(ring)
    p = ring.index(rank)
    right, left = ring[(p + 1) % n], ring[(p - 1) % n]
    for k in range(n - 1):
        yield _step(
            phase,
            sends=[Transfer(right, chunks[(p - k - 1) % n])],
            recvs=[Transfer(left, chunks[(p - k - 2) % n], reduce=True)],
        )


def ring_all_gather(
    ring: Sequence[int], rank: int, chunks: Sequence[Region], phase: str
) -> Iterator[PlanStep]:
    """All-gather around ``ring``, ring position p starting with chunk p.

    Step k: position p forwards chunk p-k to p+1 and stores chunk p-k-1 from p-1.
    """
    n = len(ring)
    p = ring.index(rank)
    right, left = ring[(p + 1) % n], ring[(p - 1) % n]
    for k in range(n - 1):
        yield _step(
            phase,
            sends=[Transfer(right, chunks[(p - k) % n])],
            recvs=[Transfer(left, chunks[(p - k - 1) % n])],
        )


def _chunks(buffer: str, offset: int, count: int, parts: int) -> list[Region]:
    return [Region(buffer, offset + o, c) for o, c in split(count, parts)]


def _plan(
    collective: str,
    algorithm: str,
    rank: int,
    count: int,
    buffers: dict[str, int],
    steps: Iterable[PlanStep],
) -> Plan:
    return Plan(
        collective,
        algorithm,
        rank,
        count,
        tuple(buffers.items()),
        tuple(s for s in steps if not s.is_empty()),
    )


def _check(layout: Layout, rank: int, count: int, per_rank: bool) -> None:
    if not 0 <= rank < layout.size:
        raise PlanError(f"rank {rank} is not in a layout of {layout.size} ranks")
    if count < 0:
        raise PlanError(f"count must be >= 0, got {count}")
    if per_rank and count % layout.size:
        raise PlanError(f"count {count} is not a multiple of the {layout.size} ranks")


# --- algorithms -----------------------------------------------------------------------------


class Algorithm(Protocol):
    """One way to carry out one collective. ``plan`` is pure."""

    operation: Operation
    name: str

    def plan(self, layout: Layout, rank: int, count: int) -> Plan: ...


class RingAllReduce:
    operation = OPERATIONS["all-reduce"]
    name = "ring"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=False)
        ring = list(range(layout.size))
        chunks = _chunks("data", 0, count, layout.size)
        steps = [
            *ring_reduce_scatter(ring, rank, chunks, "reduce-scatter"),
            *ring_all_gather(ring, rank, chunks, "all-gather"),
        ]
        return _plan(self.operation.name, self.name, rank, count, {"data": count}, steps)


class HierarchicalAllReduce:
    """Intra-server reduce-scatter, per-rail ring all-reduce across servers, intra all-gather.

    With g GPUs per server and m servers, a rank sends 2(g-1)/g * S over NVLink and
    2(m-1)/m * S/g over the fabric, all of it to GPUs of its own rail.
    """

    operation = OPERATIONS["all-reduce"]
    name = "hierarchical"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=False)
        grid = layout.grid(f"{self.operation.name}/{self.name}")
        server = next(s for s, group in enumerate(grid) if rank in group)
        local = grid[server].index(rank)
        g = len(grid[server])
        intra = grid[server]
        rail = [group[local] for group in grid]
        chunks = _chunks("data", 0, count, g)
        mine = chunks[local]
        pieces = _chunks("data", mine.offset, mine.count, len(rail))
        steps = [
            *ring_reduce_scatter(intra, rank, chunks, "intra reduce-scatter"),
            *ring_reduce_scatter(rail, rank, pieces, "rail reduce-scatter"),
            *ring_all_gather(rail, rank, pieces, "rail all-gather"),
            *ring_all_gather(intra, rank, chunks, "intra all-gather"),
        ]
        return _plan(self.operation.name, self.name, rank, count, {"data": count}, steps)


class RingAllGather:
    operation = OPERATIONS["all-gather"]
    name = "ring"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=True)
        ring = list(range(layout.size))
        chunks = _chunks("data", 0, count, layout.size)
        steps = ring_all_gather(ring, rank, chunks, "all-gather")
        return _plan(self.operation.name, self.name, rank, count, {"data": count}, steps)


class RingReduceScatter:
    operation = OPERATIONS["reduce-scatter"]
    name = "ring"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=True)
        ring = list(range(layout.size))
        chunks = _chunks("data", 0, count, layout.size)
        steps = ring_reduce_scatter(ring, rank, chunks, "reduce-scatter")
        return _plan(self.operation.name, self.name, rank, count, {"data": count}, steps)


def _block(buffer: str, index: int, size: int) -> Region:
    return Region(buffer, index * size, size)


def _own_block_copy(rank: int, block: int) -> Copy:
    return Copy(_block("send", rank, block), _block("recv", rank, block))


class DirectAllToAll:
    operation = OPERATIONS["all-to-all"]
    name = "direct"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=True)
        n, block = layout.size, count // layout.size
        others = [(rank + k) % n for k in range(1, n)]
        step = _step(
            "all-to-all",
            sends=[Transfer(peer, _block("send", peer, block)) for peer in others],
            recvs=[Transfer(peer, _block("recv", peer, block)) for peer in others],
            copies=[_own_block_copy(rank, block)],
        )
        buffers = {"send": count, "recv": count}
        return _plan(self.operation.name, self.name, rank, count, buffers, [step])


class ShiftedAllToAll:
    operation = OPERATIONS["all-to-all"]
    name = "shifted"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=True)
        n, block = layout.size, count // layout.size
        steps = []
        for k in range(n - 1):
            to, frm = (rank + k + 1) % n, (rank - k - 1) % n
            steps.append(
                _step(
                    "all-to-all",
                    sends=[Transfer(to, _block("send", to, block))],
                    recvs=[Transfer(frm, _block("recv", frm, block))],
                    copies=[_own_block_copy(rank, block)] if k == 0 else [],
                )
            )
        buffers = {"send": count, "recv": count}
        return _plan(self.operation.name, self.name, rank, count, buffers, steps)


class PxnAllToAll:
    """PXN: cross-rail blocks hop over NVLink to the local GPU on the destination's rail.

    Step "nvlink": rank (s, l) sends to each local peer (s, l') its block for (s, l') and
    its blocks for (s', l') on every other server s'; the peer keeps the first and stages
    the others. Step "rail": (s, l') sends to each (s', l'), for every local rank l in
    order, the block (s, l) has for (s', l') (its own from ``send``, the others staged).
    Fabric traffic per rank: (m-1) * g blocks, all to its own rail; NVLink: (g-1) * m.
    """

    operation = OPERATIONS["all-to-all"]
    name = "pxn"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=True)
        grid = layout.grid(f"{self.operation.name}/{self.name}")
        block = count // layout.size
        m, g = len(grid), len(grid[0])
        s = next(i for i, group in enumerate(grid) if rank in group)
        lr = grid[s].index(rank)
        remote = [x for x in range(m) if x != s]  # other servers, in order

        def slot(dst_server: int, src_local: int) -> Region:
            """Where this rank stages what local GPU src_local has for grid[dst_server]."""
            j = remote.index(dst_server)
            return Region("stage", (j * g + src_local) * block, block)

        nv_sends: list[Transfer] = []
        nv_recvs: list[Transfer] = []
        for peer_local in range(g):
            if peer_local == lr:
                continue
            relay = grid[s][peer_local]
            nv_sends.append(Transfer(relay, _block("send", relay, block)))
            nv_sends += [
                Transfer(relay, _block("send", grid[x][peer_local], block)) for x in remote
            ]
            nv_recvs.append(Transfer(relay, _block("recv", relay, block)))
            nv_recvs += [Transfer(relay, slot(x, peer_local)) for x in remote]
        rail_sends: list[Transfer] = []
        rail_recvs: list[Transfer] = []
        for x in remote:
            dst = grid[x][lr]
            for src_local in range(g):
                region = _block("send", dst, block) if src_local == lr else slot(x, src_local)
                rail_sends.append(Transfer(dst, region))
                rail_recvs.append(Transfer(dst, _block("recv", grid[x][src_local], block)))
        steps = [
            _step("nvlink", nv_sends, nv_recvs, [_own_block_copy(rank, block)]),
            _step("rail", rail_sends, rail_recvs),
        ]
        buffers = {"send": count, "recv": count, "stage": (m - 1) * g * block}
        return _plan(self.operation.name, self.name, rank, count, buffers, steps)


class DirectP2p:
    operation = OPERATIONS["p2p"]
    name = "direct"

    def plan(self, layout: Layout, rank: int, count: int) -> Plan:
        _check(layout, rank, count, per_rank=False)
        if layout.size < 2:
            raise PlanError("p2p needs at least two ranks")
        region = Region("data", 0, count)
        steps = []
        if rank == 0:
            steps.append(_step("send", sends=[Transfer(1, region)]))
        elif rank == 1:
            steps.append(_step("send", recvs=[Transfer(0, region)]))
        return _plan(self.operation.name, self.name, rank, count, {"data": count}, steps)


# --- registry -------------------------------------------------------------------------------


class AlgorithmRegistry:
    """Algorithms by (operation, name); held per instance, not as class state.

    The order of registration is the order of listing: an operation's first algorithm is
    its default one (what the short form ``- all-reduce`` of an experiment means).
    """

    def __init__(self, algorithms: Iterable[Algorithm] = ()) -> None:
        self._algorithms: dict[tuple[str, str], Algorithm] = {}
        for algorithm in algorithms:
            self.register(algorithm)

    def register(self, algorithm: Algorithm) -> None:
        op = algorithm.operation
        if OPERATIONS.get(op.name) is not op:
            raise ValueError(
                f"algorithm {op.name}/{algorithm.name}: its operation is not one of "
                f"operations.OPERATIONS ({', '.join(OPERATIONS)})"
            )
        key = (op.name, algorithm.name)
        if key in self._algorithms:
            raise ValueError(f"algorithm {key[0]}/{key[1]} is registered twice")
        self._algorithms[key] = algorithm

    def get(self, collective: str, name: str) -> Algorithm:
        try:
            return self._algorithms[(collective, name)]
        except KeyError:
            raise UnknownAlgorithm(collective, name, self.names()) from None

    def names(self) -> list[str]:
        return [f"{c}/{n}" for c, n in self._algorithms]

    def collectives(self) -> dict[str, tuple[str, ...]]:
        """What experiments may name: each nccl-tests operation that has an algorithm, with
        the names of its algorithms, the default one first. (p2p is not one.)"""
        listed: dict[str, tuple[str, ...]] = {}
        for algorithm in self._algorithms.values():
            op = algorithm.operation
            if op.nccl_tests:
                listed[op.name] = (*listed.get(op.name, ()), algorithm.name)
        return listed

    def __contains__(self, key: object) -> bool:
        return key in self._algorithms


def default_registry() -> AlgorithmRegistry:
    return AlgorithmRegistry(
        [
            RingAllReduce(),
            HierarchicalAllReduce(),
            DirectAllToAll(),
            ShiftedAllToAll(),
            PxnAllToAll(),
            RingAllGather(),
            RingReduceScatter(),
            DirectP2p(),
        ]
    )


# Collective operations experiments may name and their algorithms, the default one first:
# the default registry's listing, for callers that only read it.
COLLECTIVES: Mapping[str, tuple[str, ...]] = MappingProxyType(default_registry().collectives())


def element_count(collective: str, size_bytes: int, ranks: int) -> int:
    """Elements of the full buffer for a requested size (rounded down as nccl-tests does)."""
    return operation(collective).elements(size_bytes, ELEMENT_BYTES, ranks)
