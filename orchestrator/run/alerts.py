"""Live alerts during ``astral run``: the observations so far, for the live diagnosis.

:func:`live_builder` returns the callable :class:`~orchestrator.diagnosis.live.LiveDiagnosis`
asks every second: it puts together, in the shapes ``astral diagnose`` reads from a bundle,
the running launch's connections (their samples, kernel view and planned paths) and
completed operations, the controller's port counters (its telemetry file) and its events
(its events file), with the controller restarts the run made itself (its policy switches,
as the testbed keeps them: orchestrator.diagnosis.restarts), which are not faults. Only
what a monitor sees and what the run did: the faults the run injects are not read.
"""

from __future__ import annotations

import bisect
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.diagnosis.evidence import (
    SAMPLE_S,
    ConnectionView,
    KernelSample,
    Observations,
    Operation,
    direction_map,
    loss_retransmissions,
    rtt_at,
    sent_by,
)
from orchestrator.diagnosis.proberecord import ProbeRecord
from orchestrator.diagnosis.restarts import recorded
from orchestrator.monitor.live import EVENTS_NAME
from orchestrator.monitor.record import connection_paths, controller_events
from orchestrator.results.store import IngressDrop, QueueCounter
from orchestrator.testbed.queues import ingress_rows, queue_rows
from orchestrator.testbed.telemetry import Telemetry, parse_line
from orchestrator.testbed.testbed import Testbed
from orchestrator.worker.launcher import Launcher, LiveView
from topologies.errors import AstralError
from topologies.latency import AppliedLatency, applied_latency

LABEL = "the collective running now"


def live_builder(
    testbed: Testbed,
    current: Callable[[], Launcher | None],
    since: float,
    probes: Callable[[], ProbeRecord | None] | None = None,
    queues: Callable[[], list[QueueCounter]] | None = None,
    ingress: Callable[[], list[IngressDrop]] | None = None,
    forecast: Callable[[], float | None] | None = None,
) -> Callable[[], Observations | None]:
    """Observations of the launch ``current()`` returns (None while there is none), and
    of the counters and events from ``since`` (epoch s) on; ``probes``: the probe mesh so
    far; ``queues``: the egress queues' samples so far (switch ports and GPUs' NIC ports),
    which read a slow port live as after the run (:attr:`Observations.live_queues`), and
    ride with the probe mesh's record (what tells its congestion losses from a fault's:
    orchestrator.diagnosis.probes); ``ingress``: the switch sockets' drops so far (the
    emulator's own loss, :attr:`Observations.ingress`); ``forecast``: the running
    configuration's calibrated forecast, s per operation, if any
    (:attr:`Observations.forecast_seconds`)."""
    description = testbed.description
    switches = set(description.fabric.switches)
    directions = direction_map(description)
    gpus = [g.name for g in description.fabric.gpus_by_rank()]
    follower = CounterFollower(testbed.telemetry_path, since)
    cache = PathCache(testbed)
    try:
        latency: AppliedLatency | None = applied_latency(description.fabric, gpus)
    except ValueError:
        latency = None

    def build() -> Observations | None:
        launcher = current()
        if launcher is None:
            return None
        view = launcher.live_view()
        operations = _operations(view.dones, view.warmup)
        counters = follower.read()
        ranks = dict(enumerate(gpus[: len(view.dones)]))
        # the queue samples grouped once a look: all of them for the probe mesh's reading,
        # those from ``since`` on for the slow-port readings
        switch_rows, nic_rows = _queues(queues() if queues is not None else [], switches)
        record = probes() if probes is not None else None
        if record is not None and queues is not None:
            record.queues = switch_rows
        predicted = forecast() if forecast is not None else None
        return Observations(
            path=testbed.run_dir,
            description=description,
            status="running",
            operations=operations,
            directions=directions,
            counters=dict(counters),
            connections=_connections(
                testbed, view, ranks, cache.traces(launcher, view.connections)
            ),
            events=controller_events(testbed.run_dir / EVENTS_NAME, since),
            saturated=[],
            gpus_by_rank={0: ranks},
            labels={0: LABEL},
            lateness=_lateness(view, latency, len(ranks)),
            own_restarts=recorded(list(testbed.restarts)),
            now=time.time(),
            warmed=_warmed(view.dones, view.warmup),
            probes=record,
            live_queues=_since(switch_rows, since),
            ingress=ingress_rows(ingress() if ingress is not None else []),
            nic_queues=_since(nic_rows, since),
            forecast_seconds={0: predicted} if predicted else {},
        )

    return build


QueueRows = dict[tuple[str, int], list[tuple[float, int, int, int]]]


def _queues(counters: list[QueueCounter], switches: set[str]) -> tuple[QueueRows, QueueRows]:
    """The egress queues' samples as :class:`Observations` keeps them: the switch ports'
    apart from the GPUs' NIC ports'."""
    rows = queue_rows(counters)
    return (
        {port: r for port, r in rows.items() if port[0] in switches},
        {port: r for port, r in rows.items() if port[0] not in switches},
    )


def _since(rows: QueueRows, since: float) -> QueueRows:
    """Each port's samples from ``since`` on (ports left without one dropped)."""
    kept = {port: [r for r in values if r[0] >= since] for port, values in rows.items()}
    return {port: values for port, values in kept.items() if values}


Dones = dict[int, dict[int, tuple[float, float, float | None]]]


def _warmed(dones: Dones, warmup: int) -> float | None:
    """When every rank had finished the warm-up iterations (None: not yet, or none)."""
    if not warmup or not dones:
        return None
    ends = []
    for done in dones.values():
        warm = [start + seconds for i, (start, seconds, _) in done.items() if i < warmup]
        if len(warm) < warmup:
            return None
        ends.append(max(warm))
    return max(ends)


def _operations(dones: Dones, warmup: int) -> list[Operation]:
    by_iteration: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for rank, done in dones.items():
        for iteration, (start, seconds, _) in done.items():
            if iteration >= warmup:
                by_iteration[iteration][rank] = (start, seconds)
    ranks = len(dones)
    return [
        Operation(
            0,
            LABEL,
            i,
            min(s for s, _ in e.values()),
            max(s + d for s, d in e.values()),
            {r: s for r, (s, _) in e.items()},
        )
        for i, e in sorted(by_iteration.items())
        if len(e) == ranks  # only operations every rank has finished
    ]


class PathCache:
    """The running launch's connections traced through the switches once, when they are
    first seen (orchestrator.testbed.tracing: about 0.1-0.3 s for a launch); planned paths
    where tracing fails. Paths a fault moves later are the bundle's, traced after each
    batch; the live view keeps where the connections went at first."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self.key: frozenset[Any] = frozenset()
        self.traced: dict[Any, Any] = {}
        self.failed = False

    def traces(self, launcher: Launcher, connections: list[Any]) -> dict[Any, Any]:
        key = frozenset(c.five_tuple for c in connections)
        if key and key != self.key and not self.failed:
            self.key = key
            try:
                self.traced = dict(self.testbed.trace_paths(connections, launcher.workers).paths)
            except (AstralError, OSError, ValueError):
                self.failed, self.traced = True, {}
        return self.traced


def _connections(
    testbed: Testbed, view: Any, ranks: dict[int, str], traced: dict[Any, Any]
) -> list[ConnectionView]:
    fabric_ones = [c for c in view.connections if c.link == "fabric"]
    chosen = testbed.pinning.chosen if testbed.pinning is not None else {}
    fabric = testbed.description.fabric
    paths = {id(c): hops for c, hops in connection_paths(fabric, fabric_ones, chosen, traced)}
    views = {}
    for n, c in enumerate(fabric_ones, 1):
        if c.src in ranks and c.dst in ranks:
            views[c.five_tuple] = ConnectionView(
                n, 0, c.src, c.dst, ranks[c.src], ranks[c.dst], paths.get(id(c), [])
            )
    for s in view.samples:
        v = views.get(s.connection.five_tuple)
        if v is not None and s.rank == s.connection.src:
            v.samples.append((s.t, s.bytes))
    kernel: dict[Any, list[KernelSample]] = defaultdict(list)
    for r in view.tcp_info:
        v = views.get(r.connection.five_tuple)
        if v is not None:
            k = r.view
            kernel[r.connection.five_tuple].append((r.t, k.retrans, k.cwnd, k.ssthresh, k.lost))
            v.rtt.append((r.t, k.rtt_us))
            v.unacked.append((r.t, k.unacked))
    for key, v in views.items():
        v.samples.sort()
        v.retrans = loss_retransmissions(sorted(kernel.get(key, [])))
        v.rtt.sort()
        v.unacked.sort()
    return list(views.values())


Rows = dict[tuple[str, int], list[tuple[float, int, int, int, int]]]


class CounterFollower:
    """The controller's counter file read as it grows: each call parses only the lines
    written since the last (a rotated file starts over), and returns every port's samples
    from ``since`` on, as :class:`~orchestrator.diagnosis.evidence.Observations` holds them."""

    def __init__(self, path: Path | None, since: float) -> None:
        self.path = path
        self.since = since
        self.offset = 0
        self.telemetry = Telemetry()
        self.rows: Rows = defaultdict(list)
        self._rounds = 0

    def read(self) -> Rows:
        if self.path is None or not self.path.exists():
            return dict(self.rows)
        size = self.path.stat().st_size
        if size < self.offset:  # rotated: the new file from its start
            self.offset = 0
        with open(self.path, "rb") as src:
            src.seek(self.offset)
            data = src.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8", "replace").splitlines():
            parse_line(self.telemetry, line)
        for stats in self.telemetry.rounds[self._rounds :]:
            for switch in stats.switches.values():
                if switch.t <= self.since:
                    continue
                for port in switch.ports:
                    self.rows[(switch.name, port.port)].append(
                        (switch.t, port.rx_bytes, port.tx_bytes, port.rx_packets, port.tx_packets)
                    )
        self._rounds = len(self.telemetry.rounds)
        return {k: list(v) for k, v in self.rows.items()}


def _lateness(
    view: LiveView, latency: AppliedLatency | None, ranks: int
) -> dict[tuple[int, int, int], float]:
    """Entry lateness (orchestrator.diagnosis.evidence.entry_lateness) from a running
    launch: the first byte a rank's first step sent, after the latency waited before it.
    The plan's step 0 peers are not at hand here: of the rank's outgoing connections, the
    one that sent first after its own latency (the step's peer) counts. A sender's
    samples count acknowledged bytes, which left a round trip before (the kernel's
    smoothed one then), as after the run: read at the samples' own instants, a healthy
    ECMP ring's rank behind a 2:1 uplink entered every operation 40-50 ms "late", its
    round trip (seed 37), and was alerted on live as a straggler."""
    if latency is None or ranks > len(latency.one_way):
        return {}
    # more data in flight than at the sample before: sent by then (as offline)
    flight: dict[tuple[int, int], list[tuple[float, int]]] = defaultdict(list)
    rtts: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for r in view.tcp_info:
        c = r.connection
        if r.rank == c.src:
            flight[(c.src, c.dst)].append((r.t, r.view.unacked))
            rtts[(c.src, c.dst)].append((r.t, r.view.rtt_us / 1e6))
    for trips in rtts.values():
        trips.sort()
    firsts: dict[tuple[int, int], list[float]] = defaultdict(list)
    for s in view.samples:
        c = s.connection
        if s.rank == c.src and s.bytes > 0:
            firsts[(c.src, c.dst)].append(s.t - rtt_at(rtts.get((c.src, c.dst), []), s.t))
    for key, rows in flight.items():
        firsts[key] += sent_by(rows)
    for times in firsts.values():
        times.sort()
    out = {}
    for rank, done in view.dones.items():
        peers = [dst for (src, dst) in firsts if src == rank]
        # the operations it finished, and those it has entered (their step 0 begun, by
        # its heartbeat): a straggler is read as it enters, not when the operation ends
        entries = {i: step0 for i, (_, _, step0) in done.items()}
        entries.update(view.entering.get(rank, {}))
        for iteration, step0 in entries.items():
            if iteration < view.warmup or step0 is None:
                continue
            late = []
            for peer in peers:
                wait = latency.operation + latency.one_way[rank][peer]
                times = firsts[(rank, peer)]
                i = bisect.bisect_left(times, step0 + wait - SAMPLE_S / 2)
                if i < len(times):
                    late.append(times[i] - step0 - wait)
            if late:
                out[(0, iteration, rank)] = min(late)
    return out
