"""What each switch forwarded to each egress, from its flow and group counters.

A switch's port counters say what each port received and sent, and its egress queues what
they discarded; the sum over its ports of received minus sent minus discarded is what it
dropped silently (:func:`orchestrator.diagnosis.detectors.switch_leaks`), but not where. A
lossy link's drops happen at its sending switch's egress, after the switch forwarded the
packet there and before the port counts it sent; so per egress port,

    forwarded to it - sent by it - discarded by its full queue = lost at that egress

where "forwarded to it" is what the switch's flow entries that output to the port counted,
plus the packets of each group bucket that outputs to it (the controller's telemetry
records, per entry and per bucket, the ports their actions output to: controllers.counters).
The flow, group and port counters of one switch come in one poll round, their replies a
few milliseconds apart, and the queues are sampled apart: a window whose ends are not
quiet reads what crossed the switch meanwhile as lost or as more than sent (a busy ToR:
-175 to +146 packets per 0.5 s poll, seed 68 run 34). A whole run's ends are quiet, and
the count is exact there.

What it does not count: entries with no output (a drop rule's packets are received and not
forwarded anywhere, so they stay in the switch's balance and out of every egress's), the
controller's own packets (output to the controller, or sent by it: a few per run, read as
negative), and an entry removed between two polls (its last increment is lost: read as
fewer forwarded, never as lost). Bundles written before 2026-12-07 have no outputs: no
egress is known there, and the readings that use this fall back to the probes.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from controllers.counters import SwitchSample
from orchestrator.testbed.telemetry import read_telemetry

if TYPE_CHECKING:
    from orchestrator.diagnosis.evidence import Observations

Port = tuple[str, int]
TELEMETRY_FILE = "telemetry.jsonl"


def forwarded_series(file: Path) -> dict[Port, list[tuple[float, int]]]:
    """Per (switch, model port): (t, packets forwarded to it so far), one row per poll
    round of the switch, oldest first, from the telemetry ``file`` (a bundle's
    :data:`TELEMETRY_FILE`); empty when it does not say where the entries output (older
    files) or there is none."""
    if not file.exists():
        return {}
    tel = read_telemetry(file)
    if not any(_says_where(s) for r in tel.rounds for s in r.switches.values()):
        return {}
    out: dict[Port, list[tuple[float, int]]] = defaultdict(list)
    totals: dict[Port, int] = defaultdict(int)
    last_flow: dict[str, dict[tuple[object, ...], int]] = defaultdict(dict)
    last_bucket: dict[str, dict[tuple[int, int], int]] = defaultdict(dict)
    for r in tel.rounds:
        for name, s in sorted(r.switches.items()):
            seen_flows: dict[tuple[object, ...], int] = {}
            for f in s.flows:
                key = f.key
                seen_flows[key] = f.packets
                if not f.ports:
                    continue  # no egress (a drop entry), or a group's (its buckets count)
                grown = _grown(last_flow[name].get(key), f.packets)
                for port in f.ports:
                    totals[(name, port)] += grown
            seen_buckets: dict[tuple[int, int], int] = {}
            for g in s.groups:
                for i, (packets, _) in enumerate(g.buckets):
                    seen_buckets[(g.group, i)] = packets
                    ports = g.bucket_ports[i] if i < len(g.bucket_ports) else ()
                    grown = _grown(last_bucket[name].get((g.group, i)), packets)
                    for port in ports:
                        totals[(name, port)] += grown
            last_flow[name], last_bucket[name] = seen_flows, seen_buckets
            for p in s.ports:
                out[(name, p.port)].append((s.t, totals[(name, p.port)]))
    return dict(out)


def _says_where(s: SwitchSample) -> bool:
    """Whether the sample records where its entries and buckets output (newer files)."""
    return any(f.ports or f.groups for f in s.flows) or any(g.bucket_ports for g in s.groups)


def _grown(before: int | None, now: int) -> int:
    """How much a cumulative entry counter grew since the last poll: all of it for a new
    entry or one replaced meanwhile (its counter went back)."""
    if before is None or now < before:
        return now
    return now - before


def forwarded_at(rows: list[tuple[float, int]], t: float) -> tuple[float, int] | None:
    """The row of the last poll at or before ``t`` (the first if none is)."""
    if not rows:
        return None
    i = bisect.bisect_right([r[0] for r in rows], t) - 1
    return rows[max(i, 0)]


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
        rows = obs.forwarded.get((switch, port))
        a, b = obs.counter_at((switch, port), start), obs.counter_at((switch, port), end)
        if not rows or a is None or b is None:
            return []
        fa, fb = forwarded_at(rows, a[0]), forwarded_at(rows, b[0])
        discarded = obs.queue_drops((switch, port), a[0], b[0])
        if fa is None or fb is None or discarded is None:
            return []
        out.append(EgressLoss(switch, port, peer, peer_port, fb[1] - fa[1], b[4] - a[4], discarded))
    return sorted(out, key=lambda e: (-e.lost, e.port))


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
