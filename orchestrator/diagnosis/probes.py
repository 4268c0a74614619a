"""What the probe mesh saw: losses and holes placed by the probes' paths (tomography).

The probe mesh (orchestrator.testbed.probemesh) keeps a few small TCP probes on paths that
cover every link direction, with their senders' kernel counters every 0.1 s. Two patterns
place a fault the collectives' connections may never cross:

- **Losses** (:func:`probe_losses`): a probe's retransmission is evidence of a loss on its
  path only when no egress queue on that path discarded packets around it (a full queue
  drops probes as it drops everything: :func:`~orchestrator.diagnosis.detectors.discarding`),
  when the probe was not stalled (a stall's retransmissions are the timer's retries, read
  as a hole below) and when no port of the fabric was down (the controller's events say
  that fault). Of the directions the lossy probes crossed, the one crossed by the most of
  them is taken (then the next, for what it leaves unexplained) when at least
  :data:`SUPPORT_MIN` probes lost :data:`LOSS_MIN` segments across it and the probes that
  crossed it without losing, while it lost, are fewer than half of those that did: a 3 %
  loss drops one of a probe's 20 messages a second every 1.7 s, so a probe crossing it
  for a few seconds hardly stays clean. Measured on astral-small (docs/diagnosis.md): a
  3 % loss on an aggregation link the ring did not cross, 8 probes across it lost 2-8
  segments each in 7 s beyond the queues' discards; every other probe at most 1 in the
  whole run.
- **Holes** (:func:`probe_holes`): a probe that had messages outstanding and nothing
  acknowledged for :data:`HOLE_S` sends into a hole (a blackhole's drop rule, a link that
  drops everything without going down). The switches on every stalled probe's path,
  without those that carried probes to the same destinations on through the same time,
  are the suspects; a destination-specific hole (probes through the switch to other GPUs
  went on) says so.

Both say what they cannot tell apart: suspects with the same evidence get the same score.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.diagnosis.model import Suspect

if TYPE_CHECKING:
    from orchestrator.diagnosis.evidence import Observations

PLAN_FILE = "probes.json"
SAMPLES_FILE = "probes.jsonl"
LOSS_MIN = 4  # segments the lossy probes across a direction retransmitted, together
SUPPORT_MIN = 2  # probes that lost across it
PER_PROBE = 2  # segments each, on average (a healthy run's probes: at most 1 in a run)
AGAINST_SHARE = 0.5  # clean probes across it, at most this share of the lossy ones
ACTIVE_SHARE = 0.5  # a clean probe counts against a direction if observed this much of its
HOLE_S = 2.0  # nothing acknowledged this long with messages outstanding: a hole
DOWN_PAD_S = 2.0  # after a port came up, what its failover and rerouting still disturb
ROUNDS = 3  # directions taken in turn at most
CONTRAST = 5.0  # x the loss rate of the probes not across it, at least
SILENT_MIN = 5  # packets a switch dropped silently while probes stalled (in flight: a few)
DUPLICATE_S = 2.0  # a duplicate is reported about an RTT after the retransmission
Hop = tuple[str, int | None, int | None]  # node, in port, out port
Port = tuple[str, int]  # (switch, model port)


@dataclass
class Probe:
    """One probe with its sender's samples: (t, bytes acked, retransmitted, rtt us,
    unacked, duplicates the receiver reported)."""

    id: int
    src: str
    dst: str
    samples: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)

    def losses(self) -> list[tuple[float, float, int]]:
        """(from, to, segments): the sample intervals in which it retransmitted, less
        the retransmissions its receiver reported as duplicates within
        :data:`DUPLICATE_S` after (a timer that fired early, not a loss: TCP_INFO's
        dsack_dups; oldest first)."""
        events = [
            [a[0], b[0], b[2] - a[2]]
            for a, b in itertools.pairwise(self.samples)
            if b[2] > a[2]
        ]  # fmt: skip
        for a, b in itertools.pairwise(self.samples):
            dups = b[5] - a[5]
            for event in events:
                if dups <= 0:
                    break
                if b[0] - DUPLICATE_S <= event[1] <= b[0] and event[2] > 0:
                    taken = min(dups, int(event[2]))
                    event[2] -= taken
                    dups -= taken
        return [(a, b, int(n)) for a, b, n in events if n > 0]


@dataclass
class ProbeRecord:
    """The bundle's probe mesh: its probes and their paths per tracing (oldest first)."""

    probes: dict[int, Probe]
    tracings: list[tuple[float, dict[int, list[Hop]]]]
    back: list[dict[int, list[Hop]]]  # per tracing, the acknowledgements' paths
    # live, the egress queues' samples so far ride with the probes (the other detectors'
    # live rules were measured without them, :mod:`orchestrator.run.alerts`); None: the
    # bundle's, in the observations
    queues: dict[Port, list[tuple[float, int, int, int]]] | None = None

    def path_at(self, probe: int, t: float) -> list[Hop]:
        """The probe's path as last traced at or before ``t`` (the first tracing's
        before it)."""
        return self.tracings[self._at(t)][1].get(probe, [])

    def back_at(self, probe: int, t: float) -> list[Hop]:
        """Its acknowledgements' path then (from its destination to its source)."""
        return self.back[self._at(t)].get(probe, []) if self.back else []

    def _at(self, t: float) -> int:
        times = [tr[0] for tr in self.tracings]
        return max(bisect.bisect_right(times, t) - 1, 0)

    def periods(self, end: float) -> list[tuple[float, float, dict[int, list[Hop]]]]:
        """Each tracing with the time it held: (from, to, paths)."""
        out = []
        for (t, paths), nxt in itertools.zip_longest(self.tracings, self.tracings[1:]):
            out.append((t, nxt[0] if nxt else max(end, t), paths))
        return out


def read_probes(bundle: Path) -> ProbeRecord | None:
    """The probe mesh of the bundle at ``bundle``; None without one (older bundles, a
    monitor level without probes, a cluster run)."""
    plan_file, samples_file = bundle / PLAN_FILE, bundle / SAMPLES_FILE
    if not samples_file.exists():
        return None
    record = _read_plan(plan_file)
    if record is None:
        return None
    with samples_file.open(encoding="utf-8") as lines:
        _add_samples(record, lines)
    return record


def _read_plan(plan_file: Path) -> ProbeRecord | None:
    """The probes and their tracings of ``probes.json``, no samples yet; None without
    the file, or without a probe or a tracing."""
    try:
        plan = json.loads(plan_file.read_text())
    except (OSError, ValueError):
        return None
    probes = {
        int(p["id"]): Probe(int(p["id"]), str(p["src"]), str(p["dst"]))
        for p in plan.get("probes", [])
    }
    tracings, back = [], []
    for tr in sorted(plan.get("tracings", []), key=lambda tr: float(tr["t"])):
        tracings.append((float(tr["t"]), _paths(tr.get("paths", {}))))
        back.append(_paths(tr.get("back", {})))
    if not probes or not tracings:
        return None
    return ProbeRecord(probes, tracings, back)


def _add_samples(record: ProbeRecord, lines: Iterable[str]) -> None:
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a last line cut short
        for pid, acked, retrans, rtt, unacked, *dups in row.get("v", ()):
            probe = record.probes.get(int(pid))
            if probe is not None:
                probe.samples.append(
                    (float(row["t"]), acked, retrans, rtt, unacked, dups[0] if dups else 0)
                )


class ProbeFollower:
    """The probe mesh of a run still going, read as it grows (the live diagnosis looks
    every second): ``probes.json`` again when it changed (the mesh writes it when it starts
    and after every tracing), ``probes.jsonl`` from where the last look stopped."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = Path(bundle)
        self._plan_stamp: float | None = None
        self._record: ProbeRecord | None = None
        self._offset = 0
        self._partial = b""

    def read(self) -> ProbeRecord | None:
        plan_file = self.bundle / PLAN_FILE
        try:
            stamp = plan_file.stat().st_mtime
        except OSError:
            return None
        if stamp != self._plan_stamp:
            fresh = _read_plan(plan_file)
            if fresh is None:
                return self._record
            if self._record is not None:  # the samples so far stay
                for pid, probe in fresh.probes.items():
                    old = self._record.probes.get(pid)
                    if old is not None:
                        probe.samples = old.samples
            self._record, self._plan_stamp = fresh, stamp
        assert self._record is not None
        try:
            with (self.bundle / SAMPLES_FILE).open("rb") as lines:
                lines.seek(self._offset)
                data = self._partial + lines.read()
                self._offset = lines.tell()
        except OSError:
            return self._record
        complete, _, self._partial = data.rpartition(b"\n")
        if complete:
            _add_samples(self._record, complete.decode(errors="replace").splitlines())
        return self._record


def _paths(records: dict[str, Any]) -> dict[int, list[Hop]]:
    """A tracing's complete paths (a path that stopped short places nothing)."""
    return {
        int(i): [(str(h[0]), h[1], h[2]) for h in rec["hops"]]
        for i, rec in records.items()
        if rec.get("outcome") == "traced"
    }


def directions(path: Sequence[Hop]) -> list[str]:
    return [f"{a[0]}>{b[0]}" for a, b in itertools.pairwise(path)]


def egress(path: Sequence[Hop]) -> list[tuple[str, int]]:
    """The switch egress ports a path leaves by."""
    return [(node, out) for node, _, out in path[1:] if out is not None]


def stalls(probe: Probe, least: float = HOLE_S) -> list[tuple[float, float]]:
    """Spans of at least ``least`` seconds with messages outstanding and nothing
    acknowledged: (from the last sample that moved, to the first that moved again or the
    last sample)."""
    out = []
    start = None
    for (t0, a0, *_), (t1, a1, _, _, u1, _) in itertools.pairwise(probe.samples):
        if a1 == a0 and u1 > 0:
            start = t0 if start is None else start
            continue
        if start is not None and t1 - start >= least:
            out.append((start, t1))
        start = None
    if start is not None and probe.samples and probe.samples[-1][0] - start >= least:
        out.append((start, probe.samples[-1][0]))
    return out


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


def _units(obs: Observations) -> list[_Unit]:
    rec = obs.probes
    if rec is None:
        return []
    quiet = _discards(obs, rec)
    downs = down_windows(obs)
    span = obs.span
    units = []
    end = max((s[-1][0] for s in _all_samples(obs)), default=0.0)
    for start, until, paths in rec.periods(end):
        for pid, path in paths.items():
            probe = rec.probes.get(pid)
            if probe is None or len(path) < 2:
                continue
            ports = egress(path)
            held = stalls(probe)
            unit = _Unit(probe, set(directions(path)), [], [])
            lost = {t1: n for _, t1, n in probe.losses()}
            for (t0, *_), (t1, *_) in itertools.pairwise(probe.samples):
                if t1 <= start or t1 > until:
                    continue
                if span is not None and not (span[0] <= t1 <= span[1] + 1.0):
                    continue  # the warm-up's slow starts lose what no counter saw
                if _inside(held, t0, t1) or _inside(downs, t0, t1):
                    continue
                if any(_inside(quiet.get(p, ()), t0, t1) for p in ports):
                    continue
                unit.observed.append((t0, t1))
                if t1 in lost:
                    unit.losses.append((t1, lost[t1]))
            units.append(unit)
    return units


def probe_losses(obs: Observations) -> list[Suspect]:
    """Lossy link directions placed by the probes (the module docstring)."""
    units = _units(obs)
    lossy = [u for u in units if u.lost]
    found: dict[str, tuple[float, list[str], float]] = {}
    for _ in range(ROUNDS):
        if not lossy:
            break
        support: Counter[str] = Counter()
        lost: Counter[str] = Counter()
        for u in lossy:
            for d in u.dirs:
                support[d] += 1
                lost[d] += u.lost
        # on a tie, the other direction of a link already found (one fault on a link
        # rather than two), then the more segments lost
        best = max(support, key=lambda d: (support[d], _reverse(d) in found, lost[d], d))
        if support[best] < SUPPORT_MIN or lost[best] < max(LOSS_MIN, PER_PROBE * support[best]):
            break
        crossing = [u for u in lossy if best in u.dirs]
        times = [t for u in crossing for t, _ in u.losses]
        first, last = min(times), max(times)
        against = [
            u for u in units
            if best in u.dirs and not u.lost
            and u.observed_within(first, last) >= ACTIVE_SHARE * (last - first)
        ]  # fmt: skip
        if len(against) > AGAINST_SHARE * len(crossing):
            break
        # the probes elsewhere lost too: a machine that drops everywhere, not a link
        inside = sum(u.lost for u in crossing) / max(_seconds(crossing), 1.0)
        rest = [u for u in units if best not in u.dirs]
        outside = sum(u.lost for u in rest) / max(_seconds(rest), 1.0)
        if inside < CONTRAST * outside:
            break
        score = min(0.9, 0.6 + 0.1 * len(crossing)) - 0.1 * len(against)
        evidence = [
            f"probes: {len(crossing)} probes across {best} lost "
            f"{sum(u.lost for u in crossing)} segments between {_rel(obs, first)} and "
            f"{_rel(obs, last)} while no queue on their paths discarded "
            f"({_probe_list(crossing)})",
            f"{len(against)} probe(s) crossed it without losing then"
            + (
                f"; {len(lossy) - len(crossing)} other lossy probe(s) elsewhere"
                if len(lossy) > len(crossing)
                else "; every lossy probe crossed it"
            ),
        ]
        found[best] = (score, evidence, first)
        lossy = [u for u in lossy if best not in u.dirs]
    return _as_links(found, "lossy")


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
                continue
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
        if len(dropped) == 1:
            suspects = dropped
    score = (0.9 if most >= 2 else 0.75) - (0.15 if len(suspects) > 1 else 0.0)
    out = []
    for switch in suspects:
        towards = sorted({d for ways in left for s, d in ways if s == switch})
        victims = [
            p for (p, _), ways in zip(held, left, strict=True) if switch in {s for s, _ in ways}
        ]
        evidence = [
            f"probes: {len(victims)} probe(s) whose packets or acknowledgements crossed "
            f"{switch} towards {', '.join(towards)} had nothing acknowledged for "
            f"{HOLE_S:g} s or more between {_rel(obs, first)} and {_rel(obs, last)} "
            f"({_probe_list(victims)}), no port down; no probe that went on then took "
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
        others = len({p.id for p, _ in held}) - len(victims)
        if others:
            evidence.append(f"{others} other stalled probe(s) not through it")
        out.append(Suspect("switch", switch, "blackhole", score, evidence, first))
    return out


def _discards(obs: Observations, rec: ProbeRecord) -> dict[Port, list[tuple[float, float]]]:
    from orchestrator.diagnosis.detectors import discards_of

    return discards_of(rec.queues if rec.queues is not None else obs.queues)


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
    """Packets ``switch`` received and did not send between ``start`` and ``end`` beyond
    what its full egress queues discarded (0 when a port or queue was not sampled)."""
    received_not_sent = 0
    queued = 0
    for (node, port), _ in obs.counters.items():
        if node != switch:
            continue
        a, b = obs.counter_at((node, port), start), obs.counter_at((node, port), end)
        drops = obs.queue_drops((node, port), start, end)
        if a is None or b is None or drops is None:
            return 0
        received_not_sent += (b[3] - a[3]) - (b[4] - a[4])
        queued += drops
    return max(0, received_not_sent - queued)


def _ways(rec: ProbeRecord, probe: Probe, t: float) -> set[tuple[str, str]]:
    """(switch, destination) of each switch the probe's packets and its acknowledgements
    crossed at ``t``."""
    ways = {(h[0], probe.dst) for h in rec.path_at(probe.id, t)[1:-1]}
    return ways | {(h[0], probe.src) for h in rec.back_at(probe.id, t)[1:-1]}


def _seconds(units: Sequence[_Unit]) -> float:
    return sum(b - a for u in units for a, b in u.observed)


def _reverse(direction: str) -> str:
    a, b = direction.split(">", 1)
    return f"{b}>{a}"


def _moved(probe: Probe, a: float, b: float) -> bool:
    """Whether the probe had bytes acknowledged between ``a`` and ``b``."""
    inside = [s[1] for s in probe.samples if a <= s[0] <= b]
    return len(inside) >= 2 and inside[-1] > inside[0]


def _as_links(found: dict[str, tuple[float, list[str], float]], fault: str) -> list[Suspect]:
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
    from orchestrator.diagnosis.detectors import rel

    return rel(obs, t)
