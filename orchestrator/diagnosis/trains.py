"""Slow links from the probe mesh's trains: the rate a link gives a burst, placed by paths.

A slow link that no collective crosses leaves no trace in the collectives' connections,
and the probe mesh's small messages do not see it either: 64 bytes cross a quarter-rate
link as fast as a full-rate one. So every probe also sends a train every few seconds
(:mod:`orchestrator.testbed.prober`: 32 kB paced at 1.5 times its path's slowest link),
and its receiver notes when the train's bytes arrived. The second half of a train arrives
at the rate of the slowest link on its path once that link's token bucket is spent:
measured on astral-small at 20 Mbit/s, idle, 1.35 times the slowest link (the pace); a
link slowed to a quarter gives 0.22, to half 0.50.

A train also arrives slowly behind other traffic: its segments queue behind a collective's
on a busy link, and its second half waits for the acknowledgements of its first, which
queue on a busy link of the way back (and behind a slow link's full queue: trains whose
acknowledgements crossed a slowed link came at 0.1-0.3 in the suites). So a train is
evidence against a direction ``d`` of its way there or back (:meth:`Reading.slow_across`)
when it came at under :data:`SLOW_LINE` of its path's slowest link while no other
direction of its way carried :data:`BUSY` of its rate or more (unless the train came far
under an equal share of it beside the collectives' connections crossing it:
:data:`FAIR_FLOOR`), none of the way back
:data:`BUSY_BACK` (the ports' counters, :data:`BUSY_PAD_S` around the train), ``d`` itself
less than :data:`OWN_MAX` and than :data:`OWN_OVER_SHARE` times the train's share (a link
slowed so that a train crosses it at a share s carries about s of its rate at most: a
quarter-rate link's trains came at 0.22, while it carried 0.01-0.05), and no port of
the fabric was down (a failover reroutes). A train at :data:`FAST_LINE` or more clears the
directions of its way there (its acknowledgements cross an idle slow link unhurt): a link
slowed so that trains come under :data:`SLOW_LINE` lets none across at twice that (a CI
run's healthy ring: three trains at 0.09-0.20 over 12 s across a core uplink, which trains
at 0.67 and 0.78 crossed between them, were a slow link at 0.60 while the line was 0.8).

A direction is slow when :data:`RUN_MIN` of the trains across it in a row, from
:data:`PROBES_MIN` probes or more, over :data:`RUN_SPAN_S` or more, were slow against it
with none fast between them; when the trains elsewhere in the fabric meanwhile were mostly
not (:data:`ELSEWHERE_MAX` of :data:`ELSEWHERE_MIN` or more: a machine that stalls slows
every train at once, and is no link's fault); and when one in :data:`CLEAN_PER` of them at
least came at a rate and not after a timer (:attr:`Reading.paced`): a lossy link's trains
are slow only when a lost segment waited for the probe's retransmission timeout, and fast
otherwise, while a slowed link's small queue overflows under a train and makes it
retransmit within a round trip, its second half still at the link's rate. Measured in the
saved suites (seeds 33-52, in the fault windows): of 103 trains across a link losing 3 %,
3 came under :data:`SLOW_LINE`; of 62 across a quarter-rate link, 32 lost a segment, 22
of those at 0.18-0.25, the link's own rate (seed 50 run 1: four slow trains from four
probes, every one of which lost, were not a slow link).

The directions are taken in rounds, the longest run first, its trains then explained: a
path's other links, whose trains were the same ones or fewer, are not named. Directions
with the same trains cannot be told apart and get the same score; both directions of one
link make the link ``A-B``.

What it cannot see: a link slowed to more than :data:`SLOW_LINE` of its path's slowest
other link (a half-rate link reads 0.5); a slow link in a fabric whose links are all busy
(an all-to-all: every train is excused; the queues and the connections' paces have that
case, :func:`orchestrator.diagnosis.detectors.sending_below_rate`); a fault shorter than
the trains across its link take to come three times (a direction has a train every 1-2 s
on the fabrics measured).
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from orchestrator.diagnosis.detectors import rel
from orchestrator.diagnosis.evidence import Direction, Observations
from orchestrator.diagnosis.model import Suspect
from orchestrator.diagnosis.proberecord import Probe, directions
from orchestrator.diagnosis.probes import as_links, down_windows

SLOW_LINE = 0.3  # a train's second half under this share of its path's slowest link
FAST_LINE = 0.6  # ... at this share or more (twice the line): its path was that fast
BUSY = 0.4  # another direction of its path that carried this share of its rate meanwhile
BUSY_BACK = 0.6  # ... or of its acknowledgements' path (they clock its second half)
FAIR_FLOOR = 0.25  # ... unless the train came under this many equal shares of it (_shared)
OWN_MAX = 0.5  # the direction itself carried this share or more: not slowed below the line
OWN_OVER_SHARE = 1.5  # ... or this many times the train's own share: not slowed to that
BUSY_PAD_S = 0.3  # around the train, for the counters polled every 0.5 s
RUN_MIN = 3  # slow trains in a row across a direction
PROBES_MIN = 2  # ... from this many probes at least
RUN_SPAN_S = 1.5  # ... over this long at least (one GPU's trains back to back are not a link)
CLEAN_PER = 5  # of a run's trains, one in this many at least came paced (no timer)
ELSEWHERE_MIN = 5  # trains not across the link while the run lasted, at least
ELSEWHERE_MAX = 0.34  # ... of which slow at most this share
SCORE = 0.6  # a run of RUN_MIN trains from PROBES_MIN probes
SCORE_STEP = 0.05  # per train beyond, and per probe beyond
SCORE_MAX = 0.85
ROUNDS = 3  # directions taken in turn at most
#: the probes keep the kernel's minimum retransmission timeout (orchestrator/testbed/prober.py)
PROBE_RTO_S = 0.2


@dataclass(frozen=True)
class Reading:
    """One train as evidence: when it arrived, its rate against its path's slowest link,
    the directions it and its acknowledgements crossed and what each carried meanwhile."""

    probe: int
    first: float
    last: float
    share: float  # second half's rate / the slowest link of its path
    dirs: frozenset[str]
    back: frozenset[str]  # its acknowledgements' directions
    loads: dict[str, float]  # direction -> share of its rate it carried meanwhile
    down: bool  # a port of the fabric was down meanwhile (a failover reroutes)
    lost: bool  # its probe retransmitted while it arrived
    # direction of its way there -> (the share of that direction's own rate the train
    # came at, the collectives' connections crossing it meanwhile)
    sharing: dict[str, tuple[float, int]] = field(default_factory=dict)
    tail_s: float = 0.0  # how long its second half took to arrive

    @property
    def paced(self) -> bool:
        """Whether its second half came at a rate, not after a timer: it lost nothing, or
        it took less than the probe's minimum retransmission timeout (:data:`PROBE_RTO_S`),
        so what it lost was sent again within a round trip."""
        return not self.lost or self.tail_s < PROBE_RTO_S

    @cached_property  # asked for every direction of the fabric, on every live look
    def ways(self) -> frozenset[str]:
        """Both ways: a slow link on the acknowledgements' way slows the train too (its
        second half waits for them)."""
        return self.dirs | self.back

    def slow_across(self, d: str) -> bool:
        """Slow, and nothing but ``d`` explains it: no other direction of its way busy,
        none of its acknowledgements' way very busy, ``d`` itself not carrying what a
        link slowed to the train's pace could not."""
        own = self.loads.get(d, 0.0)
        if self.down or self.share >= SLOW_LINE or own >= min(OWN_MAX, OWN_OVER_SHARE * self.share):
            return False
        return not any(
            load >= (BUSY if x in self.dirs else BUSY_BACK) and self._shared(x)
            for x, load in self.loads.items()
            if x != d
        )

    def _shared(self, x: str) -> bool:
        """Whether the traffic on busy direction ``x`` of the way there can have held the
        train back: unless the collectives' connections crossing ``x`` (n of them) would
        have left it :data:`FAIR_FLOOR` / (n + 1) of ``x``'s rate and it came slower. A
        train is one more TCP flow there; it gets about an equal share of a link it
        shares, less as a short flow against long ones, not a quarter of one it shares
        with one connection carrying under half the rate (seed 49 run 1: trains across a
        slowed core link came at 0.22-0.23 of a ToR downlink beside the one ring
        connection that carried 0.46-0.51 of it; of the slow trains such a link excused in
        144 saved healthy runs, one came at 0.20 of an equal share, the rest at 0.26 or
        more). Traffic no connection explains (n = 0) holds it back."""
        came, flows = self.sharing.get(x, (0.0, 0))
        return flows == 0 or came * (flows + 1) >= FAIR_FLOOR

    @property
    def fast(self) -> bool:
        return not self.down and self.share >= FAST_LINE


def readings(obs: Observations) -> list[Reading]:
    """Every complete train of the run's measured span, oldest first."""
    rec, span = obs.probes, obs.span
    if rec is None or not rec.train or span is None:
        return []
    downs = down_windows(obs)
    spans: dict[int, tuple[float, float]] = {}
    for op in obs.operations:
        a, b = spans.get(op.config_id, (op.start, op.end))
        spans[op.config_id] = (min(a, op.start), max(b, op.end))
    crossing: dict[int, Counter[str]] = defaultdict(Counter)
    for c in obs.connections:
        crossing[c.config_id].update(set(c.directions()))
    out = []
    for probe in rec.probes.values():
        for train in probe.trains:
            if not span[0] - 0.5 <= train.first <= span[1] + 1.0:
                continue  # the warm-up: slow starts everywhere
            tail = train.tail_bps(rec.train)
            ways = directions(rec.path_at(probe.id, train.first))
            dirs = [obs.directions[d] for d in ways if d in obs.directions]
            back = [
                obs.directions[d]
                for d in directions(rec.back_at(probe.id, train.first))
                if d in obs.directions
            ]
            if tail is None or not dirs:
                continue
            a, b = train.first - BUSY_PAD_S, train.last + BUSY_PAD_S
            loads = {d.name: carried(obs, d, a, b) for d in {*dirs, *back}}
            active = [cid for cid, (x, y) in spans.items() if x <= b and a <= y]
            sharing = {
                d.name: (tail / d.capacity_bps, sum(crossing[cid][d.name] for cid in active))
                for d in dirs
            }
            out.append(
                Reading(
                    probe.id,
                    train.first,
                    train.last,
                    tail / min(d.capacity_bps for d in dirs),
                    frozenset(d.name for d in dirs),
                    frozenset(d.name for d in back),
                    {d: x for d, x in loads.items() if x is not None},
                    any(x <= train.last and train.first <= y for x, y in downs),
                    _retransmitted(probe, train.first - 0.2, train.last + 0.2),
                    sharing,
                    train.last - train.half,
                )
            )
    return sorted(out, key=lambda r: r.first)


def slow_directions(obs: Observations) -> list[Suspect]:
    """Slow link directions placed by the trains (the module docstring): in rounds, the
    direction with the longest slow run (then the most probes), with any other whose run
    is the same trains; their trains are then explained, and the next round looks at the
    rest."""
    reads = [r for r in readings(obs) if not r.down]
    found: dict[str, tuple[float, list[str], float]] = {}
    explained: set[int] = set()
    for _ in range(ROUNDS):
        runs = _runs(reads, explained)
        if not runs:
            break
        best = max(runs, key=lambda d: (len(runs[d]), len({r.probe for r in runs[d]}), d))
        same = [d for d in runs if {id(r) for r in runs[d]} == {id(r) for r in runs[best]}]
        for d in same:
            found[d] = _finding(obs, reads, d, runs[d])
        explained |= {id(r) for r in runs[best]}
    return as_links(found, "slow")


def _runs(reads: Sequence[Reading], explained: set[int]) -> dict[str, list[Reading]]:
    """Each direction's longest slow run, where it qualifies."""
    runs: dict[str, list[Reading]] = {}
    for d in sorted({d for r in reads for d in r.ways}):
        across = [r for r in reads if d in r.ways and id(r) not in explained]
        run = _longest_run(across, d)
        if len(run) < RUN_MIN or len({r.probe for r in run}) < PROBES_MIN:
            continue
        if run[-1].first - run[0].first < RUN_SPAN_S:
            continue
        if sum(1 for r in run if r.paced) < max(1, len(run) // CLEAN_PER):
            continue  # slow because they lost (a lossy link's trains wait for a timer)
        others = _elsewhere(reads, d, run)
        if len(others) < ELSEWHERE_MIN or _slow_share(others) > ELSEWHERE_MAX:
            continue
        runs[d] = run
    return runs


def _finding(
    obs: Observations, reads: Sequence[Reading], d: str, run: Sequence[Reading]
) -> tuple[float, list[str], float]:
    probes = {r.probe for r in run}
    score = min(
        SCORE_MAX,
        SCORE + SCORE_STEP * (len(run) - RUN_MIN) + SCORE_STEP * (len(probes) - PROBES_MIN),
    )
    shares = [r.share for r in run]
    others = _elsewhere(reads, d, run)
    busiest = max((x for r in run for k, x in r.loads.items() if k != d), default=0.0)
    ids = ", ".join(str(p) for p in sorted(probes)[:6]) + (" ..." if len(probes) > 6 else "")
    evidence = [
        f"probe trains: {len(run)} trains in a row across {d} from {len(probes)} probes "
        f"({ids}) between {rel(obs, run[0].first)} and {rel(obs, run[-1].last)} came at "
        f"{statistics.median(shares):.2f} of their path's slowest link (at most "
        f"{max(shares):.2f}; a healthy idle path gives about 1.3), while no other link of "
        f"their ways was busy enough to hold them back so (at most {busiest:.2f} of its "
        "rate carried)",
        f"the other trains meanwhile, not across this link: "
        f"{sum(1 for r in others if r.share < SLOW_LINE)} of {len(others)} slow",
    ]
    return score, evidence, run[0].first


def carried(obs: Observations, d: Direction, start: float, end: float) -> float | None:
    """The share of its rate ``d`` carried between ``start`` and ``end``, by its
    sending switch's transmit counter or else its receiving switch's receive counter
    (polled: from the last poll at or before ``start`` to the first at or after
    ``end``); None without counters."""
    port, column = (d.tx_at, 2) if d.tx_at is not None else (d.rx_at, 1)
    rows = obs.counters.get(port) if port is not None else None
    if not rows:
        return None
    times = [r[0] for r in rows]
    i = max(bisect.bisect_right(times, start) - 1, 0)
    j = min(bisect.bisect_left(times, end), len(rows) - 1)
    if rows[j][0] <= rows[i][0]:
        return None
    moved = max(0, rows[j][column] - rows[i][column])
    return moved * 8 / (rows[j][0] - rows[i][0]) / d.capacity_bps


def _longest_run(across: Sequence[Reading], d: str) -> list[Reading]:
    """The longest stretch of trains slow across ``d`` with no fast one between them."""
    best: list[Reading] = []
    run: list[Reading] = []
    for r in across:
        if r.slow_across(d):
            run.append(r)
            if len(run) > len(best):
                best = list(run)
        elif r.fast and d in r.dirs:  # acknowledgements cross an idle slow link unhurt
            run = []
    return best


def _elsewhere(reads: Sequence[Reading], d: str, run: Sequence[Reading]) -> list[Reading]:
    """The trains that crossed neither direction of ``d``'s link (a slowed link is slow
    both ways) while its run lasted."""
    a, b = run[0].first, run[-1].last
    link = _link(d)
    return [r for r in reads if not link & r.ways and r.last >= a and r.first <= b]


def _slow_share(reads: Sequence[Reading]) -> float:
    return sum(1 for r in reads if r.share < SLOW_LINE) / len(reads) if reads else 0.0


def _link(d: str) -> set[str]:
    src, dst = d.split(">", 1)
    return {d, f"{dst}>{src}"}


def _retransmitted(probe: Probe, start: float, end: float) -> bool:
    """Whether the probe's sender retransmitted between ``start`` and ``end`` (its
    samples every 0.1 s)."""
    inside = [s[2] for s in probe.samples if start <= s[0] <= end]
    before = [s[2] for s in probe.samples if s[0] < start]
    base = before[-1] if before else (inside[0] if inside else 0)
    return bool(inside) and inside[-1] > base
