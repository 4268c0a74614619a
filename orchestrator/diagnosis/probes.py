"""What the probe mesh saw: losses and holes placed by the probes' paths (tomography).

The probe mesh (orchestrator.testbed.probemesh) keeps a few small TCP probes on paths that
cover every link direction, with their senders' kernel counters every 0.1 s. Two patterns
place a fault the collectives' connections may never cross:

- **Losses** (:func:`probe_losses`): a probe's retransmission is evidence of a loss on its
  path only when no egress queue on its way or its acknowledgements' way discarded
  packets within :data:`PAD_S` of it (a full queue drops probes as it drops everything,
  and acknowledgements too, and the probe's timer retries a segment it dropped after
  0.2 s, 0.4 s, 0.8 s: :func:`~orchestrator.diagnosis.detectors.discards_of`), when the
  probe was not stalled (a stall's retransmissions are the timer's retries, read as a
  hole below), when no port of the fabric was down (the controller's events say that
  fault) and not at a pause of the machine (:func:`machine_pauses`). Of the directions
  the lossy probes crossed, the one crossed by the most of them is taken (then the next,
  for what it leaves unexplained) when at least
  :data:`SUPPORT_MIN` probes lost :data:`LOSS_MIN` segments across it, the probes that
  crossed it without losing, while it lost, are fewer than half of those that did (a 3 %
  loss drops one of a probe's 20 messages a second every 1.7 s, so a probe crossing it
  for a few seconds hardly stays clean), and they lost at :data:`RATE_MIN` segments a
  second each or more from their first loss to their last: a lossy link drops its share
  of every message while the fault lasts, a congested fabric's leftovers a few now and
  then over minutes. A probe is counted once however many tracings it was seen in.
  Measured on astral-small (docs/diagnosis.md): a 3 % loss on an aggregation link the
  ring did not cross, 8 probes across it lost 2-8 segments each in 7 s beyond the
  queues' discards; every other probe at most 1 in the whole run.
- **Holes** (:func:`probe_holes`): a probe that had messages outstanding and nothing
  acknowledged for :data:`HOLE_S` sends into a hole (a blackhole's drop rule, a link that
  drops everything without going down). The switches on every stalled probe's path,
  without those that carried probes to the same destinations on through the same time,
  are the suspects; a destination-specific hole (probes through the switch to other GPUs
  went on) says so. A hole leaves the probes that do not pass it alone: when most of the
  probes stalled alongside a suspect's did not pass it, and the counters do not place
  silent drops at it, the whole fabric stalled (:func:`_fabric_wide`), and the suspect
  is only half as likely. A stall while queues on the probe's ways discarded is taken for
  congestion's timeouts unless the counters place its retries at a switch it alone
  passed (:func:`_placed_by_counters`).

Both say what they cannot tell apart: suspects with the same evidence get the same score.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.diagnosis.detectors import (
    UNCOUNTED_PAD_S,
    Leak,
    discards_of,
    live_silent,
    reads_live,
    rel,
    switch_leaks,
    window_silent,
)
from orchestrator.diagnosis.egress import unforwarded
from orchestrator.diagnosis.evidence import Observations
from orchestrator.diagnosis.model import FABRIC_WIDE, THRESHOLD, Suspect
from orchestrator.diagnosis.proberecord import (
    HOLE_S,
    Port,
    Probe,
    ProbeRecord,
    directions,
    egress,
    stalls,
)

LOSS_MIN = 4  # segments the lossy probes across a direction retransmitted, together
SUPPORT_MIN = 2  # probes that lost across it
PER_PROBE = 2  # segments each, on average (a healthy run's probes: at most 1 in a run)
RATE_MIN = 0.3  # segments a second each, first loss to last (a 3 % loss: 0.6; healthy: 0.14)
ALONE_MIN = 20  # silent drops at one switch, at least (healthy runs: 5-22 spread over many)
ALONE_SHARE = 0.75  # of every switch's silent drops together, at least
OVER_QUEUED = 0.1  # of what the switch's full queues discarded, at least
PAD_S = 2.0  # a discard excuses the retransmissions this long after (a timer's 3 retries)
AGAINST_SHARE = 0.5  # clean probes across it, at most this share of the lossy ones
ACTIVE_SHARE = 0.5  # a clean probe counts against a direction if observed this much of its
DOWN_PAD_S = 2.0  # after a port came up, what its failover and rerouting still disturb
ROUNDS = 3  # directions taken in turn at most
CONTRAST = 5.0  # x the loss rate of the probes not across it, at least
SILENT_MIN = 5  # packets a switch dropped silently while probes stalled (in flight: a few)
STANDS_OUT_MIN = 20  # ... or this many, where the others tied with it dropped some too,
STANDS_OUT_OVER = 3.0  # ... and this many times each of theirs
USUAL_WINDOWS = 4  # windows of the run apart from a stall that say what a switch drops
# ... and a hole's drops are more than this many times that (a window of 2 s or more holds
# one 0.5 s sample more or less than another: up to a quarter of its count)
USUAL_OVER = 1.5
USUAL_MOST = 24  # ... windows read at most (a live look reads every such stall each second)
SHARE_MIN = 0.5  # of the probes stalled alongside a hole's, those through it, at least
UNREAD_S = 1.0  # no port counter read this long: the fabric's switches paused
EXPECTED_MIN = 5.0  # losses a lossy direction would have dealt its clean probes (P(0) < 1 %)
CLEARED = 0.5  # x the score of a lossy suspect its clean probes speak against
PLACED_STEP = 0.05  # below a twin direction the counters place the drops at better
# Losses of many probes at one instant over paths no one link joins are the machine's:
# its CPU held the switches' process past every probe's retransmission timer (the CI run of
# 2026-12-07: vswitchd waited for a core 0.48-0.82 of 0.2 s, and 62 of 65 probes
# retransmitted once within 0.07 s of each other while one link lost 15 %)
PAUSE_S = 0.2  # losses this close to the first of them are one instant (probers sample apart)
PAUSE_PROBES = 6  # probes that lost then, at least
PAUSE_SHARE = 0.5  # ... no link on the ways there or back of more than this share of them


def down_windows(obs: Observations) -> list[tuple[float, float]]:
    """While any port of the fabric was down (the controller's port-status), padded by
    :data:`DOWN_PAD_S` after it came up; to the end of the run if it never did."""
    end = max((s[-1][0] for s in _all_samples(obs)), default=0.0)
    down: dict[tuple[str | None, int | None], float] = {}
    out = []
    for e in obs.events:
        key = (e.switch, e.port)
        if e.kind == "port-down":
            down.setdefault(key, e.t)
        elif e.kind == "port-up" and key in down:
            out.append((down.pop(key) - 0.5, e.t + DOWN_PAD_S))
    out += [(t - 0.5, end + 1.0) for t in down.values()]
    return out


def _all_samples(obs: Observations) -> list[list[tuple[float, int, int, int, int, int]]]:
    rec = obs.probes
    return [p.samples for p in rec.probes.values() if p.samples] if rec is not None else []


def _covered(spans: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] inside the union of ``spans``."""
    total, reach = 0.0, a
    for x, y in sorted(spans):
        x, y = max(x, reach), min(y, b)
        if y > x:
            total += y - x
            reach = y
    return total


def _inside(spans: Sequence[tuple[float, float]], t0: float, t1: float) -> bool:
    return any(a <= t1 and t0 <= b for a, b in spans)


class _Spans:
    """The union of closed spans, asked whether an interval touches it: in time order and
    disjoint, so one bisection answers (:func:`_inside` over every span of a probe's
    stalls, the downs and its ports' discards, for each of its samples, was two thirds
    of a live diagnosis's time)."""

    def __init__(self, spans: Iterable[tuple[float, float]]) -> None:
        merged: list[tuple[float, float]] = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.starts = [a for a, _ in merged]
        self.ends = [b for _, b in merged]

    def touch(self, t0: float, t1: float) -> bool:
        """Whether [t0, t1] and a span share an instant (as :func:`_inside`)."""
        i = bisect.bisect_left(self.ends, t0)  # the first span ending at t0 or later
        return i < len(self.starts) and self.starts[i] <= t1


@dataclass
class _Unit:
    """One probe under one tracing: its directions, and when and what it lost."""

    probe: Probe
    dirs: set[str]
    losses: list[tuple[float, int]]
    observed: list[tuple[float, float]]  # sample intervals not excused

    @property
    def lost(self) -> int:
        return sum(n for _, n in self.losses)

    def observed_within(self, a: float, b: float) -> float:
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in self.observed)


def _units(obs: Observations, excuse_discards: bool = True) -> list[_Unit]:
    """Every probe under every tracing, with the losses the rules may count: not while it
    stalled or a port was down, nor (``excuse_discards``) while a queue on either of its
    ways discarded."""
    rec = obs.probes
    if rec is None:
        return []
    discards = _discards(obs, rec, PAD_S)
    quiet = discards if excuse_discards else {}
    # live, a loss after a port's last queue sample so far is not judged yet: the queue
    # samples come every 0.5 s, the probes' every 0.1 s, and a discard shows only at the
    # sample after it (seed 56 runs 21 and 45, healthy sweeps: probes that lost at a new
    # size's first burst were alerted as a lossy ToR uplink at 0.7 and 0.9, where the
    # next queue sample of that uplink showed its discards)
    judged = _queues_read_until(obs, rec) if excuse_discards and reads_live(obs) else {}
    downs = down_windows(obs)
    pauses = machine_pauses(rec, downs, discards)
    span = obs.span
    units = []
    end = max((s[-1][0] for s in _all_samples(obs)), default=0.0)
    stalled: dict[int, list[tuple[float, float]]] = {}  # per probe, under every tracing
    for start, until, paths in rec.periods(end):
        for pid, path in paths.items():
            probe = rec.probes.get(pid)
            if probe is None or len(path) < 2:
                continue
            # a full queue on the acknowledgements' way makes the sender retry too
            ports = egress(path) + egress(rec.back_at(pid, start))
            if pid not in stalled:
                stalled[pid] = stalls(probe)
            # its stalls, the downs, the machine's pauses and (excuse_discards) its
            # ways' discards
            excused = _Spans(
                itertools.chain(
                    stalled[pid],
                    downs,
                    pauses,
                    *(quiet.get(p, ()) for p in ports),
                )
            )
            # live: the last instant every queue on its ways has been sampled to
            judged_until = min((judged.get(p, math.inf) for p in ports), default=math.inf)
            unit = _Unit(probe, set(directions(path)), [], [])
            lost = {t1: n for _, t1, n in probe.losses()}
            for (t0, *_), (t1, *_) in itertools.pairwise(probe.samples):
                if t1 <= start or t1 > until:
                    continue
                if span is not None and not (span[0] <= t1 <= span[1] + 1.0):
                    continue  # the warm-up's slow starts lose what no counter saw
                if excused.touch(t0, t1):
                    continue
                if t1 > judged_until:
                    continue
                unit.observed.append((t0, t1))
                if t1 in lost:
                    unit.losses.append((t1, lost[t1]))
            units.append(unit)
    return units


def machine_pauses(
    rec: ProbeRecord,
    downs: Sequence[tuple[float, float]] = (),
    discards: Mapping[Port, Sequence[tuple[float, float]]] | None = None,
) -> list[tuple[float, float]]:
    """Instants at which :data:`PAUSE_PROBES` probes or more lost a segment together (within
    :data:`PAUSE_S` of the first) and no link was on the ways, there or back, of more than
    :data:`PAUSE_SHARE` of them: (first loss, last loss). A lossy link drops only what
    crosses it, data or acknowledgements, so the probes that lose together at its hand
    share it (a probe's acknowledgements lost make it retry too, and a link's two
    directions are one fault: seed 65 run 4's flapping core link, probes across it both
    ways, was first read as a pause); probes all over the fabric losing at once are their
    timers firing while the emulator's process waited for the CPU, no link's loss (a
    spurious retransmission, which the receiver may not report as a duplicate when the
    original was still queued in the switch process). Losses while a port was down
    (``downs``: :func:`down_windows`) are that fault's, and those while a queue on the
    probe's ways discarded (``discards``, as :func:`_units` reads them) congestion's:
    both are set aside already, and an all-to-all's synchronized bursts overflow queues
    all over the fabric at once (seed 65 run 37: 8 probes within 0.2 s, read as a pause
    before this)."""
    held = _Spans(downs)
    discards = discards or {}

    def congested(pid: int, t0: float, t1: float) -> bool:
        ports = egress(rec.path_at(pid, t1)) + egress(rec.back_at(pid, t1))
        return any(_inside(discards.get(port, ()), t0, t1) for port in ports)

    losses = sorted(
        (t1, pid)
        for pid, p in rec.probes.items()
        for t0, t1, _ in p.losses()
        if not held.touch(t0, t1) and not congested(pid, t0, t1)
    )
    out: list[tuple[float, float]] = []
    i = 0
    while i < len(losses):
        j = i
        while j < len(losses) and losses[j][0] - losses[i][0] <= PAUSE_S:
            j += 1
        together = losses[i:j]
        pids = {pid for _, pid in together}
        at = together[0][0]
        if len(pids) >= PAUSE_PROBES:
            crossed = Counter(link for pid in pids for link in _links_at(rec, pid, at))
            if max(crossed.values(), default=0) <= PAUSE_SHARE * len(pids):
                out.append((at, together[-1][0]))
                i = j
                continue
        i += 1  # the next loss may begin the instant (a stray one came just before it)
    return out


def _links_at(rec: ProbeRecord, pid: int, t: float) -> set[str]:
    """The links (``A-B``, whichever way) a probe's packets or its acknowledgements crossed
    at ``t``."""
    ways = directions(rec.path_at(pid, t)) + directions(rec.back_at(pid, t))
    return {"-".join(sorted(d.split(">", 1))) for d in ways}


def pause_notes(obs: Observations) -> list[str]:
    """What :func:`machine_pauses` set aside, for the diagnosis's notes."""
    rec = obs.probes
    if rec is None:
        return []
    notes = []
    for a, b in machine_pauses(rec, down_windows(obs), _discards(obs, rec, PAD_S)):
        lost = {pid for pid, p in rec.probes.items() for _, t, _ in p.losses() if a <= t <= b}
        notes.append(
            f"probes: {len(lost)} probes lost a segment together at {_rel(obs, a)} on paths "
            "no one link joins: the emulator's process paused (its CPU), not a link; those "
            "losses are not counted"
        )
    return notes


def _tally(lossy: Sequence[_Unit], start: str = "") -> tuple[dict[str, set[int]], Counter[str]]:
    """Per direction (those beginning with ``start``): the lossy probes across it, and the
    segments they lost there together (a probe under several tracings counts once as a
    witness, each tracing's losses add)."""
    support: dict[str, set[int]] = {}
    lost: Counter[str] = Counter()
    for u in lossy:
        for d in u.dirs:
            if d.startswith(start):
                support.setdefault(d, set()).add(u.probe.id)
                lost[d] += u.lost
    return support, lost


def probe_losses(obs: Observations) -> list[Suspect]:
    """Lossy link directions placed by the probes (the module docstring)."""
    units = _units(obs)
    lossy = [u for u in units if u.lost]
    found: dict[str, tuple[float, list[str], float]] = {}
    leaks: Mapping[str, Leak] | None = None  # read once a direction is found
    for _ in range(ROUNDS):
        if not lossy:
            break
        # probes, not units: a probe seen under several tracings is one witness
        support, lost = _tally(lossy)
        # on a tie, the one fewer probes crossed cleanly while the lossy ones lost (a
        # direction the same lossy probes crossed, and clean ones too, is less likely),
        # then the other direction of a link already found (one fault on a link rather
        # than two), then the more segments lost
        most = max(len(v) for v in support.values())
        clean = {d: _clean(units, lossy, d, support[d]) for d in support if len(support[d]) == most}
        best = max(
            clean,
            key=lambda d: (-len(clean[d]), _reverse(d) in found, lost[d], d),
        )
        witnesses = len(support[best])
        if witnesses < SUPPORT_MIN or lost[best] < max(LOSS_MIN, PER_PROBE * witnesses):
            break
        crossing = [u for u in lossy if best in u.dirs]
        times = [t for u in crossing for t, _ in u.losses]
        first, last = min(times), max(times)
        against = clean[best]
        if len(against) > AGAINST_SHARE * witnesses:
            break
        # a lossy link drops its share of every message while it lasts: a few segments
        # now and then over minutes are a congested fabric's leftovers
        rate = lost[best] / witnesses / max(last - first, 1.0)
        if rate < RATE_MIN:
            break
        # the probes elsewhere lost too: a machine that drops everywhere, not a link
        inside = sum(u.lost for u in crossing) / max(_seconds(crossing), 1.0)
        rest = [u for u in units if best not in u.dirs]
        outside = sum(u.lost for u in rest) / max(_seconds(rest), 1.0)
        if inside < CONTRAST * outside:
            break
        score = min(0.9, 0.6 + 0.1 * witnesses) - 0.1 * len(against)
        others = len({u.probe.id for u in lossy} - support[best])
        evidence = [
            f"probes: {witnesses} probes across {best} lost {lost[best]} segments between "
            f"{_rel(obs, first)} and {_rel(obs, last)} ({rate:.2f} a second each) while "
            f"no queue on their ways discarded ({_probe_list(crossing)})",
            f"{len(against)} probe(s) crossed it without losing then"
            + (
                f"; {others} other lossy probe(s) elsewhere"
                if others
                else "; every lossy probe crossed it"
            ),
        ]
        # the directions every one of these probes crossed, and no other lossy probe:
        # the probes cannot tell them from the chosen one (a GPU's probes all leave by
        # its link, and its ToR may send them all up one uplink)
        twins = [
            d for d in clean
            if d != best and support[d] == support[best] and lost[d] == lost[best]
            and len(clean[d]) == len(against) and d not in found and _reverse(d) != best
        ]  # fmt: skip
        if twins:
            evidence.append(
                f"the probes cannot tell {best} from {', '.join(sorted(twins))}: the same "
                "probes crossed them, and no other"
            )
        if leaks is None:
            leaks = switch_leaks(obs) if obs.queues else {}
        for d, (placed, said) in _placed_by_leaks([best, *twins], leaks).items():
            found[d] = (score - PLACED_STEP * placed, evidence + said, first)
        lossy = [u for u in lossy if best not in u.dirs]
    return as_links(found, "lossy")


def _placed_by_leaks(
    group: Sequence[str], leaks: Mapping[str, Leak]
) -> dict[str, tuple[int, list[str]]]:
    """Directions the probes cannot tell apart, each with how far below the best placed of
    them the switches' counters put it (in :data:`PLACED_STEP` steps) and what the
    counters say of it. A lossy link drops at its sending end's egress, before the port
    counts the packet, so the switch a direction leaves dropped what no full queue of its
    explains (:func:`~orchestrator.diagnosis.detectors.switch_leaks`); a loss on the link
    both ways drops at both its ends. Seed 65 run 41, a 1 % loss on an aggregation-core
    link both ways: two probes lost across four directions in a row, and the counters
    placed drops at the link's two ends alone, yet another of the four came first by
    name. Without a leak at any of them, all stand alike."""

    def placed(d: str) -> int:
        a, b = d.split(">", 1)
        return (a in leaks) + (a in leaks and b in leaks)

    best = max(placed(d) for d in group)
    out: dict[str, tuple[int, list[str]]] = {}
    for d in group:
        a, b = d.split(">", 1)
        said = []
        if a in leaks:
            said.append(
                f"counters: {a}, which {d} leaves, dropped {leaks[a].silent:,} packets no full "
                "queue of its explains"
                + (f", and {b} at the link's other end {leaks[b].silent:,}" if b in leaks else "")
            )
        elif best:
            said.append(
                f"but {a}, which {d} leaves, was no more packets short than its full "
                "queues' discards and the counters' noise explain"
            )
        out[d] = (best - placed(d), said)
    return out


def cleared_by_probes(obs: Observations, suspects: Sequence[Suspect]) -> None:
    """Scale down a lossy link the probes did not name when probes crossed it without
    losing while the probes' own lossy link lost (in place).

    Why: the connections' retransmissions and the switches' counters place a loss on a
    connection's path, and a loss at a GPU's end of its link is dropped in the GPU,
    uncounted: the counters then see only the acknowledgements that link's switch end
    dropped, and the retransmitting connection's next egress at that switch takes the
    blame (seeds 17, 21 and 23: a GPU's lossy link named as its ToR's uplink). A direction
    losing as much as the probes' own rule needs (:data:`RATE_MIN` segments a second of
    a probe's messages: 1.5 % at 20 a second) would have dealt the probes that crossed it
    :data:`EXPECTED_MIN` losses or more; when those probes lost none while the probes'
    lossy link lost, the direction is cleared (its score times :data:`CLEARED`), and the
    evidence says so."""
    rec = obs.probes
    if rec is None:
        return
    floor = RATE_MIN * rec.interval  # of a direction's messages lost, at least
    named = [
        s for s in suspects
        if s.component == "link" and s.fault == "lossy" and _from_probes(s)
        and s.score >= THRESHOLD
    ]  # fmt: skip
    if not named:
        return
    units = _units(obs)
    windows = []
    for s in named:
        ways = _ways_of(s.target)
        times = [t for u in units if u.dirs & ways for t, _ in u.losses]
        if times:
            windows.append((min(times), max(times)))
    if not windows:
        return
    a, b = min(w[0] for w in windows), max(w[1] for w in windows)
    for s in suspects:
        if s.component != "link" or s.fault != "lossy" or _from_probes(s):
            continue
        cleared = []
        for d in sorted(_ways_of(s.target)):
            clean = [
                u for u in units
                if d in u.dirs and not any(a <= t <= b for t, _ in u.losses)
            ]  # fmt: skip
            messages = sum(u.observed_within(a, b) / u.probe.every for u in clean) / rec.interval
            if messages * floor < EXPECTED_MIN:
                break
            cleared.append(f"{len(clean)} probes across {d} sent {messages:.0f} messages")
        else:
            s.score *= CLEARED
            s.evidence.append(
                f"but probes: {'; '.join(cleared)} between {_rel(obs, a)} and {_rel(obs, b)}, "
                f"while the probes' lossy link lost, and lost none: at {floor:.1%} loss "
                f"they would have lost {EXPECTED_MIN:g} or more"
            )


def _from_probes(s: Suspect) -> bool:
    return any(e.startswith("probes:") for e in s.evidence)


def _ways_of(target: str) -> set[str]:
    """The directions a link suspect names: ``A>B``, or both of ``A-B``."""
    if ">" in target:
        return {target}
    a, _, b = target.partition("-")
    return {f"{a}>{b}", f"{b}>{a}"}


def leaking_egress(obs: Observations, leaks: Mapping[str, Leak]) -> list[Suspect]:
    """A lossy egress of the one switch the counters place silent drops at.

    Why: under an all-to-all every queue discards, and the loss rule above excuses a
    probe's losses near any discard on its ways, so a 3 % loss on a link the congestion
    also crosses goes unnamed, though the switch's counters say packets vanished inside
    it and nowhere else (:func:`~orchestrator.diagnosis.detectors.switch_leaks`: a lossy
    link's drops happen at its sending switch's egress, before the port counts them).
    The counters cannot say which egress; the probes can: of the switch's egress
    directions, the one whose probes lost the most segments per second observed,
    congestion's included (they fall on every egress alike). A switch counts as leaking
    alone with at least :data:`ALONE_MIN` silent drops, :data:`ALONE_SHARE` of every
    switch's together, and :data:`OVER_QUEUED` of what its full queues discarded: the
    queues and the ports are sampled apart, and at a switch whose queues discard hundreds
    of packets the two counts differ by a few percent with nothing lost (a healthy pinned
    ring: 30 silent beside 451 discarded; a link down: 24 beside 324, both before the
    runs sampled a quiet tail), where the lossy links of the suites left 0.11-95 times
    their switch's discards (a quarter until 2026-12-06 missed a ToR uplink's loss, 56
    beside 371; no healthy switch of eleven saved suites was 20 short with 75 % of the
    total). The score grows with how far the chosen egress stands out."""
    total = sum(max(0, leak.silent) for leak in leaks.values())
    # at least ALONE_SHARE (over half) of every switch's: one switch at most
    switch = max(leaks, key=lambda sw: leaks[sw].silent, default=None)
    if switch is None or obs.probes is None:
        return []
    if leaks[switch].silent < max(ALONE_MIN, ALONE_SHARE * total):
        return []
    if leaks[switch].silent < OVER_QUEUED * (leaks[switch].queued or 0):
        return []  # the queues' count lagging the ports' at a congested switch
    per: dict[str, list[_Unit]] = {}
    for u in _units(obs, excuse_discards=False):
        for d in u.dirs:
            if d.startswith(f"{switch}>"):
                per.setdefault(d, []).append(u)
    rates = {
        d: sum(u.lost for u in crossing) / max(_seconds(crossing), 1.0)
        for d, crossing in per.items()
    }
    ranked = sorted(rates, key=lambda d: (-rates[d], d))
    if not ranked or rates[ranked[0]] <= 0:
        return []
    best = ranked[0]
    runner = rates[ranked[1]] if len(ranked) > 1 else 0.0
    if runner >= rates[best]:
        return []  # a tie: the probes cannot say which egress
    contrast = rates[best] / runner if runner > 0 else math.inf
    score = min(0.8, 0.55 + 0.1 * min(contrast - 1.0, 2.5))
    crossing = per[best]
    lost = sum(u.lost for u in crossing)
    times = [t for u in crossing for t, _ in u.losses]
    evidence = [
        f"counters: {switch} dropped {leaks[switch].silent:,} packets that no full queue "
        f"of its explains, {leaks[switch].silent / max(total, 1):.0%} of every switch's",
        f"probes: of its egress directions, {best}'s {len({u.probe.id for u in crossing})} "
        f"probe(s) lost the most, {lost} segments, {rates[best]:.2f} a second observed"
        + (f" against {runner:.2f} at the next ({ranked[1]})" if len(ranked) > 1 else "")
        + " (congestion's losses counted too: they fall on every egress alike)",
    ]
    return [Suspect("link", best, "lossy", score, evidence, min(times, default=None))]


def agreeing_egress(obs: Observations, leaks: Mapping[str, Leak]) -> list[Suspect]:
    """A lossy egress that the counters and the probes name together, each under its own
    line.

    Why: a 3 % loss crossed by little traffic leaves weak traces in every layer at once.
    On a pinned ring (seed 34, run 15) the lossy ToR uplink's switch dropped 19 packets no
    queue explains (:data:`ALONE_MIN` asks for 20), the 3 probes across it lost 5
    segments (:func:`probe_losses` asks for 2 each), and no other probe lost any; on an
    aggregation link (seed 33, run 15) 2 probes lost 7 while 2 others crossed it clean.
    Each alone is what a healthy fabric shows now and then; together they point at one
    egress. Healthy runs (118 of them over eleven suites) had at most one probe losing
    beyond the queues' discards, never two across one direction. So: the switch that
    dropped the most packets no full queue explains (:data:`SILENT_MIN` or more), and of
    its egress directions the one the most lossy probes crossed, when those are
    :data:`SUPPORT_MIN` or more with :data:`LOSS_MIN` segments together, at least half of
    every lossy probe of the run, and no fewer than the probes that crossed it clean
    while they lost. Scored under the rules that see it alone."""
    ranked = sorted(leaks, key=lambda sw: (-leaks[sw].silent, sw))
    if not ranked or obs.probes is None:
        return []
    switch = ranked[0]
    silent = leaks[switch].silent
    if silent < SILENT_MIN or (len(ranked) > 1 and leaks[ranked[1]].silent >= silent):
        return []
    units = _units(obs)
    lossy = [u for u in units if u.lost]
    support, lost = _tally(lossy, f"{switch}>")
    if not support:
        return []
    ranked_dirs = sorted(support, key=lambda d: (-len(support[d]), -lost[d], d))
    best = ranked_dirs[0]
    witnesses = support[best]
    if len(ranked_dirs) > 1 and len(support[ranked_dirs[1]]) == len(witnesses):
        return []  # the probes cannot say which egress
    everyone = {u.probe.id for u in lossy}
    against = _clean(units, lossy, best, witnesses)
    if (
        len(witnesses) < SUPPORT_MIN
        or lost[best] < LOSS_MIN
        or len(witnesses) < 0.5 * len(everyone)
        or len(against) > len(witnesses)
    ):
        return []
    crossing = [u for u in lossy if best in u.dirs]
    times = [t for u in crossing for t, _ in u.losses]
    score = min(0.7, 0.55 + 0.05 * (len(witnesses) - len(against)))
    evidence = [
        f"counters: {switch} dropped {silent:,} packets that no full queue of its explains, "
        "the most of any switch",
        f"probes: {len(witnesses)} probe(s) across {best} lost {lost[best]} segments between "
        f"{_rel(obs, min(times))} and {_rel(obs, max(times))} while no queue on their ways "
        f"discarded ({_probe_list(crossing)}); {len(everyone) - len(witnesses)} lossy "
        f"probe(s) elsewhere, {len(against)} crossed it without losing",
        "each under its own rule's line; together they name one egress",
    ]
    return [Suspect("link", best, "lossy", score, evidence, min(times))]


def probe_holes(obs: Observations) -> list[Suspect]:
    """Switches that dropped everything some probes sent, or their acknowledgements (the
    module docstring)."""
    rec = obs.probes
    if rec is None:
        return []
    downs = down_windows(obs)
    quiet = _discards(obs, rec)
    span = obs.span
    held: list[tuple[Probe, tuple[float, float]]] = []
    kept: dict[int, tuple[str, int]] = {}  # stalls the counters kept: (switch, silent drops)
    for probe in rec.probes.values():
        for a, b in stalls(probe):
            if _inside(downs, a, b):
                continue
            if span is not None and not (span[0] - 1.0 <= b and a <= span[1] + 1.0):
                continue
            # a congested queue on the way drops the timer's retries too: only the time
            # no queue on either way discarded counts
            ports = egress(rec.path_at(probe.id, a)) + egress(rec.back_at(probe.id, a))
            excused = [w for p in ports for w in quiet.get(p, ())]
            if b - a - _covered(excused, a, b) < HOLE_S:
                placed = _placed_by_counters(obs, rec, probe, a, b)
                if placed is None:
                    continue
                kept[probe.id] = placed
            held.append((probe, (a, b)))
    if not held:
        return []
    first = min(s[0] for _, s in held)
    last = max(s[1] for _, s in held)
    stalled = {p.id for p, _ in held}
    cleared: set[tuple[str, str]] = set()
    went_on: Counter[str] = Counter()  # switch -> probes through it that went on
    for probe in rec.probes.values():
        if probe.id not in stalled and _moved(probe, first, last):
            ways = _ways(rec, probe, first)
            cleared |= ways
            went_on.update({switch for switch, _ in ways})
    left = [_ways(rec, p, a) - cleared for p, (a, _) in held]
    by_probe: dict[int, set[str]] = {}
    for (p, _), ways in zip(held, left, strict=True):
        by_probe.setdefault(p.id, set()).update(s for s, _ in ways)
    count: Counter[str] = Counter(switch for switches in by_probe.values() for switch in switches)
    if not count:
        return []
    most = max(count.values())
    suspects = sorted(switch for switch, n in count.items() if n == most)
    # one drop rule for one GPU explains more simply than one for each of several: the
    # switch that needs the fewest destinations to explain every stalled probe
    rules = {x: _destinations_needed(x, held, left) for x in suspects}
    fewest = min(rules.values())
    suspects = [x for x in suspects if rules[x] == fewest]
    if len(suspects) > 1:
        # the probes cannot tell them apart; the counters can, if one of them dropped
        # packets that no full queue of its explains while the probes stalled
        silent = {x: _silent(obs, x, first, last) for x in suspects}
        dropped = [x for x in suspects if silent[x] >= SILENT_MIN]
        loudest = max(suspects, key=lambda x: (silent[x], x))
        if len(dropped) == 1:
            suspects = dropped
        elif silent[loudest] >= STANDS_OUT_MIN and all(
            silent[loudest] >= STANDS_OUT_OVER * silent[x] for x in suspects if x != loudest
        ):
            # several dropped a few (what crosses a busy switch between the replies of
            # one poll reads so: seed 68 run 34, a hole at an aggregation switch 92
            # packets short beside the core and the other pod's switch on the same
            # stalled probes' paths at 5 and 9)
            suspects = [loudest]
    score = (0.9 if most >= 2 else 0.75) - (0.15 if len(suspects) > 1 else 0.0)
    port_state = "no port down" if obs.events_known else "whether a port was down not recorded"
    out = []
    for switch in suspects:
        towards = sorted({d for ways in left for s, d in ways if s == switch})
        # a probe may have stalled more than once: each counts once
        victims = list(
            {
                p.id: p
                for (p, _), ways in zip(held, left, strict=True)
                if switch in {s for s, _ in ways}
            }.values()
        )
        spread = _fabric_wide(obs, switch, held, left)
        evidence = [
            f"probes: {len(victims)} probe(s) whose packets or acknowledgements crossed "
            f"{switch} towards {', '.join(towards)} had nothing acknowledged for "
            f"{HOLE_S:g} s or more between {_rel(obs, first)} and {_rel(obs, last)} "
            f"({_probe_list(victims)}), {port_state}; no probe that went on then took "
            f"{switch} towards {' or '.join(towards)}",
            (
                f"{went_on[switch]} probe(s) through {switch} to other GPUs went on: it "
                "drops what goes to those destinations only"
                if went_on[switch]
                else f"no probe through {switch} went on"
            ),
        ]
        if len(suspects) > 1:
            evidence.append(f"the probes cannot tell apart {', '.join(suspects)}")
        weak = [p.id for p in victims if p.id in kept]
        if weak:
            at, short_by = kept[weak[0]]
            evidence.append(
                f"{len(weak)} of them stalled while queues on their ways discarded "
                f"(congestion's timeouts look alike), kept because {at} dropped {short_by} "
                "packets no full queue of its explains meanwhile"
            )
        others = len(stalled) - len(victims)
        if others:
            evidence.append(f"{others} other stalled probe(s) not through it")
        suspect = Suspect("switch", switch, "blackhole", score, evidence, first)
        if spread is not None:
            suspect.score *= 0.5
            suspect.evidence.append(spread)
            suspect.signs.add(FABRIC_WIDE)
        out.append(suspect)
    return out


def _placed_by_counters(
    obs: Observations, rec: ProbeRecord, probe: Probe, start: float, end: float
) -> tuple[str, int] | None:
    """A stall the queues' discards excuse that the counters place at a hole anyway: a
    switch the stalled probe's packets or acknowledgements crossed, that no probe which
    went on meanwhile passed towards the same GPU, dropped :data:`SILENT_MIN` packets or
    more that no full queue of its explains while it stalled, and more than
    :data:`USUAL_OVER` times what it drops so at other times of the run
    (:func:`_usual_silent`) ((switch, drops), the most such; None when none did).

    Why: a blackhole for one GPU that only one probe crosses, on a path a collective keeps
    busy (an all-to-all, a ring's busy links), stalls that probe while its ways' queues
    discard, and the rule above takes the stall for congestion's timeouts. The timer's
    retries die in the hole, uncounted by any queue: the hole's switch is that many
    packets short (seeds 37 and 48: 8 and 10 packets beside a stall of 7.4 s and 6
    retries), where a congestion stall's retries die in full queues (the switches such
    stalls left uncleared, in eleven saved suites: at most 3 packets short)."""
    cleared: set[tuple[str, str]] = set()
    for other in rec.probes.values():
        if other.id != probe.id and _went_on(other, start, end):
            cleared |= _ways(rec, other, start)
    left = {switch for switch, _ in _ways(rec, probe, start) - cleared}
    silent = {switch: _silent(obs, switch, start, end) for switch in sorted(left)}
    # the most first; one that drops so at other times too leaks of its own, and the
    # next may still be the hole
    for switch in sorted(silent, key=lambda x: (-silent[x], x)):
        if silent[switch] < SILENT_MIN:
            return None
        usual = _usual_silent(obs, switch, start, end, stalls(probe))
        if silent[switch] > USUAL_OVER * usual:
            return switch, silent[switch]
    return None


def _usual_silent(
    obs: Observations,
    switch: str,
    start: float,
    end: float,
    stalled: Sequence[tuple[float, float]] = (),
) -> int:
    """What ``switch`` drops silently over as long as ``start``-``end`` at other times of
    the run: the second most of the windows of that length that tile the run's span,
    each a window's length or more away from the stall and clear of ``stalled`` (the
    probe's other stalls: a hole that stalls it again drops again), :data:`USUAL_MOST` of
    them at most, spread over the run (one burst elsewhere is not its habit); 0 with
    fewer than :data:`USUAL_WINDOWS` such windows.

    Why: a hole's drops begin with its stall, where a switch that leaks of itself (the
    busy aggregation switches of a congested sweep: seed 63 run 9, a healthy pinned sweep
    whose ``p1a0`` was 26 packets short while one probe stalled beside a discarding
    queue, and 12 to 58 short in 7 other windows of 2.4 s) drops as much without one.
    After the run every window counts: over a long run a busy switch's count reads a few
    tens now and then (in flight between its ports' replies), and a sample of
    :data:`USUAL_MOST` missed them (2026-12-08: a healthy 15-minute run on
    `ft-2pod-agg2` whose ToR read 16 packets beside a probe's 2 s stall, 18 to 35 in 6 of
    243 other windows of 2 s and 1 at the sample's second most, was called a hole at
    0.75). Live, :data:`USUAL_MOST` at most, spread over the run so far: a live look
    reads every such stall every second."""
    span = obs.span
    length = end - start
    if span is None or length <= 0:
        return 0
    windows = []
    t = span[0]
    while t + length <= span[1]:
        apart = t + length <= start - length or t >= end + length
        if apart and not any(a < t + length and t < b for a, b in stalled):
            windows.append(t)
        t += length
    if len(windows) < USUAL_WINDOWS:
        return 0
    if len(windows) > USUAL_MOST and obs.now is not None:
        # live, every such stall is read every second: a sample spread over the run so far
        windows = [
            windows[round(i * (len(windows) - 1) / (USUAL_MOST - 1))] for i in range(USUAL_MOST)
        ]
    return sorted(_silent(obs, switch, w, w + length) for w in windows)[-2]


def _fabric_wide(
    obs: Observations,
    switch: str,
    held: Sequence[tuple[Probe, tuple[float, float]]],
    left: Sequence[set[tuple[str, str]]],
) -> str | None:
    """Why the stalls that name ``switch`` are the fabric's, not its hole; None when they
    are its own. A hole stalls the probes through it and leaves the others alone: when
    fewer than :data:`SHARE_MIN` of the probes stalled while its victims did went through
    it, something stalled the whole fabric (congestion's timeouts, the emulator pausing),
    unless the counters place the drops at it (it dropped silently, and the others
    together did not drop as much: the counters of a fabric that paused show every
    switch's packets in flight as drops)."""
    mine = [
        (p.id, stall) for (p, stall), ways in zip(held, left, strict=True)
        if switch in {s for s, _ in ways}
    ]  # fmt: skip
    a, b = min(s[0] for _, s in mine), max(s[1] for _, s in mine)
    alongside = {p.id for p, (x, y) in held if x <= b and a <= y}
    share = len({pid for pid, _ in mine}) / len(alongside)
    if share >= SHARE_MIN:
        return None
    silent = {x: _silent(obs, x, a, b) for x in obs.fabric.switches}
    rest = sum(silent.values()) - silent[switch]
    if silent[switch] >= SILENT_MIN and silent[switch] >= rest:
        return None
    unread = _unread(obs, a, b)
    return (
        f"but {len(alongside)} probe(s) stalled at the same time and only "
        f"{len({pid for pid, _ in mine})} of them went through {switch}, and the counters "
        f"do not place the drops at it ({switch} {silent[switch]}, the other switches "
        f"{rest} packets unaccounted): a stall of the whole fabric, not one switch's hole"
        + (
            f"; the port counters went unread for {unread:.1f} s meanwhile (the emulator "
            "itself paused)"
            if unread >= UNREAD_S
            else ""
        )
    )


def _unread(obs: Observations, start: float, end: float) -> float:
    """The longest time between ``start`` and ``end`` in which no port counter of the
    fabric was read (the poller asks the switches every 0.5 s)."""
    times = sorted({r[0] for rows in obs.counters.values() for r in rows if start <= r[0] <= end})
    if not times:
        return 0.0
    edges = [start, *times, end]
    return max(y - x for x, y in itertools.pairwise(edges))


def _discards(
    obs: Observations, rec: ProbeRecord, pad: float = UNCOUNTED_PAD_S
) -> dict[Port, list[tuple[float, float]]]:
    return discards_of(rec.queues if rec.queues is not None else obs.queues, pad)


def _queues_read_until(obs: Observations, rec: ProbeRecord) -> dict[Port, float]:
    """Per switch port, the time of its last egress queue sample (what a live look knows
    of its discards so far)."""
    queues = rec.queues if rec.queues is not None else obs.queues
    return {port: rows[-1][0] for port, rows in queues.items() if rows}


def _destinations_needed(
    switch: str,
    held: Sequence[tuple[Probe, tuple[float, float]]],
    left: Sequence[set[tuple[str, str]]],
) -> int:
    """How many destinations a drop rule at ``switch`` needs to stall every stalled probe
    that passes it (greedy: the destination most of them go towards, then the next)."""
    need: dict[int, set[str]] = {}
    for (probe, _), ways in zip(held, left, strict=True):
        towards = {d for s, d in ways if s == switch}
        if towards:
            need.setdefault(probe.id, set()).update(towards)
    rules = 0
    while need:
        best = Counter(d for ds in need.values() for d in ds).most_common(1)[0][0]
        need = {p: ds for p, ds in need.items() if best not in ds}
        rules += 1
    return rules


def _silent(obs: Observations, switch: str, start: float, end: float) -> int:
    """Packets ``switch`` dropped between ``start`` and ``end`` that no full egress queue
    discarded: the least of two counts, each of which reads something else as drops where
    a window's ends are busy (:func:`detectors.window_silent`, :func:`egress.unforwarded`); a
    hole's drops are in both. 0 when a port or queue was not sampled. Live, with the
    queue samples so far (:func:`detectors.live_silent`): before 2026-12-06 a live look
    had none, and a hole whose probe stalled beside a congested queue waited for the
    run's end to be named.

    Why both: the ports' balance reads the packets in flight at the window's end as
    dropped (78 at a busy ToR over the 2 s before seed 66 run 46's fault began, where
    what the switch forwarded nowhere read 0), and what it forwarded nowhere (since
    2026-12-07, where the bundle says where its entries output) reads the last
    increments of the entries removed meanwhile as not forwarded: over a long run whose
    configurations come and go, a healthy aggregation switch of
    `ft-2pod-2x2-r4-tor2-50g` read 433 packets so over 800 s, where its ports' balance
    read none (2026-12-08)."""
    if reads_live(obs):
        return live_silent(obs, switch, start, end)
    balance = window_silent(obs, switch, start, end)
    if obs.forwarded:
        nowhere = unforwarded(obs, switch, start, end)
        if nowhere is not None:
            return max(0, min(nowhere, balance))
    return balance


def _ways(rec: ProbeRecord, probe: Probe, t: float) -> set[tuple[str, str]]:
    """(switch, destination) of each switch the probe's packets and its acknowledgements
    crossed at ``t``."""
    ways = {(h[0], probe.dst) for h in rec.path_at(probe.id, t)[1:-1]}
    return ways | {(h[0], probe.src) for h in rec.back_at(probe.id, t)[1:-1]}


def _clean(units: Sequence[_Unit], lossy: Sequence[_Unit], d: str, witnesses: set[int]) -> set[int]:
    """The probes that crossed ``d`` without losing for at least half of the time the
    lossy probes across it lost (their first loss to their last)."""
    times = [t for u in lossy if d in u.dirs for t, _ in u.losses]
    first, last = min(times), max(times)
    return {
        u.probe.id for u in units
        if d in u.dirs and not u.lost and u.probe.id not in witnesses
        and u.observed_within(first, last) >= ACTIVE_SHARE * (last - first)
    }  # fmt: skip


def _seconds(units: Sequence[_Unit]) -> float:
    return sum(b - a for u in units for a, b in u.observed)


def _reverse(direction: str) -> str:
    a, b = direction.split(">", 1)
    return f"{b}>{a}"


def _went_on(probe: Probe, a: float, b: float) -> bool:
    """Whether the probe went on while another stalled from ``a`` to ``b``: it had bytes
    acknowledged then, and was not stalled itself for :data:`HOLE_S` of that time. The
    victims of one hole heal at different instants (their timers back off apart): seed 57
    run 22, a blackhole for one GPU at an aggregation switch, stalled three probes for
    7.4-7.5 s, and two of them, moving again 0.3 s before the third, cleared the switch
    of its stall, which the switch's 24 unexplained drops placed there."""
    return _moved(probe, a, b) and _covered(stalls(probe), a, b) < HOLE_S


def _moved(probe: Probe, a: float, b: float) -> bool:
    """Whether the probe had bytes acknowledged between ``a`` and ``b``."""
    inside = [s[1] for s in probe.samples if a <= s[0] <= b]
    return len(inside) >= 2 and inside[-1] > inside[0]


def as_links(found: dict[str, tuple[float, list[str], float]], fault: str) -> list[Suspect]:
    """Directions found as suspects: both directions of one link as the link ``A-B``."""
    out = []
    done: set[str] = set()
    for d, (score, evidence, onset) in found.items():
        if d in done:
            continue
        a, b = d.split(">", 1)
        back = f"{b}>{a}"
        if back in found:
            done.add(back)
            other = found[back]
            out.append(
                Suspect(
                    "link",
                    f"{a}-{b}",
                    fault,
                    max(score, other[0]),
                    evidence + other[1],
                    min(onset, other[2]),
                )
            )
        else:
            out.append(Suspect("link", d, fault, score, evidence, onset))
    return out


def _probe_list(units: Any) -> str:
    ids = sorted({(u.probe if isinstance(u, _Unit) else u).id for u in units})
    shown = ", ".join(str(i) for i in ids[:6])
    return f"probe{'s' if len(ids) > 1 else ''} {shown}" + (" ..." if len(ids) > 6 else "")


def _rel(obs: Observations, t: float) -> str:
    return rel(obs, t)
