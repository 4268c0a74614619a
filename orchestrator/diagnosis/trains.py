"""Slow links from the probe mesh's trains: the rate a link gives a burst, placed by paths.

A slow link that no collective crosses leaves no trace in the collectives' connections,
and the probe mesh's small messages do not see it either: 64 bytes cross a quarter-rate
link as fast as a full-rate one. So every probe also sends a train every few seconds
(:mod:`orchestrator.testbed.prober`: 32 kB paced at 1.5 times its path's slowest link),
and its receiver notes when the train's bytes arrived. The second half of a train arrives
at the rate of the slowest link on its path once that link's token bucket is spent:
measured on astral-small at 20 Mbit/s, idle, 1.35 times the slowest link (the pace); a
link slowed to a quarter gives 0.22, to half 0.50.

A train also arrives slowly behind a collective's traffic: a link busy with a ring's
connections gives it a share, 0.1-0.6 of the rate in the measurements. So a train counts
as evidence only when nothing else explains it:

- **slow** (:data:`SLOW_LINE`): its second half came at less than that share of its path's
  slowest link, while no direction of its path carried :data:`BUSY` of its rate or more
  (the ports' counters, :data:`BUSY_PAD_S` around the train) and no port of the fabric was
  down (a failover reroutes);
- **fast**: at :data:`FAST_LINE` or more: every link of its path was at least that fast;
- **excused** otherwise (busy, lossy, a port down): neither.

A direction is slow when :data:`RUN_MIN` of the trains across it in a row, from
:data:`PROBES_MIN` probes or more, were slow with none fast between them, while the trains
elsewhere in the fabric were mostly not (:data:`ELSEWHERE_MAX`: a machine that stalls
slows every train at once, and is no link's fault), and when one in :data:`CLEAN_PER` of
them at least came without a retransmission: a slowed link's small queue overflows under a
train and makes it retransmit too, but a lossy link's trains are slow only when they lost
(a segment waits for a timer) and fast otherwise. The directions whose slow run is part of
another's are dropped (a path's other links: the trains that crossed them and not the slow
one came fast); directions with the same trains cannot be told apart and get the same
score. Both directions of one link slow make the link ``A-B``.

What it cannot see: a link slowed to more than :data:`SLOW_LINE` of its path's slowest
other link (a half-rate link reads 0.5, just above); a link slowed while a collective
keeps it busy at :data:`BUSY` of its rate or more (the queues and the connections' paces
have that case: :func:`orchestrator.diagnosis.detectors.sending_below_rate`); a fault
shorter than the trains across its link take to come three times (a direction has a
train every 1-2 s on the fabrics measured).
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.diagnosis.detectors import rel
from orchestrator.diagnosis.evidence import Direction, Observations
from orchestrator.diagnosis.model import Suspect
from orchestrator.diagnosis.proberecord import Probe, directions
from orchestrator.diagnosis.probes import as_links, down_windows

SLOW_LINE = 0.45  # a train's second half under this share of its path's slowest link
FAST_LINE = 0.8  # ... at this share or more: its path was that fast
BUSY = 0.4  # a direction that carried this share of its rate meanwhile explains a slow train
BUSY_PAD_S = 0.3  # around the train, for the counters polled every 0.5 s
RUN_MIN = 3  # slow trains in a row across a direction
PROBES_MIN = 2  # ... from this many probes at least
ELSEWHERE_MAX = 0.34  # of the other trains meanwhile, slow at most this share
CLEAN_PER = 5  # of a run's trains, one in this many at least arrived without a loss
SCORE = 0.6  # a run of RUN_MIN trains from PROBES_MIN probes
SCORE_STEP = 0.05  # per train beyond, and per probe beyond
SCORE_MAX = 0.85
ROUNDS = 3  # directions taken in turn at most


@dataclass(frozen=True)
class Reading:
    """One train as evidence: when it arrived, its rate against its path's slowest link,
    the directions it crossed, and whether it counts (slow, fast, or neither)."""

    probe: int
    first: float
    last: float
    share: float  # second half's rate / the slowest link of its path
    dirs: frozenset[str]
    verdict: str  # "slow", "fast", or why it is excused: "busy", "down", "between"
    busiest: float  # the highest share of its rate a direction of its path carried
    lost: bool  # its probe retransmitted while it arrived


def readings(obs: Observations) -> list[Reading]:
    """Every complete train of the run's measured span, oldest first."""
    rec, span = obs.probes, obs.span
    if rec is None or not rec.train or span is None:
        return []
    downs = down_windows(obs)
    out = []
    for probe in rec.probes.values():
        for train in probe.trains:
            if not span[0] - 0.5 <= train.first <= span[1] + 1.0:
                continue  # the warm-up: slow starts everywhere
            tail = train.tail_bps(rec.train)
            path = [d for d in directions(rec.path_at(probe.id, train.first))]
            dirs = [obs.directions[d] for d in path if d in obs.directions]
            if tail is None or not dirs:
                continue
            share = tail / min(d.capacity_bps for d in dirs)
            a, b = train.first - BUSY_PAD_S, train.last + BUSY_PAD_S
            loads = [x for x in (carried(obs, d, a, b) for d in dirs) if x is not None]
            busiest = max(loads, default=0.0)
            if any(x <= train.last and train.first <= y for x, y in downs):
                verdict = "down"
            elif share >= FAST_LINE:
                verdict = "fast"
            elif share >= SLOW_LINE:
                verdict = "between"
            elif busiest >= BUSY:
                verdict = "busy"
            else:
                verdict = "slow"
            out.append(
                Reading(
                    probe.id, train.first, train.last, share, frozenset(d.name for d in dirs),
                    verdict, busiest, _retransmitted(probe, train.first - 0.2, train.last + 0.2),
                )
            )  # fmt: skip
    return sorted(out, key=lambda r: r.first)


def slow_directions(obs: Observations) -> list[Suspect]:
    """Slow link directions placed by the trains (the module docstring): in rounds, the
    direction with the longest slow run (then the most probes), with any other whose run
    is the same trains; their trains are then explained, and the next round looks at the
    rest."""
    counted = [r for r in readings(obs) if r.verdict in ("slow", "fast")]
    found: dict[str, tuple[float, list[str], float]] = {}
    for _ in range(ROUNDS):
        runs = _runs(counted)
        if not runs:
            break
        best = max(runs, key=lambda d: (len(runs[d]), len({r.probe for r in runs[d]}), d))
        same = [d for d in runs if {id(r) for r in runs[d]} == {id(r) for r in runs[best]}]
        for d in same:
            found[d] = _finding(obs, counted, d, runs[d])
        explained = {id(r) for r in runs[best]}
        counted = [r for r in counted if id(r) not in explained]
    return as_links(found, "slow")


def _runs(counted: Sequence[Reading]) -> dict[str, list[Reading]]:
    """Each direction's longest slow run, where it qualifies."""
    runs: dict[str, list[Reading]] = {}
    for d in sorted({d for r in counted for d in r.dirs}):
        run = _longest_run([r for r in counted if d in r.dirs])
        if len(run) < RUN_MIN or len({r.probe for r in run}) < PROBES_MIN:
            continue
        if sum(1 for r in run if not r.lost) < max(1, len(run) // CLEAN_PER):
            continue  # slow because they lost (a lossy link's trains wait for a timer)
        if _elsewhere_share(counted, d, run) > ELSEWHERE_MAX:
            continue
        runs[d] = run
    return runs


def _finding(
    obs: Observations, counted: Sequence[Reading], d: str, run: Sequence[Reading]
) -> tuple[float, list[str], float]:
    probes = {r.probe for r in run}
    score = min(
        SCORE_MAX,
        SCORE + SCORE_STEP * (len(run) - RUN_MIN) + SCORE_STEP * (len(probes) - PROBES_MIN),
    )
    shares = [r.share for r in run]
    others = _elsewhere(counted, d, run)
    n_slow = sum(1 for r in others if r.verdict == "slow")
    ids = ", ".join(str(p) for p in sorted(probes)[:6]) + (" ..." if len(probes) > 6 else "")
    evidence = [
        f"probe trains: {len(run)} trains in a row across {d} from {len(probes)} probes "
        f"({ids}) between {rel(obs, run[0].first)} and {rel(obs, run[-1].last)} came at "
        f"{statistics.median(shares):.2f} of their path's slowest link (at most "
        f"{max(shares):.2f}; a healthy idle path gives about 1.3), while no link of their "
        f"paths carried {BUSY:.0%} of its rate (at most {max(r.busiest for r in run):.2f})",
        f"the other trains meanwhile, not across this link: {n_slow} of {len(others)} slow",
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


def _longest_run(across: Sequence[Reading]) -> list[Reading]:
    """The longest stretch of slow trains with no fast one between them."""
    best: list[Reading] = []
    run: list[Reading] = []
    for r in across:
        if r.verdict == "slow":
            run.append(r)
            if len(run) > len(best):
                best = list(run)
        else:
            run = []
    return best


def _elsewhere(counted: Sequence[Reading], d: str, run: Sequence[Reading]) -> list[Reading]:
    """The counted trains that crossed neither ``d`` nor its link's other direction (a
    slowed link is slow both ways) while its run lasted."""
    a, b = run[0].first, run[-1].last
    src, dst = d.split(">", 1)
    link = {d, f"{dst}>{src}"}
    return [r for r in counted if not link & r.dirs and r.last >= a and r.first <= b]


def _elsewhere_share(counted: Sequence[Reading], d: str, run: Sequence[Reading]) -> float:
    others = _elsewhere(counted, d, run)
    return sum(1 for r in others if r.verdict == "slow") / len(others) if others else 0.0


def _retransmitted(probe: Probe, start: float, end: float) -> bool:
    """Whether the probe's sender retransmitted between ``start`` and ``end`` (its
    samples every 0.1 s)."""
    inside = [s[2] for s in probe.samples if start <= s[0] <= end]
    before = [s[2] for s in probe.samples if s[0] < start]
    base = before[-1] if before else (inside[0] if inside else 0)
    return bool(inside) and inside[-1] > base
