"""A bundle's probe mesh as the diagnosis reads it: the probes, their paths, their samples.

The probe mesh (orchestrator.testbed.probemesh) writes ``probes.json`` (the probes, and
per tracing their paths and their acknowledgements' paths) and the prober
(orchestrator.testbed.prober) ``probes.jsonl`` (every probe's sender's kernel counters
every 0.1 s). :func:`read_probes` reads a finished bundle's, :class:`ProbeFollower` a
running one's as it grows; the detectors that read them are
:mod:`orchestrator.diagnosis.probes`. Kept apart from them because the observations
(:mod:`orchestrator.diagnosis.evidence`) carry a record, and the detectors read the
observations.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results.store import PROBE_SAMPLES_FILE, PROBES_FILE

HOLE_S = 2.0  # nothing acknowledged this long with messages outstanding: a hole
DUPLICATE_S = 2.0  # a duplicate is reported about an RTT after the retransmission
Hop = tuple[str, int | None, int | None]  # node, in port, out port
Port = tuple[str, int]  # (switch, model port)


@dataclass(frozen=True)
class Train:
    """One train as its receiver saw it arrive (orchestrator.testbed.prober): its bytes,
    and kernel timestamps of its first bytes, of the read that passed half of them, and
    of its last."""

    bytes: int
    first: float
    first_bytes: int
    half: float
    half_bytes: int
    last: float

    def tail_bps(self, whole: int) -> float | None:
        """The rate of its second half, bit/s: from the read that passed half of its
        bytes to the last. None for a train cut short, or one whose second half came in
        one read (no spread to measure: the loop read late)."""
        if self.bytes < whole or self.last <= self.half:
            return None
        rest = self.bytes - self.half_bytes
        if rest < whole / 4:
            return None
        return rest * 8 / (self.last - self.half)


@dataclass
class Probe:
    """One probe with its sender's samples: (t, bytes acked, retransmitted, rtt us,
    unacked, duplicates the receiver reported), and its trains."""

    id: int
    src: str
    dst: str
    samples: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)
    trains: list[Train] = field(default_factory=list)
    #: a message every ``every`` of the mesh's intervals (its budget on slow links)
    every: int = 1

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
    train: int = 0  # bytes per train (0: the prober sent none)
    interval: float = 0.05  # seconds between a probe's messages
    skipped: int = 0  # trains not sent because their paths were busy

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
    plan_file, samples_file = bundle / PROBES_FILE, bundle / PROBE_SAMPLES_FILE
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
        int(p["id"]): Probe(
            int(p["id"]), str(p["src"]), str(p["dst"]), every=max(1, int(p.get("every", 1)))
        )
        for p in plan.get("probes", [])
    }
    tracings, back = [], []
    for tr in sorted(plan.get("tracings", []), key=lambda tr: float(tr["t"])):
        tracings.append((float(tr["t"]), _paths(tr.get("paths", {}))))
        back.append(_paths(tr.get("back", {})))
    if not probes or not tracings:
        return None
    return ProbeRecord(
        probes,
        tracings,
        back,
        train=int(plan.get("train", 0)),
        interval=float(plan.get("interval", 0.05)),
    )


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
        record.skipped += int(row.get("ts", 0))
        for pid, n, first, first_n, half, half_n, last in row.get("tr", ()):
            probe = record.probes.get(int(pid))
            if probe is not None:
                probe.trains.append(Train(n, first, first_n, half, half_n, last))


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
        plan_file = self.bundle / PROBES_FILE
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
                        probe.samples, probe.trains = old.samples, old.trains
            self._record, self._plan_stamp = fresh, stamp
        assert self._record is not None
        try:
            with (self.bundle / PROBE_SAMPLES_FILE).open("rb") as lines:
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
