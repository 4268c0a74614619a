"""A bundle's layers read once, lined up on the fabric model, for the detectors.

Everything here is what a monitor records: the operations and steps of every rank, every
connection's samples, kernel view and path, every switch port's counters, the
controller's events; and what the run did to the fabric itself, its own controller
restarts (policy switches: :mod:`.restarts`). The bundle's ``faults`` table (what was
injected) is never read: the diagnosis has to find the fault, not be told.

Link directions are named ``A>B``. A direction's traffic is counted where a switch can
count it: at A's transmit counter on its port of the link when A is a switch, else (A is
a GPU, whose host is not polled) at B's receive counter. A direction between two switches
is counted at both ends, and the two counts differ by what was lost on the wire.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.diagnosis import restarts
from orchestrator.diagnosis.forwarding import TELEMETRY_FILE, forwarded_series
from orchestrator.diagnosis.nvlink import NvlinkView, read_nvlink
from orchestrator.diagnosis.proberecord import ProbeRecord, read_probes
from orchestrator.diagnosis.restarts import OwnRestart
from orchestrator.results import ResultsBundle
from orchestrator.results.store import (
    CONTROLLER_EVENTS_LOG,
    LOGS,
    Configuration,
    ControllerEvent,
    IterationRecord,
    PathHop,
    StoredConnection,
    read_workload,
)
from topologies.description import FabricDescription
from topologies.latency import applied_latency
from topologies.model import Fabric, Link, LinkKind

FABRIC_FILE = "fabric.json"
SAMPLE_S = 0.010  # the workers' throughput sample period
Port = tuple[str, int]  # (switch, model port)


@dataclass(frozen=True)
class Direction:
    """One direction of a fabric link, with where its traffic is counted."""

    link: Link
    src: str
    dst: str
    capacity_bps: float  # emulated
    tx_at: Port | None  # src's transmit counter (src a switch)
    rx_at: Port | None  # dst's receive counter (dst a switch)

    @property
    def name(self) -> str:
        return f"{self.src}>{self.dst}"

    @property
    def link_name(self) -> str:
        return f"{self.link.a}-{self.link.b}"


@dataclass(frozen=True)
class Operation:
    """One timed collective operation: when its first rank began and its last ended."""

    config_id: int
    label: str
    iteration: int
    start: float
    end: float
    entries: dict[int, float]  # rank -> when it began

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class ConnectionView:
    """A fabric connection's sender end: its path, samples and kernel view."""

    id: int
    config_id: int
    src_rank: int
    dst_rank: int
    src_gpu: str
    dst_gpu: str
    path: list[PathHop]
    samples: list[tuple[float, int]] = field(default_factory=list)  # (t, bytes acked)
    retrans: list[tuple[float, int]] = field(default_factory=list)  # (t, total retrans)
    rtt: list[tuple[float, int]] = field(default_factory=list)  # (t, smoothed RTT us)
    unacked: list[tuple[float, int]] = field(default_factory=list)  # (t, segments in flight)

    @property
    def full_path(self) -> bool:
        """Whether the path reaches the destination GPU (not only the first hop)."""
        return bool(self.path) and self.path[-1].node == self.dst_gpu

    def directions(self) -> list[str]:
        """The link directions its path crosses, ``A>B`` each."""
        return [f"{a.node}>{b.node}" for a, b in zip(self.path, self.path[1:], strict=False)]

    def lanes(self) -> list[str]:
        """:meth:`directions` told apart from their parallel twins: ``A>B#P``, P the port
        it leaves A by (``A>B`` where the path does not say)."""
        return [
            f"{a.node}>{b.node}" + (f"#{a.out_port}" if a.out_port is not None else "")
            for a, b in zip(self.path, self.path[1:], strict=False)
        ]

    def switches(self) -> list[str]:
        return (
            [h.node for h in self.path[1:-1]] if self.full_path else [h.node for h in self.path[1:]]
        )


@dataclass
class Observations:
    """The bundle's layers on the fabric model (see the module docstring)."""

    path: Path
    description: FabricDescription
    status: str
    operations: list[Operation]
    directions: dict[str, Direction]
    counters: dict[Port, list[tuple[float, int, int, int, int]]]  # t, rx_b, tx_b, rx_p, tx_p
    connections: list[ConnectionView]
    events: list[ControllerEvent]
    saturated: list[str]  # configurations the run flagged emulator-bound
    gpus_by_rank: dict[int, dict[int, str]]  # config -> rank -> GPU
    labels: dict[int, str]  # config -> "all-reduce (ring) 1M, ecmp"
    # (config, iteration, rank) -> how late its first step's first byte left, in seconds,
    # beyond the latency the emulation applies before it (see :func:`entry_lateness`)
    lateness: dict[tuple[int, int, int], float] = field(default_factory=dict)
    # the same keys -> when that first byte could be seen (epoch s): the sample that told
    # (an acknowledgement's, a round trip after it left); a replay's cut keeps the
    # lateness of an operation still running from then on, as the live look, which reads
    # a rank's entry from its heartbeat before the operation ends (orchestrator.run.alerts)
    entry_seen: dict[tuple[int, int, int], float] = field(default_factory=dict)
    # the controller restarts the run made itself (its policy switches), recorded or inferred
    own_restarts: list[OwnRestart] = field(default_factory=list)
    config_policies: dict[int, str] = field(default_factory=dict)  # config -> its policy
    # a workload replay's workload.json (orchestrator/run/replay.py): per policy the
    # replayed timeline beside the forecast's, and each slot's ops; None: no replay
    workload: dict[str, Any] | None = None
    # a run still going: when the observations were taken (epoch s; a stall not over yet
    # counts up to it); None for a finished bundle
    now: float | None = None
    # when every rank of the first configuration had finished its warm-up (epoch s; None:
    # not yet, or not known)
    warmed: float | None = None
    # each configuration's warm-up end, the same way (a replayed look at a later batch
    # reads its own: orchestrator/diagnosis/replay.py); empty live
    warmed_by_config: dict[int, float] = field(default_factory=dict)
    # each switch port's egress queue: (t, packets sent, packets dropped, bytes held),
    # cumulative, oldest first (orchestrator/testbed/queues.py); empty in older bundles
    queues: dict[Port, list[tuple[float, int, int, int]]] = field(default_factory=dict)
    # each GPU NIC port's egress queue, (GPU, model port) -> the same rows: the queue a
    # GPU's slowed NIC direction fills, which no switch holds; empty when the run did not
    # sample them (older bundles, a fabric over several machines)
    nic_queues: dict[Port, list[tuple[float, int, int, int]]] = field(default_factory=dict)
    # live, the switch ports' egress queue samples so far; :attr:`queues` stays empty live,
    # since a switch's balance of packets in and out needs its traffic to have stopped: at
    # a live cut the packets in flight through a switch (21 at one aggregation switch of a
    # healthy all-to-all, seed 30) read as dropped with room in its queues. The readings
    # that use these say how they allow for it (detectors.switch_leaks)
    live_queues: dict[Port, list[tuple[float, int, int, int]]] = field(default_factory=dict)
    # each switch port's packets the switch process never read, its socket's receive
    # buffer full: (t, cumulative drops), oldest first (orchestrator/testbed/queues.py);
    # the emulator's loss, not the fabric's. Live, the samples so far; empty in bundles
    # before 2026-12-05 and where ``ss`` did not answer
    ingress: dict[Port, list[tuple[float, int]]] = field(default_factory=dict)
    # the probe mesh's probes, paths and samples (orchestrator.diagnosis.probes); None
    # without one
    probes: ProbeRecord | None = None
    # config -> seconds per operation the calibrated model forecast before the run
    # (orchestrator/forecast); empty where there was none or it was not calibrated
    forecast_seconds: dict[int, float] = field(default_factory=dict)
    # the tables the bundle's schema version has and its database lacks (a damaged
    # bundle: ResultsBundle.missing_tables); what they hold reads as nothing
    missing_tables: tuple[str, ...] = ()
    # each switch port: (t, packets the switch's entries and group buckets forwarded to it
    # so far), at the port counters' poll instants (forwarding.py); empty in bundles before
    # 2026-12-07, and live
    forwarded: dict[Port, list[tuple[float, int]]] = field(default_factory=dict)
    # the connections between GPUs of one server, over its NVLink switch (nvlink.py)
    nvlink: list[NvlinkView] = field(default_factory=list)
    # where :attr:`events` came from when the controller_events table is missing: the
    # bundle's copy of the controller's events file ("" when it has none either)
    events_logged: str = ""

    @property
    def events_known(self) -> bool:
        """Whether :attr:`events` are the controller's (from the database or its log), so
        that no port-down among them means no port went down."""
        return "controller_events" not in self.missing_tables or bool(self.events_logged)

    @property
    def fabric(self) -> Fabric:
        return self.description.fabric

    @property
    def span(self) -> tuple[float, float] | None:
        """From the first timed operation's start to the last one's end. Live (``now``
        set), to now, from the first operation's start or, before one has ended, from the
        end of the warm-up (:attr:`warmed`), or before that from the first byte a
        connection moved: an operation held up by a fault has not ended, and the
        diagnosis must not wait for it to; and what the warm-up did (slow start's losses)
        is no fault, as offline."""
        starts = [o.start for o in self.operations]
        if self.now is not None:
            if not starts and self.warmed is not None:
                starts = [self.warmed]
            starts = starts or [c.samples[0][0] for c in self.connections if c.samples]
            return (min(starts), self.now) if starts else None
        if not self.operations:
            return None
        return min(starts), max(o.end for o in self.operations)

    def queue_drops(self, port: Port, start: float, end: float) -> int | None:
        """Packets ``port``'s egress queue dropped between its last sample at or before
        ``start`` and its last at or before ``end`` (a counter that went back, its qdisc
        replaced, counts from where it restarted); None when the queue was not sampled."""
        rows = self.queues.get(port)
        return counted_between(rows, 2, start, end) if rows else None

    def ingress_drops(self, port: Port, start: float, end: float) -> int:
        """Packets ``port``'s switch-process socket dropped between its last sample at or
        before ``start`` and its last at or before ``end`` (0 when not sampled; a counter
        that went back, the port's socket opened again, counts from where it restarted)."""
        return counted_between(self.ingress.get(port, []), 1, start, end)

    def counter_at(self, port: Port, t: float) -> tuple[float, int, int, int, int] | None:
        """The last sample of ``port`` at or before ``t`` (the first one if none is)."""
        rows = self.counters.get(port)
        if not rows:
            return None
        i = bisect.bisect_right([r[0] for r in rows], t) - 1
        return rows[max(i, 0)]


def counted_between(rows: Sequence[tuple[Any, ...]], column: int, start: float, end: float) -> int:
    """What the cumulative counter in ``column`` of ``rows`` ((t, ...), oldest first) grew
    by from its last sample at or before ``start`` to its last at or before ``end``; a
    counter that went back (its qdisc replaced, its socket opened again) counts from
    where it restarted. 0 without rows."""
    if not rows:
        return 0
    times = [r[0] for r in rows]
    a = max(bisect.bisect_right(times, start) - 1, 0)
    b = max(bisect.bisect_right(times, end) - 1, 0)
    return sum(max(0, rows[i + 1][column] - rows[i][column]) for i in range(a, b))


def direction_map(description: FabricDescription) -> dict[str, Direction]:
    """Every direction of every fabric link (NVLink excluded: not the network's)."""
    fabric = description.fabric
    out = {}
    for link in fabric.links:
        if link.kind is LinkKind.NVLINK:
            continue
        rate = description.emulated_rate(link)
        for src, dst in ((link.a, link.b), (link.b, link.a)):
            tx = (src, link.port_of(src)) if src in fabric.switches else None
            rx = (dst, link.port_of(dst)) if dst in fabric.switches else None
            d = Direction(link, src, dst, rate, tx, rx)
            out[d.name] = d
    return out


def observe(path: Path) -> Observations:
    """Read the bundle at ``path`` (ResultsError when it is not one)."""
    with ResultsBundle.open(path) as bundle:
        description = FabricDescription.read(path / FABRIC_FILE)
        fabric = description.fabric
        run = bundle.run
        configs = bundle.configurations()
        gpus = [g.name for g in fabric.gpus_by_rank()]
        labels, gpus_by_rank = {}, {}
        operations: list[Operation] = []
        warmed = None
        warmed_by_config: dict[int, float] = {}
        windows: list[tuple[float, float, str]] = []
        for c in configs:
            labels[c.id] = f"{c.collective} ({c.algorithm}) {_size(c.size)}, {c.policy}"
            gpus_by_rank[c.id] = dict(enumerate(gpus[: c.ranks]))
            records = bundle.iterations(c.id)
            operations += _operations(records, c.id, labels[c.id])
            ended = _warmed([r for r in records if r.warmup])
            if ended is not None:
                warmed_by_config[c.id] = ended
            if c is configs[0]:
                warmed = ended
            window = _window(records)
            if window is not None:
                windows.append((*window, c.policy))
        counters: dict[Port, list[tuple[float, int, int, int, int]]] = defaultdict(list)
        for pc in bundle.port_counters():
            counters[(pc.switch, pc.port)].append(
                (pc.t, pc.rx_bytes, pc.tx_bytes, pc.rx_packets, pc.tx_packets)
            )
        for rows in counters.values():
            rows.sort()
        queues: dict[Port, list[tuple[float, int, int, int]]] = defaultdict(list)
        nic_queues: dict[Port, list[tuple[float, int, int, int]]] = defaultdict(list)
        for q in bundle.queue_counters():
            held = queues if q.switch in fabric.switches else nic_queues
            held[(q.switch, q.port)].append((q.t, q.packets, q.drops, q.backlog))
        for held_rows in itertools.chain(queues.values(), nic_queues.values()):
            held_rows.sort()
        ingress: dict[Port, list[tuple[float, int]]] = defaultdict(list)
        for d in bundle.ingress_drops():
            ingress[(d.switch, d.port)].append((d.t, d.drops))
        for drop_rows in ingress.values():
            drop_rows.sort()
        connections = _connections(bundle, fabric, gpus_by_rank)
        missing = bundle.missing_tables()
        events = bundle.controller_events() if bundle.has_table("controller_events") else []
        logged = ""
        if "controller_events" in missing:  # damaged: the same events, from the log's copy
            from_log = bundle.logged_controller_events()
            if from_log is not None:
                events, logged = from_log, f"{LOGS}/{CONTROLLER_EVENTS_LOG}"
        loads = bundle.emulator_loads() if bundle.has_table("emulator_load") else {}
        saturated = [labels[cid] for cid, load in loads.items() if load.saturated and cid in labels]
        lateness, entry_seen = entry_lateness(bundle, fabric, configs, gpus)
        record = bundle.controller_restarts()
        own = restarts.recorded(record) if record is not None else restarts.inferred(windows)
        forecasts = {cid: f.time_us / 1e6 for cid, f in bundle.forecasts().items() if f.calibrated}
        return Observations(
            forecast_seconds=forecasts,
            warmed=warmed,
            warmed_by_config=warmed_by_config,
            config_policies={c.id: c.policy for c in configs},
            workload=read_workload(path),
            lateness=lateness,
            entry_seen=entry_seen,
            own_restarts=own,
            path=path,
            description=description,
            status=run.status,
            operations=sorted(operations, key=lambda o: o.start),
            directions=direction_map(description),
            counters=dict(counters),
            queues=dict(queues),
            nic_queues=dict(nic_queues),
            ingress=dict(ingress),
            probes=read_probes(path),
            connections=connections,
            events=sorted(events, key=lambda e: e.t),
            saturated=saturated,
            gpus_by_rank=gpus_by_rank,
            labels=labels,
            missing_tables=tuple(missing),
            events_logged=logged,
            nvlink=read_nvlink(bundle, description, gpus_by_rank),
            forwarded=forwarded_series(path / TELEMETRY_FILE),
        )


def _operations(records: list[IterationRecord], config_id: int, label: str) -> list[Operation]:
    by_iteration: dict[int, dict[int, tuple[float, float]]] = defaultdict(dict)
    for r in records:
        if not r.warmup and r.start is not None:
            by_iteration[r.iteration][r.rank] = (r.start, r.time_us / 1e6)
    out = []
    for iteration, ranks in sorted(by_iteration.items()):
        start = min(s for s, _ in ranks.values())
        end = max(s + d for s, d in ranks.values())
        entries = {rank: s for rank, (s, _) in ranks.items()}
        out.append(Operation(config_id, label, iteration, start, end, entries))
    return out


def _warmed(records: list[IterationRecord]) -> float | None:
    """When the last rank finished the last warm-up iteration of ``records`` (the warm-up
    ones of a configuration); None without any timed record."""
    ends = [r.start + r.time_us / 1e6 for r in records if r.start is not None]
    return max(ends) if ends else None


def _window(records: list[IterationRecord]) -> tuple[float, float] | None:
    """When a configuration's traffic ran: its first operation's start to its last one's
    end, the warm-up included (None: no start recorded)."""
    spans = [(r.start, r.start + r.time_us / 1e6) for r in records if r.start is not None]
    if not spans:
        return None
    return min(a for a, _ in spans), max(b for _, b in spans)


def _connections(
    bundle: ResultsBundle, fabric: Fabric, gpus_by_rank: dict[int, dict[int, str]]
) -> list[ConnectionView]:
    paths = bundle.paths() if bundle.has_table("connection_paths") else {}
    senders: dict[int, ConnectionView] = {}
    for c in bundle.connections():
        if not _is_fabric_sender(c):
            continue
        assert c.src_rank is not None and c.dst_rank is not None
        ranks = gpus_by_rank.get(c.config_id, {})
        if c.src_rank not in ranks or c.dst_rank not in ranks:
            continue
        senders[c.id] = ConnectionView(
            c.id, c.config_id, c.src_rank, c.dst_rank, ranks[c.src_rank], ranks[c.dst_rank],
            paths.get(c.id, []),
        )  # fmt: skip
    if not senders:
        return []
    for cid, t, nbytes in bundle.sql("SELECT connection_id, t, bytes FROM connection_samples"):
        if cid in senders:
            senders[cid].samples.append((t, nbytes))
    kernel: dict[int, list[KernelSample]] = defaultdict(list)
    if bundle.has_table("tcp_info"):
        for cid, t, rtt, retrans, unacked, cwnd, ssthresh, lost in bundle.sql(
            "SELECT connection_id, t, rtt_us, retrans, unacked, cwnd, ssthresh, lost FROM tcp_info"
        ):
            if cid in senders:
                kernel[cid].append((t, retrans, cwnd, ssthresh, lost))
                senders[cid].rtt.append((t, rtt))
                senders[cid].unacked.append((t, unacked))
    for cid, view in senders.items():
        view.samples.sort()
        view.retrans = loss_retransmissions(sorted(kernel.get(cid, [])))
        view.rtt.sort()
        view.unacked.sort()
    return list(senders.values())


# (t, total retransmitted segments, cwnd, ssthresh, segments marked lost): struct tcp_info
KernelSample = tuple[float, int, int, int, int]
INITIAL_SSTHRESH = 0x7FFFFFFF  # TCP_INFINITE_SSTHRESH: the sender has not cut its window yet
WINDOW_CUT = 0.9  # cwnd below this share of the sample before: the window was cut


def loss_retransmissions(samples: Sequence[KernelSample]) -> list[tuple[float, int]]:
    """(t, retransmitted segments) of a connection, oldest first, counting only those its
    sender treated as losses: a retransmission the sender itself later found needless is
    no evidence of a lost packet.

    Linux retransmits before it knows a segment is lost: a tail loss probe resends the
    last segment when an acknowledgement is late (two smoothed RTTs), and a timeout
    resends the window. When the original arrives after all (a queue's delay, not a
    loss: D-SACK or the timestamps say so) the sender undoes what it did, so its
    slow-start threshold stays or returns where it was; a loss it recovered from always
    leaves the threshold cut (recovery sets it to 0.7 x cwnd under CUBIC, a timeout too)
    and marks segments lost while it lasts. So the segments retransmitted between two
    samples count when the threshold is finite at the second and the first or second
    shows segments marked lost, or the threshold fell, or the window was cut
    (:data:`WINDOW_CUT`); the rest did not cost a packet. Measured (diagnosis suite,
    seed 29): a healthy ring across a 3:1 core retransmitted 168 segments, 161 of them
    with the threshold where it stood and nothing marked lost (its queue delayed the
    acknowledgements past the probe's timer); the connections out of a GPU whose link
    lost 3 % of its packets counted nearly all theirs (13-65 of each connection's, 0-3 not).
    """
    if not samples:
        return []
    count = samples[0][1]
    out = [(samples[0][0], count)]
    for a, b in itertools.pairwise(samples):
        more = b[1] - a[1]
        marked = a[4] > 0 or b[4] > 0
        cut = b[3] < a[3] or b[2] < WINDOW_CUT * a[2]
        if more > 0 and b[3] < INITIAL_SSTHRESH and (marked or cut):
            count += more
        out.append((b[0], count))
    return out


def _is_fabric_sender(c: StoredConnection) -> bool:
    return c.link == "fabric" and c.src_rank is not None and c.rank == c.src_rank


def _size(n: int) -> str:
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def sent_by(unacked: list[tuple[float, int]]) -> list[float]:
    """The sample times of a sender's (t, segments in flight) at which more was in flight
    than at the sample before: new bytes had left by then (not any in flight: the previous
    operation's tail may still be when the next begins). Sorts ``unacked`` in place."""
    unacked.sort()
    return [b[0] for a, b in itertools.pairwise(unacked) if b[1] > a[1]]


def rtt_at(rows: list[tuple[float, float]], t: float) -> float:
    """The round trip a sender's kernel last reported at or before ``t`` (0 if none)."""
    i = bisect.bisect_right(rows, (t, math.inf))
    return rows[i - 1][1] if i else 0.0


def entry_lateness(
    bundle: ResultsBundle, fabric: Fabric, configs: list[Configuration], gpus: list[str]
) -> tuple[dict[tuple[int, int, int], float], dict[tuple[int, int, int], float]]:
    """Per timed operation and rank: when the rank's first step sent its first byte,
    after the step began, minus the latency the emulation waits before those sends (the
    operation's, and the one-way latency to the step's farthest peer: topologies.latency).
    What is left is how late the rank entered the operation: a few ms of scheduling and
    the 10 ms sample period for a rank on time, the delay itself for a straggler (which
    enters late, before its first step's sends). With it, when each entry could be seen:
    the instant of the sample that told it (:attr:`Observations.entry_seen`)."""
    try:
        applied = applied_latency(fabric, gpus)
    except ValueError:
        return {}, {}
    acked: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for config_id, src, dst, t in bundle.sql(
        "SELECT c.config_id, c.src_rank, c.dst_rank, s.t FROM connection_samples AS s"
        " JOIN connections AS c ON c.id = s.connection_id"
        " WHERE c.rank = c.src_rank AND s.bytes > 0"
    ):
        acked[(config_id, src, dst)].append(t)
    # bytes are acknowledged a round trip after they left, later still behind a congested
    # queue (a healthy rank's first bytes over a 4:1 core were acknowledged 64-112 ms
    # late): a kernel sample with more data in flight than the one before says new bytes
    # had left by then (more, not any: the previous operation's tail may still be in
    # flight when the next one begins)
    flight: dict[tuple[int, int, int], list[tuple[float, int]]] = defaultdict(list)
    rtts: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
    for config_id, src, dst, t, unacked, rtt_us in bundle.sql(
        "SELECT c.config_id, c.src_rank, c.dst_rank, i.t, i.unacked, i.rtt_us FROM tcp_info"
        " AS i JOIN connections AS c ON c.id = i.connection_id WHERE c.rank = c.src_rank"
    ):
        flight[(config_id, src, dst)].append((t, unacked))
        rtts[(config_id, src, dst)].append((t, rtt_us / 1e6))
    for trips in rtts.values():
        trips.sort()
    # an acknowledgement says its bytes left a round trip before it (the kernel's
    # smoothed one then): a straggler's step 0 ends as it sends, what it receives having
    # arrived while it waited, so its bytes are acknowledged after its step ended (seed 20:
    # 17 ms after, at a 25 ms round trip)
    # (left, seen): when the bytes left, and the sample that told it
    firsts: dict[tuple[int, int, int], list[tuple[float, float]]] = defaultdict(list)
    for key, times in acked.items():
        firsts[key] = [(t - rtt_at(rtts.get(key, []), t), t) for t in times]
    for key, rows in flight.items():
        firsts[key] += [(t, t) for t in sent_by(rows)]
    for pairs in firsts.values():
        pairs.sort()
    out, seen = {}, {}
    for c in configs:
        for step in bundle.steps(c.id):
            if step.step != 0 or step.warmup or not step.send_peers:
                continue
            if step.rank >= len(applied.one_way):
                continue
            wait = applied.operation + max(applied.one_way[step.rank][p] for p in step.send_peers)
            # bytes acknowledged before the wait is over are the previous operation's
            after = step.start + wait - SAMPLE_S / 2
            sent: list[tuple[float, float]] = []
            for peer in step.send_peers:
                left_seen = firsts.get((c.id, step.rank, peer), [])
                i = bisect.bisect_left(left_seen, (after, -math.inf))
                if i < len(left_seen) and left_seen[i][0] <= step.end + SAMPLE_S:
                    sent.append(left_seen[i])
            if sent:
                left, told = min(sent)
                out[(c.id, step.iteration, step.rank)] = left - step.start - wait
                seen[(c.id, step.iteration, step.rank)] = told
    return out, seen
