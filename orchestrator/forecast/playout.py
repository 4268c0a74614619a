"""Every rank's plan played out in time: the forecast's pipelined model.

Why not global steps: the workers do not run in lockstep. Each rank runs its own plan
(orchestrator/worker/executor.py): before a step's sends it sleeps the latency to *its*
slowest send peer, posts its sends (``sendall``: back as soon as the kernel's send buffer
holds what the wire has not taken yet), waits for the step's receives and for its sends
to be accepted, and moves on; after its last step it waits until everything it sent has
arrived. So a rank whose send peer sits behind NVLink runs ahead, the bytes of one step
keep moving while their sender sleeps before the next, and a ring settles at the pace of
its slowest sender's bytes rather than at the sum of the fabric's longest latency and the
transfer. Measured on astral-small (ring all-reduce, 4 MiB, path-pinned): every step took
183-186 ms, the transfer alone 181 ms, though every rank also slept 10-85 ms per step. A
schedule of global synchronous steps can only approximate that with a fitted share of
hidden latency; playing every rank out needs none.

The play-out is a fluid discrete-event simulation:

- a **connection** per (sender, receiver, channel), as the workers open them, on the path
  the policy gives it; it holds the bytes its sender has posted and not yet delivered;
- the connections that hold bytes share the links max-min fairly
  (orchestrator/forecast/sharing.py), each link at its capacity, a NIC downlink that
  connections reach over several upstream links at the incast share
  (:func:`converging_links`), and each connection at most at TCP's efficiency x the
  rate of the narrowest link on its path (:func:`_share` says why the efficiency is a
  connection's and not a link's); rates change only when a connection starts or stops
  holding bytes;
- each **rank** is a generator that yields what it waits for: a sleep (the step's
  latency and overhead, as the worker's ``StepLatency`` computes it), or thresholds on
  its connections' delivered bytes: a receive needs the step's bytes delivered, a send is
  accepted once at most ``send_buffer`` bytes of the connection are still undelivered,
  the end of an operation needs everything sent delivered;
- ``iterations`` operations run back to back from a common start, and the time per
  operation is each rank's end over ``iterations``, averaged over the ranks: how the
  runner times a batch (docs/measurement.md). Beyond :data:`MAX_ITERATIONS` the batch
  goes on at the last operation played: each further one takes what the last took.

The figures it takes (:class:`Figures`) are the machine's, fitted by
orchestrator/forecast/calibration.py. Cost: a few events per rank and step, each a
max-min share over the connections that hold bytes; fine for the fabrics the emulator
runs (milliseconds to a second), too slow for a pod of 65,536 GPUs, which the synchronous
step model forecasts (orchestrator/forecast/model.py chooses). Not a matter of the bytes:
a 64 TiB operation takes as many events as a 1 GiB one, though its clock, a double, runs
to 10^8 s, where it cannot resolve the last bytes' 15 ns (:func:`slack`, and the
``soonest`` step).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from orchestrator.collectives.plans import (
    Layout,
    Plan,
    Transfer,
    default_registry,
    element_count,
)
from orchestrator.forecast.schedule import split_channels
from orchestrator.forecast.sharing import FlowClass, max_min_rates

#: (src rank, dst rank, channel)
Connection = tuple[int, int, int]
#: a directed link: (from node, to node)
DirectedLink = Hashable
#: bytes that count as "delivered" when this close to a threshold (fluid rounding) ...
SLACK = 0.5
#: ... or this share of the threshold, where that is more: 64 units in the last place of a
#: double (2^-52 each), which the fluid arithmetic may lose on a count of many terabytes.
#: It is SLACK itself below 2^45 bytes (32 TiB), so every smaller play-out is unchanged.
RELATIVE_SLACK = 2.0**-46
#: the thresholds whose slack is SLACK
EXACT_BELOW = SLACK / RELATIVE_SLACK


def slack(threshold: float) -> float:
    """How close to ``threshold`` delivered bytes count as having reached it."""
    return SLACK if threshold < EXACT_BELOW else threshold * RELATIVE_SLACK


#: the most operations of a batch played out: the time per operation has settled by then
#: (only the first operation's start and the last one's drain differ from the rest, and
#: their share falls as 1/iterations), and a batch of a million operations, which a run
#: may ask for, must not cost a million play-outs. The rest of a longer batch is counted
#: at the last operation's time, not left out: the shapers' buckets, full at the batch's
#: start, speed its first operations, and a batch cut to these few would spread their
#: saved bytes over 8 operations where the run spreads them over its whole batch (a
#: 256 KiB all-to-all on astral-small, asked for 1 to 20 operations, was forecast at
#: 1.03-1.32 times its busbw ceiling)
MAX_ITERATIONS = 8


@dataclass(frozen=True)
class Figures:
    """This machine's figures for the play-out (emulated seconds, bytes)."""

    step_overhead_s: float = 0.0
    operation_overhead_s: float = 0.0
    efficiency: float = 1.0
    incast: float = 1.0
    #: undelivered bytes a connection's kernel accepts before ``sendall`` returns
    send_buffer: float = 0.0


@dataclass(frozen=True)
class Fabric:
    """What the play-out needs of the fabric and the placement (model.py builds it)."""

    layout: Layout
    #: directed link -> bytes/s (emulated, TCP payload)
    capacity: Mapping[DirectedLink, float]
    #: the directed links from a ToR into a GPU's NIC port
    into_gpu: frozenset[DirectedLink]
    #: one-way latency, emulated seconds, rank to rank
    one_way: Sequence[Sequence[float]]
    operation_latency: float
    #: the node path of a connection under the policy being forecast
    path_of: Callable[[Connection], tuple[str, ...]]
    #: the shapers' token buckets as time at each link's rate (emulated seconds; 0: none).
    #: A link idle for that long has saved that much: the next bytes pass at once.
    bucket_s: float = 0.0
    #: the directed links of a connection's path, where not its node pairs (one of
    #: parallel links taken alone: orchestrator/forecast/model.py); None: the node pairs
    links_of: Callable[[Connection], tuple[DirectedLink, ...]] | None = None


@dataclass(frozen=True)
class PlayedOut:
    """One play-out: seconds per operation (mean over ranks), and each rank's."""

    time_s: float
    rank_times_s: tuple[float, ...]
    events: int


#: what a rank generator yields: seconds to sleep, or (connection index, delivered bytes
#: needed) thresholds
Wait = float | list[tuple[int, float]]


class _Connections:
    """The connections of a play-out, indexed, with their paths as flow classes."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.index: dict[Connection, int] = {}
        self.connections: list[Connection] = []  # by index
        self.links: list[dict[DirectedLink, float]] = []
        #: the rate of the narrowest link on each connection's path (bytes/s)
        self.narrowest: list[float] = []
        self.posted: list[float] = []
        self.expected: list[float] = []
        self.delivered: list[float] = []

    def connection(self, index: int) -> Connection:
        return self.connections[index]

    def of(self, connection: Connection) -> int:
        found = self.index.get(connection)
        if found is not None:
            return found
        if self.fabric.links_of is not None:
            hops: Iterable[DirectedLink] = self.fabric.links_of(connection)
        else:
            hops = itertools.pairwise(self.fabric.path_of(connection))
        links: dict[DirectedLink, float] = dict.fromkeys(hops, 1.0)
        missing = [link for link in links if link not in self.fabric.capacity]
        if missing:
            raise ValueError(f"a path crosses {missing[0]}, which is not a link of the fabric")
        self.index[connection] = len(self.links)
        self.connections.append(connection)
        self.links.append(links)
        self.narrowest.append(min((self.fabric.capacity[link] for link in links), default=math.inf))
        self.posted.append(0.0)
        self.expected.append(0.0)
        self.delivered.append(0.0)
        return self.index[connection]


def _per_peer(transfers: Sequence[Transfer]) -> dict[int, int]:
    """A step's bytes per peer (the executor sends one peer's transfers together)."""
    out: dict[int, int] = {}
    for t in transfers:
        if t.region.nbytes:
            out[t.peer] = out.get(t.peer, 0) + t.region.nbytes
    return out


def _rank(
    rank: int,
    plan: Plan,
    iterations: int,
    channels: int,
    fabric: Fabric,
    figures: Figures,
    conns: _Connections,
    ended: Callable[[int], None],
) -> Generator[Wait, None, None]:
    """What rank ``rank`` does, as the executor does it, ``iterations`` times; ``ended``
    is told each time one of its operations ends."""
    one_way = fabric.one_way[rank]
    steps = [(_per_peer(s.sends), _per_peer(s.recvs)) for s in plan.steps]
    mine: set[int] = set()
    for _ in range(iterations):
        pause = figures.operation_overhead_s
        for k, (sends, recvs) in enumerate(steps):
            wait = max((one_way[peer] for peer in sends), default=0.0)
            if k == 0:
                wait += fabric.operation_latency
            pause += wait + figures.step_overhead_s
            if pause > 0:
                yield pause
            pause = 0.0
            needs: list[tuple[int, float]] = []
            for peer, nbytes in sends.items():
                for channel, part in enumerate(split_channels(nbytes, channels)):
                    c = conns.of((rank, peer, channel))
                    mine.add(c)
                    conns.posted[c] += part
                    needs.append((c, conns.posted[c] - figures.send_buffer))
            for peer, nbytes in recvs.items():
                for channel, part in enumerate(split_channels(nbytes, channels)):
                    c = conns.of((peer, rank, channel))
                    conns.expected[c] += part
                    needs.append((c, conns.expected[c]))
            yield needs
        # the operation ends when every byte this rank sent has been delivered (the
        # executor drains its connections before the next operation starts)
        yield [(c, conns.posted[c]) for c in sorted(mine)]
        ended(rank)


def play_out(
    fabric: Fabric,
    collective: str,
    algorithm: str,
    size: int,
    channels: int,
    figures: Figures,
    iterations: int = 1,
) -> PlayedOut:
    """Play ``iterations`` operations of ``collective``/``algorithm`` at ``size`` bytes out
    on ``fabric`` (see the module docstring), at most :data:`MAX_ITERATIONS` of them, the
    rest of the batch at the last one's time."""
    asked = max(1, iterations)
    played = min(asked, MAX_ITERATIONS)
    layout = fabric.layout
    n = layout.size
    algo = default_registry().get(collective, algorithm)
    count = element_count(collective, size, n)
    conns = _Connections(fabric)
    ends: list[list[float]] = [[] for _ in range(n)]  # each rank's operations' ends

    def ended(r: int) -> None:
        ends[r].append(now)

    ranks = [
        _rank(r, algo.plan(layout, r, count), played, channels, fabric, figures, conns, ended)
        for r in range(n)
    ]
    wake = [0.0] * n  # a sleeping rank's wake-up time
    needs: list[list[tuple[int, float]] | None] = [None] * n
    done = [math.nan] * n
    capacity = fabric.capacity
    # the buckets refill with what a link's connections leave of its rate x efficiency
    # (a lone connection's gaps are TCP's, not savings: as when the efficiency derated
    # every link); a batch's floor (least_batch) is at the links' full rate
    derated = {link: rate * figures.efficiency for link, rate in capacity.items()}
    buckets = _Buckets(capacity, derated, fabric.bucket_s)
    busy: set[int] = set()  # the connections that held bytes over the last interval
    now = 0.0
    events = 0
    rates: dict[int, float] = {}
    active_before: tuple[int, ...] | None = None

    def met(r: int) -> bool:
        wanted = needs[r]
        return wanted is None or all(
            conns.delivered[c] >= x - (SLACK if x < EXACT_BELOW else slack(x)) for c, x in wanted
        )

    def advance(r: int) -> None:
        """Run rank ``r`` until it sleeps, waits for bytes not yet delivered, or ends."""
        while True:
            try:
                request = next(ranks[r])
            except StopIteration:
                done[r] = now
                needs[r] = None
                return
            if isinstance(request, float):
                wake[r] = now + request
                needs[r] = None
                return
            needs[r] = request
            if not met(r):
                return

    runnable = list(range(n))
    while True:
        for r in runnable:
            advance(r)
        if all(not math.isnan(d) for d in done):
            break
        events += 1
        active = tuple(
            c
            for c in range(len(conns.links))
            if conns.posted[c] - conns.delivered[c] > slack(conns.posted[c])
        )
        starting = [c for c in active if c not in busy]
        if starting and buckets.spend(starting, conns):
            # the bytes a starting connection's saved tokens carried have arrived: some
            # ranks may go on before any time passes
            busy.update(starting)
            runnable = [
                r for r in range(n) if math.isnan(done[r]) and needs[r] is not None and met(r)
            ]
            continue
        if active != active_before:
            rates = _share(active, conns, capacity, fabric.into_gpu, figures)
            active_before = active
        upcoming = math.inf
        soonest = math.inf  # the same as a time from now, which the clock cannot round away
        for r in range(n):
            if not math.isnan(done[r]):
                continue
            if needs[r] is None:
                upcoming = min(upcoming, wake[r])
                soonest = min(soonest, wake[r] - now)
                continue
            for c, x in needs[r] or ():
                short = x - conns.delivered[c]
                if short > slack(x) and rates.get(c, 0.0) > 0:
                    upcoming = min(upcoming, now + short / rates[c])
                    soonest = min(soonest, short / rates[c])
        for c in active:
            if rates.get(c, 0.0) > 0:
                left = (conns.posted[c] - conns.delivered[c]) / rates[c]
                upcoming = min(upcoming, now + left)
                soonest = min(soonest, left)
        if not math.isfinite(upcoming):
            raise RuntimeError(f"{collective} ({algorithm}): the play-out stalled at {now:.3f} s")
        step = upcoming - now
        if step <= 0:
            # The clock cannot tell the next event from now: at 10^8 s (a few 64 TiB
            # operations at the emulated rates) a double moves in steps of 15 ns, and the
            # last byte of a connection at 44 MB/s is due sooner. Deliver what is due as
            # if the clock had moved, rather than wait forever for a step of zero.
            step = max(0.0, soonest)
        for c in active:
            conns.delivered[c] = min(conns.posted[c], conns.delivered[c] + rates[c] * step)
        buckets.refill(active, rates, conns, step)
        busy = set(active)
        now = upcoming
        runnable = [
            r
            for r in range(n)
            if math.isnan(done[r])
            and ((needs[r] is None and wake[r] <= now + 1e-12) or (needs[r] is not None and met(r)))
        ]
    per_rank = tuple(
        max(_batch(ends[r], asked), buckets.least_batch(r, asked / played, conns)) / asked
        for r in range(n)
    )
    return PlayedOut(sum(per_rank) / n, per_rank, events)


def _batch(ends: Sequence[float], asked: int) -> float:
    """A rank's batch of ``asked`` operations from the ends of those played: each one not
    played takes what the last one played took."""
    if asked <= len(ends) or len(ends) < 2:
        return ends[-1]
    return ends[-1] + (asked - len(ends)) * (ends[-1] - ends[-2])


class _Buckets:
    """The shapers' token buckets, in payload bytes, per directed link.

    Why: every emulated link is an HTB class whose bucket holds ``bucket_s`` of its rate
    (orchestrator/emulation/shaping.py). While a link carries less than its rate the
    bucket fills; the next bytes then leave at once, up to what it saved, and only the
    rest at the rate. The workers' latency is a sleep, so links fall idle between steps:
    measured on rail-optimized-small (hierarchical all-reduce, 1 MiB, path-pinned), each
    128 KiB step over two 12 Mbit/s ports took 34-36 ms after its latency, where the rate
    alone gives 46 ms. A connection that starts to hold bytes takes, at once, what every
    link of its path has saved (the least of them), and spends it on all of them. A link
    saves what its connections leave of its rate x the efficiency (``refilling``): the
    gaps a lone connection leaves are TCP's, not idle time."""

    def __init__(
        self,
        rates: Mapping[DirectedLink, float],
        refilling: Mapping[DirectedLink, float],
        bucket_s: float,
    ) -> None:
        self.rates = rates
        self.refilling = refilling
        self.depth = {link: rate * bucket_s for link, rate in rates.items()} if bucket_s else {}
        self.tokens = dict(self.depth)
        self.filling: set[DirectedLink] = set()  # links whose bucket is not full

    def spend(self, starting: Sequence[int], conns: _Connections) -> bool:
        """Deliver what the buckets carry of each starting connection's bytes (a link's
        tokens split evenly among the connections starting on it); whether any were."""
        if not self.depth:
            return False
        sharing: dict[DirectedLink, int] = {}
        for c in starting:
            for link in conns.links[c]:
                sharing[link] = sharing.get(link, 0) + 1
        credits = {
            c: min(
                conns.posted[c] - conns.delivered[c],
                *(self.tokens[link] / sharing[link] for link in conns.links[c]),
            )
            for c in starting
        }
        moved = False
        for c, credit in credits.items():
            if credit <= SLACK:
                continue
            conns.delivered[c] += credit
            for link in conns.links[c]:
                self.tokens[link] -= credit
                self.filling.add(link)
            moved = True
        return moved

    def least_batch(self, rank: int, scale: float, conns: _Connections) -> float:
        """The shortest batch the links allow rank ``rank``: its operations end only once
        every byte it sent and received has crossed each link of its connections, and a
        link carries at most its rate over the batch plus the one bucket it held at the
        batch's start. ``scale``: the batch's operations over those played.

        Why: :func:`_batch` counts the operations not played at the last one's time, and
        the last one played may still be spending the bucket the batch began with (links
        idle part of each operation, as a hierarchical all-reduce's NIC during its NVLink
        stages, spend it a little at a time): counted again for every operation not
        played, that bucket gave a 64 KiB hierarchical all-reduce of 236 operations on
        astral-small, latency off, 1.10 times its busbw ceiling."""
        if scale <= 1 or not self.depth:
            return 0.0
        carried: dict[DirectedLink, float] = {}
        for c, links in enumerate(conns.links):
            src, dst, _ = conns.connection(c)
            if rank not in (src, dst):
                continue
            for link in links:
                carried[link] = carried.get(link, 0.0) + conns.posted[c] * scale
        return max(
            (
                (nbytes - self.depth[link]) / self.rates[link]
                for link, nbytes in carried.items()
                if self.rates.get(link, 0.0) > 0
            ),
            default=0.0,
        )

    def refill(
        self,
        active: Sequence[int],
        rates: Mapping[int, float],
        conns: _Connections,
        seconds: float,
    ) -> None:
        """What the links saved over ``seconds``: the rate they did not use."""
        if not self.filling or seconds <= 0:
            return
        used: dict[DirectedLink, float] = {}
        for c in active:
            rate = rates.get(c, 0.0)
            for link in conns.links[c]:
                if link in self.filling:
                    used[link] = used.get(link, 0.0) + rate
        for link in list(self.filling):
            spare = max(0.0, self.refilling[link] - used.get(link, 0.0))
            self.tokens[link] = min(self.depth[link], self.tokens[link] + spare * seconds)
            if self.tokens[link] >= self.depth[link]:
                self.filling.discard(link)


def _share(
    active: Sequence[int],
    conns: _Connections,
    capacity: Mapping[DirectedLink, float],
    into_gpu: frozenset[DirectedLink],
    figures: Figures,
) -> dict[int, float]:
    """Max-min fair rates (bytes/s) of the connections that hold bytes: the links at
    their rates (a NIC downlink that connections converge on at the incast share), each
    connection at most at the efficiency x its narrowest link's rate.

    Why the efficiency caps a connection and not a link: what TCP leaves unused is a lone
    connection's (its window recovering from a loss at the shaper's shallow queue while
    the link idles); connections that share a link fill each other's gaps. Taken as a
    link's, it charged every shared link too: on the forecast benchmark's 72 cells of
    2026-12-07 (four fabrics, the same calibration file), the ring under ``shortest``,
    whose connections share links, was forecast 5-12 % too slow at 1 and 4 MiB on
    three of them (docs/forecast.md)."""
    if not active:
        return {}
    links = {link: capacity[link] for c in active for link in conns.links[c]}
    if figures.incast < 1.0:
        for link in converging_links([conns.links[c] for c in active], into_gpu):
            links[link] = capacity[link] * figures.incast
    flows: list[FlowClass] = []
    for c in active:
        path = conns.links[c]
        if figures.efficiency < 1.0 and math.isfinite(conns.narrowest[c]):
            own = ("connection", c)  # a link of its own: the connection's cap
            links[own] = conns.narrowest[c] * figures.efficiency
            path = {**path, own: 1.0}
        flows.append(FlowClass(1, 1.0, path))
    return dict(zip(active, max_min_rates(flows, links), strict=True))


def converging_links(
    paths: Sequence[Mapping[DirectedLink, float]], into_gpu: AbstractSet[DirectedLink]
) -> list[DirectedLink]:
    """The NIC downlinks (of ``into_gpu``) that connections reach over more than one
    upstream link: ``paths`` are the connections' links in path order.

    Why upstream links and not connections: a queue builds at a port only when more
    arrives than it sends, and what arrives over one upstream link of the same rate
    cannot outrun it. Two connections from one sender's NIC port into the same GPU share
    that port first and reach the downlink already paced to its rate; connections from
    several ports (several senders, or one sender's two NIC ports) converge, fill the
    ToR's shallow egress queue, and lose packets: the incast share. Fitted on the same
    two calibration runs (2026-12-03), counting upstream links instead of connections
    took the error on cells left out of the fit from 5.3 % to 3.9 % and from 4.7 % to
    3.1 % (docs/forecast.md)."""
    upstream: dict[DirectedLink, set[DirectedLink | None]] = {}
    for links in paths:
        before: DirectedLink | None = None
        for link in links:
            if link in into_gpu:
                upstream.setdefault(link, set()).add(before)
            before = link
    return [link for link, ways in upstream.items() if len(ways) > 1]
