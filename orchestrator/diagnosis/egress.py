"""A lossy egress named by the counters alone: what its switch forwarded there and did not send.

The switch that dropped packets no full queue explains (:func:`detectors.switch_leaks`)
does not say at which egress; its flow and group counters do
(:mod:`orchestrator.diagnosis.forwarding`): per egress, forwarded minus sent minus discarded
is what was lost there. A lossy link's sending end loses its share of what crosses it, at
that egress and nowhere else, whatever the congestion elsewhere (its full queues' discards
are counted apart). Under an all-to-all every queue discards and the probes' losses fall on
every egress alike, so the probes could not say which egress lost (seed 66 run 5, a 3 %
loss on a GPU's link: 89 packets lost at the ToR's egress to the GPU, 7 at each other,
reckoned by hand from its entries by destination: that bundle predates the outputs).

The entries' counters run a little ahead of the ports' (a healthy ECMP sweep's busy
aggregation switch, seed 68 run 36: 0.27-0.54 % of what it forwarded to each egress read
as lost there, 71 packets at one; the integration test: 1-3 packets of a thousand), so an
egress is read by the share of what was forwarded to it that it lost, against the most
its switch's other egresses (each forwarded :data:`BUSY_MIN` packets or more) read so.
The egress of the largest share is named when it is :data:`OVER_USUAL` times that most
or more and the packets beyond it are :data:`EGRESS_MIN` or more over the run's quiet
window, and :data:`EGRESS_SHARE` of its switch's silent drops or more where the switch leaked
(at any switch: over a run with quiet ends the egress's count is off by its switch's
usual share only, where the switch's balance is
held to a share of what its full queues discarded, :data:`detectors.SILENT_SHARE`, since
a window's ends may not be quiet: a small loss at a switch whose queues discard thousands
would not pass it); not where either end of its link went
down in the run, or a suspect shown calls its switch or its peer down or flapping (packets
forwarded towards a port that is down are lost at that egress too: the down link explains
them). The counters contradict a lossy suspect at another egress of the same switch (the
probes' guess under congestion): it keeps half its score, and says why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from orchestrator.diagnosis.detectors import SILENT_MIN_PACKETS, Leak, leak_window, rel
from orchestrator.diagnosis.evidence import Observations
from orchestrator.diagnosis.forwarding import forwarded_at
from orchestrator.diagnosis.model import Suspect

EGRESS_MIN = 20  # packets lost at one egress over the run beyond its switch's usual share
EGRESS_SHARE = 0.5  # ... and this share of its switch's silent drops, at least
OVER_USUAL = 3.0  # its share lost, at least this many times the most of the others'
BUSY_MIN = 200  # packets forwarded to an egress over the run for its share to be read
SCORE = 0.8
COUNTED = "counted egress"  # the sign of a suspect this module placed


@dataclass(frozen=True)
class EgressLoss:
    """One egress of a switch over a window: what the switch forwarded to it, what it
    sent, what its full queue discarded, and the rest (lost at the egress)."""

    switch: str
    port: int
    peer: str
    peer_port: int
    forwarded: int
    sent: int
    discarded: int

    @property
    def lost(self) -> int:
        return self.forwarded - self.sent - self.discarded

    @property
    def direction(self) -> str:
        return f"{self.switch}>{self.peer}"


def egress_losses(obs: Observations, switch: str, start: float, end: float) -> list[EgressLoss]:
    """Each fabric egress of ``switch`` between its polls at or before ``start`` and
    ``end`` (the module docstring), the most lost first; empty when the bundle does not say
    where the switch forwarded, or a port of it was not counted or its queue not sampled."""
    peers = {
        link.port_of(switch): (link.other(switch), link.port_of(link.other(switch)))
        for link in obs.fabric.links
        if switch in (link.a, link.b) and link.a != link.b
    }
    out = []
    for port, (peer, peer_port) in sorted(peers.items()):
        found = _egress(obs, switch, port, peer, peer_port, start, end)
        if found is None:
            return []
        out.append(found)
    return sorted(out, key=lambda e: (-e.lost, e.port))


def _egress(
    obs: Observations,
    switch: str,
    port: int,
    peer: str,
    peer_port: int,
    start: float,
    end: float,
) -> EgressLoss | None:
    """One egress of :func:`egress_losses`; None when it was not counted or sampled."""
    rows = obs.forwarded.get((switch, port))
    a, b = obs.counter_at((switch, port), start), obs.counter_at((switch, port), end)
    if not rows or a is None or b is None:
        return None
    fa, fb = forwarded_at(rows, a[0]), forwarded_at(rows, b[0])
    discarded = obs.queue_drops((switch, port), a[0], b[0])
    if fa is None or fb is None or discarded is None:
        return None
    return EgressLoss(switch, port, peer, peer_port, fb[1] - fa[1], b[4] - a[4], discarded)


def unforwarded(obs: Observations, switch: str, start: float, end: float) -> int | None:
    """Packets ``switch``'s ports received between its polls at or before ``start`` and
    ``end`` that none of its entries or buckets forwarded to a port: a drop entry's, a
    table miss's, the controller's; less those its process never read (the emulator's
    loss, :meth:`Observations.ingress_drops`). No queue is involved (where
    :func:`egress_losses` needs the queues' discards), but the port and entry replies of
    a poll come apart: at a busy switch a window's ends read what crossed meanwhile (the
    module docstring); None when the bundle does not say where the switch forwarded."""
    ports = sorted(p for s, p in obs.counters if s == switch)
    if not ports:
        return None
    total = 0
    for port in ports:
        rows = obs.forwarded.get((switch, port))
        a, b = obs.counter_at((switch, port), start), obs.counter_at((switch, port), end)
        if not rows or a is None or b is None:
            return None
        fa, fb = forwarded_at(rows, a[0]), forwarded_at(rows, b[0])
        if fa is None or fb is None:
            return None
        total += (b[3] - a[3]) - (fb[1] - fa[1]) - obs.ingress_drops((switch, port), a[0], b[0])
    return total


def counted_egress(
    obs: Observations, leaks: Mapping[str, Leak], down: AbstractSet[str] = frozenset()
) -> list[Suspect]:
    """Lossy egresses the counters place (the module docstring), one per switch at most;
    ``leaks``: the switches whose balance says they dropped packets no full queue explains
    (:func:`detectors.switch_leaks`); ``down``: the components a suspect shown calls down
    or flapping."""
    window = leak_window(obs)
    if window is None or not obs.forwarded:
        return []
    went_down = {(e.switch, e.port) for e in obs.events if e.kind == "port-down"}
    out = []
    for switch in sorted({node for node, _ in obs.counters}):
        egresses = [e for e in egress_losses(obs, switch, *window) if e.forwarded >= BUSY_MIN]
        if not egresses:
            continue
        best = max(egresses, key=lambda e: (e.lost / e.forwarded, -e.port))
        others = [e for e in egresses if e is not best]
        # the share every egress of this switch reads lost with nothing lost (the entries'
        # counters run a little ahead of the ports': 0.3-0.5 % at a healthy busy switch)
        usual = max((max(0.0, e.lost / e.forwarded) for e in others), default=0.0)
        beyond = best.lost - usual * best.forwarded
        silent = leaks[switch].silent if switch in leaks else 0
        if beyond < max(EGRESS_MIN, EGRESS_SHARE * silent):
            continue
        if best.lost < OVER_USUAL * usual * best.forwarded or {switch, best.peer} & down:
            continue
        if {(switch, best.port), (best.peer, best.peer_port)} & went_down:
            continue
        out.append(_suspect(obs, best, others, usual, window))
    return out


def contradicted(suspects: Sequence[Suspect], placed: Sequence[Suspect]) -> None:
    """Halve the score of each lossy link suspect at another egress of a switch whose loss
    the counters placed (those of ``placed`` with :data:`COUNTED`), with the counters' word
    as its last evidence."""
    for p in placed:
        if COUNTED not in p.signs:
            continue
        switch = p.target.split(">", 1)[0]
        for s in suspects:
            if s.component != "link" or s.fault != "lossy" or s is p:
                continue
            if s.target in (p.target, link_of(p.target)):
                continue
            if switch in _senders(s.target):
                s.score *= 0.5
                s.evidence.append(
                    f"but the counters place {switch}'s loss at {p.target}: "
                    + p.evidence[1].removeprefix("counters: ")
                )


def _senders(target: str) -> set[str]:
    """The switches a link suspect says lose at their egress: ``A`` of ``A>B``, both ends
    of ``A-B``."""
    if ">" in target:
        return {target.split(">", 1)[0]}
    return set(target.split("-", 1))


def link_of(direction: str) -> str:
    """``A-B`` of the direction ``A>B``."""
    a, _, b = direction.partition(">")
    return f"{a}-{b}"


def _suspect(
    obs: Observations,
    best: EgressLoss,
    others: Sequence[EgressLoss],
    usual: float,
    window: tuple[float, float],
) -> Suspect:
    onset = _onset(obs, best, window)
    evidence = [
        f"counters: {best.switch} forwarded {best.forwarded:,} packets to {best.peer} "
        f"(port {best.port}) and sent {best.sent:,}, its full queue discarding "
        f"{best.discarded:,}: {best.lost:,} lost at that egress"
        + (f" from about {rel(obs, onset)}" if onset is not None else ""),
        f"counters: {best.lost / best.forwarded:.2%} of what it forwarded there, where its "
        f"{len(others)} other egress(es) read {usual:.2%} at most: the loss is this one's, "
        "not the switch's",
    ]
    suspect = Suspect("link", best.direction, "lossy", SCORE, evidence, onset)
    suspect.signs.add(COUNTED)
    return suspect


def _onset(obs: Observations, best: EgressLoss, window: tuple[float, float]) -> float | None:
    """When the egress began to lose: the first poll after the lowest point of its count
    (what it lost since the window began) from which on the count stayed
    :data:`SILENT_MIN_PACKETS` or more above that point. From its lowest point, not from
    zero: an entry removed between two polls loses its last increment, so the count of
    a switch whose pinned connections come and go drifts below zero (seed 68 run 5: its
    other egresses at -48 over the run), and a loss that began mid-run would read late."""
    series = []
    for row in obs.counters.get((best.switch, best.port), []):
        if window[0] <= row[0] <= window[1]:
            e = _egress(obs, best.switch, best.port, best.peer, best.peer_port, window[0], row[0])
            series.append((row[0], e.lost if e is not None else 0))
    if not series:
        return None
    low = min(range(len(series)), key=lambda i: (series[i][1], -i))  # the last lowest
    onset = None
    for t, lost in series[low:]:
        if lost - series[low][1] < SILENT_MIN_PACKETS:
            onset = None
        elif onset is None:
            onset = t
    return onset
